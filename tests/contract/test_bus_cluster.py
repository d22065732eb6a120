"""The bus on a Redis Cluster (3 masters + 3 replicas, ``tests/rediscluster.py``): what
only a cluster has. The Bus contract itself runs on it in ``test_bus.py``.

Sharded pub/sub (a signal touches one shard), the partitioned inbox (partitions on
several masters, per-thread order, per-partition reclaim), redirects and failovers
(a manual ``CLUSTER FAILOVER``, a master killed with ``kill -9``). The failover tests
come last: they change which node is master of what.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from signoff.runtime.bus import Job, Subscription
from signoff.runtime.bus.cluster import ClusterClient
from signoff.runtime.bus.partitions import PartitionedInbox
from signoff.runtime.bus.pubsub import BusDisconnected
from signoff.runtime.bus.redis import CLUSTER_PARTITIONS, RedisBus
from signoff.runtime.errors import ConfigError
from signoff.runtime.keys import Keys
from tests.contract.conftest import CLAIM_IDLE_MS, open_redis_bus, redis_subscribers
from tests.rediscluster import LocalCluster, cli

pytestmark = pytest.mark.anyio

CLAIM_IDLE = CLAIM_IDLE_MS / 1000


def job(n: int, thread: str) -> Job:
    return Job(thread_id=thread, text=f"message {n}", user="u-1", tenant="demo")


def node_port(bus: RedisBus, key: str) -> int:
    assert isinstance(bus.client, ClusterClient)
    return int(bus.client.node_of(key).port)


def stream_of(keys: Keys, thread: str) -> str:
    return keys.inbox_partition(keys.partition_of(thread, CLUSTER_PARTITIONS), CLUSTER_PARTITIONS)


async def receive(sub: Subscription, timeout: float = 3.0) -> bytes:
    return await asyncio.wait_for(anext(aiter(sub)), timeout)


async def test_a_signal_is_one_spublish_on_the_channels_shard_only(
    cluster_bus: RedisBus, keys: Keys, redis_cluster: LocalCluster
) -> None:
    channel = keys.worker_channel("w-1")
    owner = node_port(cluster_bus, channel)
    masters = redis_cluster.masters()
    async with cluster_bus.subscribe(channel) as sub:
        assert await redis_subscribers(None, channel, cluster_bus) == 1  # type: ignore[arg-type]
        before = {p: redis_cluster.command_calls(p, "spublish") for p in masters}
        plain = {p: redis_cluster.command_calls(p, "publish") for p in masters}
        assert await cluster_bus.publish(channel, b"decision") == 1
        assert await receive(sub) == b"decision"
        after = {p: redis_cluster.command_calls(p, "spublish") for p in masters}
        assert {p: after[p] - before[p] for p in masters} == {p: int(p == owner) for p in masters}
        assert {p: redis_cluster.command_calls(p, "publish") for p in masters} == plain


async def test_channels_of_other_shards_each_get_their_own_subscription(
    cluster_bus: RedisBus, keys: Keys
) -> None:
    channels = [keys.thread_channel(f"t-{i}") for i in range(12)]
    owners = {node_port(cluster_bus, c) for c in channels}
    assert len(owners) == 3  # the twelve channels are spread over the three masters
    subs = [cluster_bus.subscribe(c) for c in channels]
    entered = [await s.__aenter__() for s in subs]
    try:
        for channel, sub in zip(channels, entered, strict=True):
            assert await cluster_bus.publish(channel, channel.encode()) == 1
            assert await receive(sub) == channel.encode()
    finally:
        for s in reversed(subs):
            await s.__aexit__(None, None, None)


async def test_inbox_partitions_sit_on_every_master(
    cluster_bus: RedisBus, keys: Keys, redis_cluster: LocalCluster
) -> None:
    assert isinstance(cluster_bus.inbox, PartitionedInbox)
    assert len(cluster_bus.inbox.partitions) == CLUSTER_PARTITIONS
    for n in range(40):
        await cluster_bus.enqueue(job(n, f"thread-{n}"))
    streams = [keys.inbox_partition(i, CLUSTER_PARTITIONS) for i in range(CLUSTER_PARTITIONS)]
    holders: set[int] = set()
    for stream in streams:
        port = node_port(cluster_bus, stream)
        if int(cli(port, "XLEN", stream).strip() or 0) > 0:
            holders.add(port)
    assert holders == set(redis_cluster.masters())


async def test_per_thread_order_holds_across_partitions(cluster_bus: RedisBus) -> None:
    threads = [f"thread-{i}" for i in range(16)]
    for n in range(10):
        for thread in threads:
            await cluster_bus.enqueue(job(n, thread))
    got: list[Job] = []
    deadline = time.monotonic() + 10
    while len(got) < 160 and time.monotonic() < deadline:
        for delivery in await cluster_bus.take("w-1", 1.0):
            got.append(delivery.job)
            await cluster_bus.ack(delivery.id)
    assert len(got) == 160
    for thread in threads:
        texts = [j.text for j in got if j.thread_id == thread]
        assert texts == [f"message {n}" for n in range(10)]
    partitions = {cluster_bus.keys.partition_of(t, CLUSTER_PARTITIONS) for t in threads}
    assert len(partitions) > 1


async def test_a_dead_consumers_entries_are_reclaimed_in_every_partition(
    cluster_bus: RedisBus,
) -> None:
    entries = {await cluster_bus.enqueue(job(n, f"thread-{n}")) for n in range(24)}
    taken: list[str] = []
    deadline = time.monotonic() + 5
    while len(taken) < 24 and time.monotonic() < deadline:
        taken += [d.id for d in await cluster_bus.take("w-dead", 0.5)]
    assert set(taken) == entries
    assert len({e.split("/")[0] for e in entries}) > 2  # several partitions
    await asyncio.sleep(CLAIM_IDLE + 0.1)
    again: list[str] = []
    deadline = time.monotonic() + 5
    while len(again) < 24 and time.monotonic() < deadline:
        for delivery in await cluster_bus.take("w-2", 0.5):
            again.append(delivery.id)
            await cluster_bus.ack(delivery.id)
    assert sorted(again) == sorted(entries)


async def test_a_prefix_with_a_hash_tag_is_refused_on_a_cluster(
    redis_cluster: LocalCluster,
) -> None:
    with pytest.raises(ConfigError):
        RedisBus.from_url(redis_cluster.url, Keys("{so}:"))


async def test_a_delivery_id_of_another_inbox_is_refused(cluster_bus: RedisBus) -> None:
    from signoff.runtime.errors import InvalidInput

    with pytest.raises(InvalidInput):
        await cluster_bus.ack("1796-0")


def node_id(port: int) -> str:
    return cli(port, "CLUSTER", "MYID").strip()


def move_slot(cluster: LocalCluster, slot: int, to: int) -> None:
    """Hand an empty slot to another master, as ``redis-cli --cluster reshard`` does:
    IMPORTING on the target and MIGRATING on the owner first, so that the target's
    ``SETSLOT ... NODE`` bumps its config epoch and its claim wins on every node. (A bare
    ``SETSLOT NODE`` everywhere changed no epoch: gossip could later hand the slot back
    to the old claim on some nodes, and a failover then left a master with the slot
    unassigned and the cluster failed for every later test.)"""
    target = node_id(to)
    owner = cluster.owner_of(slot)
    source = node_id(owner)
    cli(to, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", source)
    cli(owner, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", target)
    cli(to, "CLUSTER", "SETSLOT", str(slot), "NODE", target)
    cli(owner, "CLUSTER", "SETSLOT", str(slot), "NODE", target)
    for port in cluster.masters():
        if port not in (to, owner):
            cli(port, "CLUSTER", "SETSLOT", str(slot), "NODE", target)


async def test_a_killed_shard_pubsub_connection_fails_its_subscribers_only(
    cluster_bus: RedisBus, keys: Keys, tag: str
) -> None:
    one = keys.worker_channel("w-1")
    other = next(  # a channel on another master
        c
        for c in (keys.thread_channel(f"t-{i}") for i in range(1000))
        if node_port(cluster_bus, c) != node_port(cluster_bus, one)
    )
    async with cluster_bus.subscribe(one) as a, cluster_bus.subscribe(other) as b:
        port = node_port(cluster_bus, one)
        killed = 0
        for line in cli(port, "CLIENT", "LIST", "TYPE", "pubsub").splitlines():
            fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if fields.get("name") == tag:
                killed += int(cli(port, "CLIENT", "KILL", "ID", fields["id"]).strip() or 0)
        assert killed == 1
        with pytest.raises(BusDisconnected):
            await receive(a, 2.0)
        assert await cluster_bus.publish(other, b"still here") == 1  # the other shard's link
        assert await receive(b) == b"still here"
    async with cluster_bus.subscribe(one) as again:
        assert await cluster_bus.publish(one, b"back") == 1
        assert await receive(again) == b"back"


async def test_a_slot_moved_to_another_shard_ends_its_subscriptions_and_they_follow(
    cluster_bus: RedisBus, keys: Keys, redis_cluster: LocalCluster
) -> None:
    """Redis ends a sharded subscription (``sunsubscribe``) when its slot leaves the node;
    subscribers fail (and re-read Postgres in production), a new subscribe meets MOVED,
    reloads the slot table and lands on the new owner."""
    from redis.crc import key_slot

    channel = next(
        c
        for c in (keys.worker_channel(f"w-move-{i}") for i in range(1000))
        if cli(
            node_port(cluster_bus, c),
            "CLUSTER",
            "COUNTKEYSINSLOT",
            str(key_slot(c.encode())),
        ).strip()
        == "0"
    )
    slot = key_slot(channel.encode())
    owner = node_port(cluster_bus, channel)
    target = next(p for p in redis_cluster.masters() if p != owner)
    try:
        async with cluster_bus.subscribe(channel) as sub:
            move_slot(redis_cluster, slot, target)
            with pytest.raises(BusDisconnected) as ended:
                await receive(sub, 5.0)
            assert "ended the subscription" in str(ended.value)  # sunsubscribe, no drop
        for attempt in range(30):
            try:
                async with cluster_bus.subscribe(channel) as sub:
                    assert node_port(cluster_bus, channel) == target
                    assert await cluster_bus.publish(channel, b"moved") == 1
                    assert await receive(sub) == b"moved"
                    break
            except BusDisconnected:
                await asyncio.sleep(0.05 * attempt)
        else:
            pytest.fail("never subscribed on the slot's new owner")
    finally:
        move_slot(redis_cluster, slot, owner)
        redis_cluster.wait_ok()


# -- failovers (these change the cluster's roles: keep them last) ----------------------------


async def test_a_manual_failover_is_followed_without_losing_a_subscription_hint(
    cluster_bus: RedisBus, keys: Keys, redis_cluster: LocalCluster, tag: str
) -> None:
    """CLUSTER FAILOVER: the old master answers MOVED, the bus follows it; the pub/sub
    subscription either keeps working or fails (and a re-subscribe works)."""
    channel = keys.worker_channel("w-failover")
    await cluster_bus.set_wait("card-1", "w-1", 60_000)
    key = keys.wait("card-1")
    master = node_port(cluster_bus, key)
    replica = redis_cluster.replica_of(master)
    cli(replica, "CLUSTER", "FAILOVER")
    deadline = time.monotonic() + 15
    while redis_cluster.roles().get(replica) != "master" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert redis_cluster.roles()[replica] == "master"
    assert await cluster_bus.wait_holder("card-1") == "w-1"  # MOVED, followed
    assert node_port(cluster_bus, key) == replica  # the slot table was updated
    await cluster_bus.set_wait("card-2", "w-2", 60_000)
    async with open_redis_bus(tag + "-other", keys, redis_cluster.url) as other:
        assert await other.wait_holder("card-1") == "w-1"
    for attempt in range(20):
        try:
            async with cluster_bus.subscribe(channel) as sub:
                await cluster_bus.publish(channel, b"after")
                assert await receive(sub) == b"after"
                break
        except BusDisconnected:
            await asyncio.sleep(0.1 * attempt)
    else:
        pytest.fail("no live subscription after the failover")
    redis_cluster.wait_ok()


@pytest.mark.slow  # 9 s: waits for the cluster to fail a master over
async def test_a_killed_master_fails_its_subscriptions_and_the_bus_recovers(
    cluster_bus: RedisBus, keys: Keys, redis_cluster: LocalCluster
) -> None:
    master = node_port(cluster_bus, keys.wait("card-k"))
    channel = next(  # a channel on the master about to die
        c
        for c in (keys.worker_channel(f"w-{i}") for i in range(1000))
        if node_port(cluster_bus, c) == master
    )
    replica = redis_cluster.replica_of(master)
    await cluster_bus.set_wait("card-k", "w-1", 60_000)
    redis_cluster.wait_replicated(master)  # replication is asynchronous
    thread = next(  # a thread whose inbox partition is on the master about to die
        t
        for t in (f"thread-{i}" for i in range(1000))
        if node_port(cluster_bus, stream_of(keys, t)) == master
    )
    entry = await cluster_bus.enqueue(job(1, thread))  # XADD + WAIT 1
    try:
        async with cluster_bus.subscribe(channel) as sub:
            started = time.monotonic()
            redis_cluster.kill(master)
            with pytest.raises(BusDisconnected):
                await receive(sub, 5.0)
        # Calls ride out the election (retried with a topology reload).
        holder = await cluster_bus.wait_holder("card-k")
        recovered = time.monotonic() - started
        assert holder == "w-1"
        assert "role:master" in cli(replica, "INFO", "replication")  # promoted
        async with cluster_bus.subscribe(channel) as sub:
            assert await cluster_bus.publish(channel, b"back") == 1
            assert await receive(sub) == b"back"
        print(f"recovered from kill -9 of a master in {recovered:.2f}s")
        [delivery] = await cluster_bus.take("w-1", 2.0)
        assert delivery.id == entry  # the acknowledged entry survived its master
    finally:
        redis_cluster.restart(master)
        redis_cluster.wait_ok()
