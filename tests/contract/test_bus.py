"""The Bus contract, run on every backend (in-process and Redis), then Redis-only faults.

The contract part uses the ``bus`` fixture (parametrised over backends) and only the
``Bus`` protocol plus ``alive``. The Redis-only part (``TestRedisOnly``) covers what
only a server can do: dropped connections, the subscribe/publish race across
connections, an unreachable server, entries that are not jobs, a restarted consumer.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis import exceptions as rx

from signoff.runtime.bus import Delivery, Job
from signoff.runtime.bus.client import RETRY_DELAYS
from signoff.runtime.bus.pubsub import BusDisconnected
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.bus.tokens import CLEAR_BATCH
from signoff.runtime.errors import ConfigError, Unavailable
from signoff.runtime.keys import Keys
from signoff.testing import servers
from tests import services
from tests.contract.conftest import (
    CLAIM_IDLE_MS,
    AnyBus,
    drop_keys_of,
    open_redis_bus,
    redis_subscribers,
)

pytestmark = pytest.mark.anyio

CLAIM_IDLE = CLAIM_IDLE_MS / 1000


def job(n: int = 1, thread: str = "t-1") -> Job:
    return Job(thread_id=thread, text=f"message {n}", user="u-1", tenant="demo")


async def receive(it: AsyncIterator[bytes], timeout: float = 2.0) -> bytes:
    return await asyncio.wait_for(anext(it), timeout)


async def take_all(bus: AnyBus, consumer: str, n: int, timeout: float = 2.0) -> list[Delivery]:
    """Take until ``n`` deliveries arrived (backends may hand them out in smaller batches)."""
    got: list[Delivery] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += await bus.take(consumer, deadline - time.monotonic())
    return got


# -- pub/sub -------------------------------------------------------------------------------


async def test_publish_without_subscriber_reaches_nobody(bus: AnyBus, keys: Keys) -> None:
    assert await bus.publish(keys.thread_channel("nobody"), b"lost") == 0


async def test_two_local_subscribers_get_every_message_in_order(
    bus: AnyBus, keys: Keys, admin: aioredis.Redis
) -> None:
    channel = keys.worker_channel("w-1")
    async with bus.subscribe(channel) as a, bus.subscribe(channel) as b:
        if isinstance(bus, RedisBus):  # one Redis subscription
            assert await redis_subscribers(admin, channel, bus) == 1
        heard = [await bus.publish(channel, f"m{i}".encode()) for i in range(20)]
        assert all(count >= 1 for count in heard)
        ia, ib = aiter(a), aiter(b)
        expected = [f"m{i}".encode() for i in range(20)]
        assert [await receive(ia) for _ in range(20)] == expected
        assert [await receive(ib) for _ in range(20)] == expected


async def test_other_channels_are_not_delivered(bus: AnyBus, keys: Keys) -> None:
    mine, other = keys.thread_channel("mine"), keys.thread_channel("other")
    async with bus.subscribe(mine) as sub:
        assert await bus.publish(other, b"not for me") == 0
        await bus.publish(mine, b"for me")
        assert await receive(aiter(sub)) == b"for me"


async def test_leaving_one_subscriber_keeps_the_other(
    bus: AnyBus, keys: Keys, admin: aioredis.Redis
) -> None:
    channel = keys.thread_channel("t-1")
    async with bus.subscribe(channel) as stays:
        async with bus.subscribe(channel) as leaves:
            await bus.publish(channel, b"both")
            assert await receive(aiter(leaves)) == b"both"
        assert await bus.publish(channel, b"one") == 1
        it = aiter(stays)
        assert [await receive(it), await receive(it)] == [b"both", b"one"]
        if isinstance(bus, RedisBus):
            assert await redis_subscribers(admin, channel, bus) == 1
    # The last one out unsubscribes.
    deadline = time.monotonic() + 2
    while await bus.publish(channel, b"gone") and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert await bus.publish(channel, b"gone") == 0


async def test_resubscribing_a_channel_just_left_is_live(bus: AnyBus, keys: Keys) -> None:
    channel = keys.thread_channel("again")
    for i in range(20):
        async with bus.subscribe(channel) as sub:
            await bus.publish(channel, str(i).encode())
            assert await receive(aiter(sub)) == str(i).encode()


async def test_cancelled_subscribe_leaves_the_bus_usable(bus: AnyBus, keys: Keys) -> None:
    channel = keys.thread_channel("cancelled")

    async def subscribe_forever() -> None:
        async with bus.subscribe(channel) as sub:
            async for _ in sub:
                pass

    for _ in range(10):
        task = asyncio.create_task(subscribe_forever())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with bus.subscribe(channel) as sub:
        await bus.publish(channel, b"still works")
        assert await receive(aiter(sub)) == b"still works"


# -- wait tokens and heartbeats ------------------------------------------------------------


async def test_wait_tokens_set_get_clear(bus: AnyBus) -> None:
    assert await bus.wait_holder("card-1") is None
    await bus.set_wait("card-1", "w-1", 10_000)
    assert await bus.wait_holder("card-1") == "w-1"
    await bus.set_wait("card-1", "w-2", 10_000)  # adopted by another worker
    assert await bus.wait_holder("card-1") == "w-2"
    await bus.clear_wait("card-1")
    assert await bus.wait_holder("card-1") is None
    await bus.clear_wait("card-1")  # clearing twice is fine


async def test_wait_tokens_expire_after_their_ttl(bus: AnyBus) -> None:
    await bus.set_wait("card-2", "w-1", 200)
    assert await bus.wait_holder("card-2") == "w-1"
    await asyncio.sleep(0.35)
    assert await bus.wait_holder("card-2") is None


async def test_clear_waits_clears_many_tokens_and_only_those(bus: AnyBus) -> None:
    cards = [f"card-{i}" for i in range(2 * CLEAR_BATCH + 7)]  # several Redis batches
    for card in [*cards, "kept"]:
        await bus.set_wait(card, "w-1", 10_000)
    await bus.clear_waits([])
    assert await bus.wait_holder(cards[0]) == "w-1"
    # any iterable; unknown ids and repeats are fine
    await bus.clear_waits(card for card in [*cards, "never-set", cards[0]])
    holders = [await bus.wait_holder(card) for card in cards]
    assert holders == [None] * len(cards)
    assert await bus.wait_holder("kept") == "w-1"


async def test_heartbeat_marks_a_worker_alive_until_it_lapses(bus: AnyBus) -> None:
    assert not await bus.alive("w-1")
    await bus.heartbeat("w-1", 200)
    assert await bus.alive("w-1")
    assert not await bus.alive("w-2")
    await asyncio.sleep(0.35)
    assert not await bus.alive("w-1")
    await bus.heartbeat("w-1", 10_000)
    assert await bus.alive("w-1")


# -- the inbox -----------------------------------------------------------------------------


async def test_take_on_an_empty_inbox_returns_nothing_after_the_timeout(bus: AnyBus) -> None:
    started = time.monotonic()
    assert await bus.take("w-1", 0.2) == []
    assert 0.15 <= time.monotonic() - started < 2


async def test_enqueue_take_ack(bus: AnyBus) -> None:
    ids = [await bus.enqueue(job(1)), await bus.enqueue(job(2))]
    assert len(set(ids)) == 2
    deliveries = await take_all(bus, "w-1", 2)
    assert [d.id for d in deliveries] == ids
    assert [d.job for d in deliveries] == [job(1), job(2)]
    for delivery in deliveries:
        await bus.ack(delivery.id)
    # Acked entries are never handed out again, not even to another consumer later.
    await asyncio.sleep(CLAIM_IDLE + 0.1)
    assert await bus.take("w-2", 0.2) == []


async def test_take_gives_at_most_count_and_leaves_the_rest_to_others(bus: AnyBus) -> None:
    # A worker asks for the room it has (runtime/intake.py): the rest stays in the inbox.
    # One thread each: on a partitioned inbox they spread over the partitions. w-1 is
    # alive, so a slow machine (CI) cannot let w-2 claim what w-1 took as a dead one's.
    await bus.heartbeat("w-1", 60_000)
    ids = [await bus.enqueue(job(n, thread=f"t-{n}")) for n in range(5)]
    first: list[Delivery] = []
    deadline = time.monotonic() + 5
    while len(first) < 2 and time.monotonic() < deadline:
        got = await bus.take("w-1", 0.2, 2 - len(first))
        assert len(got) <= 2 - len(first)
        first += got
    assert len(first) == 2
    rest = await take_all(bus, "w-2", 3)
    assert sorted(d.id for d in first + rest) == sorted(ids)


async def test_a_dead_consumers_jobs_are_claimed_at_most_count_at_a_time(bus: AnyBus) -> None:
    ids = [await bus.enqueue(job(n, thread=f"t-{n}")) for n in range(5)]
    taken = await take_all(bus, "w-dead", 5)  # w-dead never heartbeats
    assert sorted(d.id for d in taken) == sorted(ids)
    await asyncio.sleep(CLAIM_IDLE + 0.1)
    claimed = await bus.take("w-2", 1.0, 2)
    assert 1 <= len(claimed) <= 2 and {d.id for d in claimed} <= set(ids)
    more: list[Delivery] = []
    deadline = time.monotonic() + 5
    while len(more) < 3 and time.monotonic() < deadline:
        more += await bus.take("w-2", 0.2, 2)
    assert sorted(d.id for d in claimed + more) == sorted(ids)


async def test_an_unacked_job_of_a_dead_consumer_goes_to_another_after_claim_idle(
    bus: AnyBus,
) -> None:
    entry = await bus.enqueue(job(7))
    [first] = await bus.take("w-dead", 1.0)  # w-dead never heartbeats
    assert first.id == entry
    assert await bus.take("w-2", 0.05) == []  # not idle long enough yet
    await asyncio.sleep(CLAIM_IDLE + 0.1)
    [again] = await take_all(bus, "w-2", 1)
    assert again == first
    await bus.ack(again.id)
    await asyncio.sleep(CLAIM_IDLE + 0.1)
    assert await bus.take("w-3", 0.1) == []


async def test_a_released_job_is_delivered_again_even_to_its_live_consumer(
    bus: AnyBus,
) -> None:
    """A worker that could not finish (nor ack) a job hands it back: it is not stranded in
    that worker's in-flight set while the worker lives on (issue 10, item 2)."""
    entry = await bus.enqueue(job(8))
    await bus.heartbeat("w-1", 60_000)  # alive: nobody else may claim its entries
    [first] = await bus.take("w-1", 1.0)
    assert first.id == entry
    bus.release(first)
    await asyncio.sleep(CLAIM_IDLE + 0.1)
    [again] = await take_all(bus, "w-1", 1)
    assert again.job == first.job
    await bus.ack(again.id)
    await asyncio.sleep(CLAIM_IDLE + 0.1)
    assert await bus.take("w-1", 0.1) == []


async def test_a_live_but_slow_consumer_keeps_its_jobs(bus: AnyBus) -> None:
    await bus.heartbeat("w-slow", 10_000)
    await bus.enqueue(job(8))
    [mine] = await bus.take("w-slow", 1.0)
    await asyncio.sleep(CLAIM_IDLE + 0.1)
    assert await bus.take("w-2", 0.1) == []
    await bus.ack(mine.id)


async def test_jobs_of_a_dead_consumer_are_found_behind_many_live_ones(bus: AnyBus) -> None:
    await bus.heartbeat("w-live", 10_000)
    for n in range(130):
        await bus.enqueue(job(n))
    held = await take_all(bus, "w-live", 105, 5.0)  # more than one XPENDING page
    dead = await take_all(bus, "w-dead", 130 - len(held), 5.0)
    assert len(held) >= 105 and len(held) + len(dead) == 130
    await asyncio.sleep(CLAIM_IDLE + 0.1)
    # w-2 is alive: the entries it claims first are not a dead consumer's for w-3 when its
    # last take comes later than the claim idle time (a CI run on a loaded machine: w-3
    # took w-2's first 16 claimed entries, w-2 having never said it was alive).
    await bus.heartbeat("w-2", 10_000)
    again = await take_all(bus, "w-2", len(dead), 5.0)
    assert sorted(d.id for d in again) == sorted(d.id for d in dead)
    assert await bus.take("w-3", 0.1) == []
    for delivery in held + again:
        await bus.ack(delivery.id)


async def test_new_jobs_are_shared_not_duplicated(bus: AnyBus) -> None:
    ids = {await bus.enqueue(job(n)) for n in range(10)}
    a, b = await asyncio.gather(take_all(bus, "w-a", 5, 1.0), take_all(bus, "w-b", 5, 1.0))
    rest = await take_all(bus, "w-c", 10 - len(a) - len(b), 1.0)
    seen = [d.id for d in a + b + rest]
    assert sorted(seen) == sorted(ids)
    for delivery_id in seen:
        await bus.ack(delivery_id)


# -- Redis only ----------------------------------------------------------------------------


async def kill_pubsub_connections(admin: aioredis.Redis, tag: str) -> int:
    """CLIENT KILL this test's pub/sub connection(s) only (other tests share the server)."""
    killed = 0
    for client in await admin.client_list(_type="pubsub"):
        if client.get("name") == tag:
            killed += await admin.client_kill_filter(_id=client["id"], _type="pubsub")
    return killed


class TestRedisOnly:
    """Faults and races only a real server has; the in-process bus cannot drop or lag."""

    async def test_a_killed_pubsub_connection_makes_live_subscriptions_raise(
        self, redis_bus: RedisBus, keys: Keys, admin: aioredis.Redis, tag: str
    ) -> None:
        one, two = keys.worker_channel("w-1"), keys.thread_channel("t-1")
        async with redis_bus.subscribe(one) as a, redis_bus.subscribe(two) as b:
            ia, ib = aiter(a), aiter(b)
            await redis_bus.publish(one, b"before")
            assert await receive(ia) == b"before"
            assert await kill_pubsub_connections(admin, tag) == 1
            started = time.monotonic()
            with pytest.raises(BusDisconnected):
                await receive(ia, 1.0)
            with pytest.raises(BusDisconnected):
                await receive(ib, 1.0)
            assert time.monotonic() - started < 1.0
            with pytest.raises(BusDisconnected):  # and keeps raising
                await receive(ia, 1.0)
            assert isinstance(BusDisconnected("x"), Unavailable)
        # A fresh subscribe reconnects and is live.
        async with redis_bus.subscribe(one) as c:
            assert await redis_subscribers(admin, one) == 1
            assert await redis_bus.publish(one, b"after") == 1
            assert await receive(aiter(c)) == b"after"

    async def test_consumers_loop_recovers_after_a_kill(
        self, redis_bus: RedisBus, keys: Keys, admin: aioredis.Redis, tag: str
    ) -> None:
        """The worker/feed pattern: re-subscribe on error and re-read the truth."""
        channel = keys.worker_channel("w-1")
        subscribed = 0
        received: list[bytes] = []
        live = asyncio.Event()

        async def listen() -> None:
            nonlocal subscribed
            while True:
                try:
                    async with redis_bus.subscribe(channel) as sub:
                        subscribed += 1
                        live.set()
                        async for raw in sub:
                            received.append(raw)
                except Unavailable:
                    await asyncio.sleep(0.05)

        task = asyncio.create_task(listen())
        try:
            for round_ in range(3):
                await asyncio.wait_for(live.wait(), 5)
                live.clear()
                await redis_bus.publish(channel, f"r{round_}".encode())
                while len(received) <= round_:
                    await asyncio.sleep(0.01)
                assert await kill_pubsub_connections(admin, tag) == 1
            await asyncio.wait_for(live.wait(), 5)
            assert subscribed == 4
            assert received == [b"r0", b"r1", b"r2"]
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    async def test_a_message_published_right_after_subscribe_is_never_lost(
        self, redis_bus: RedisBus, keys: Keys, tag: str
    ) -> None:
        # Publish from another bus (another process, as in production).
        async with open_redis_bus(tag + "-pub", keys) as publisher:
            for i in range(200):
                channel = keys.worker_channel(f"w-{i}")
                async with redis_bus.subscribe(channel) as sub:
                    assert await publisher.publish(channel, b"decision") == 1
                    assert await receive(aiter(sub)) == b"decision"

    async def test_an_unreachable_server_raises_unavailable_after_retries(self, keys: Keys) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]  # closed again before use: nothing listens
        bus = RedisBus.from_url(f"redis://127.0.0.1:{port}/0", keys)
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable) as raised:
                await bus.wait_holder("card-1")
            assert time.monotonic() - started >= sum(RETRY_DELAYS) * 0.75
            assert isinstance(raised.value.__cause__, (rx.ConnectionError, ConnectionError))
            assert "after 4 tries" in str(raised.value)
            with pytest.raises(Unavailable):
                async with bus.subscribe(keys.worker_channel("w-1")):
                    pass
            with pytest.raises(Unavailable):
                await bus.take("w-1", 0.1)
        finally:
            await bus.close()

    async def test_close_ends_live_subscriptions(self, tag: str, keys: Keys) -> None:
        async with open_redis_bus(tag, keys) as bus:
            channel = keys.thread_channel("t-1")
            async with bus.subscribe(channel) as sub:
                it = aiter(sub)
                pending = asyncio.create_task(receive(it))
                await asyncio.sleep(0.05)
                await bus.close()
                with pytest.raises(BusDisconnected):
                    await pending
            with pytest.raises(Unavailable):
                await bus.publish(channel, b"closed")

    async def test_entries_that_are_not_jobs_are_acked_and_skipped(
        self, redis_bus: RedisBus, keys: Keys, admin: aioredis.Redis
    ) -> None:
        await admin.xadd(keys.inbox, {"job": b"{not json"})
        await admin.xadd(keys.inbox, {"other": b"field"})
        good = await redis_bus.enqueue(job(1))
        deliveries = await take_all(redis_bus, "w-1", 1)
        assert [d.id for d in deliveries] == [good]
        assert await redis_bus.take("w-1", 0.1) == []
        pending = await admin.xpending(keys.inbox, keys.inbox_group)
        assert pending["pending"] == 1  # only the good one, until acked
        await redis_bus.ack(good)
        pending = await admin.xpending(keys.inbox, keys.inbox_group)
        assert pending["pending"] == 0
        assert await admin.xlen(keys.inbox) == 0  # done jobs leave the stream

    async def test_jobs_enqueued_before_any_worker_are_delivered(
        self, redis_bus: RedisBus, keys: Keys, admin: aioredis.Redis
    ) -> None:
        assert not await admin.exists(keys.inbox)
        entry = await redis_bus.enqueue(job(1))
        [delivery] = await redis_bus.take("w-1", 1.0)
        assert delivery.id == entry

    async def test_a_restarted_consumer_gets_its_own_unacked_jobs_back(
        self, tag: str, keys: Keys
    ) -> None:
        async with open_redis_bus(tag, keys) as before:
            await before.heartbeat("w-1", 10_000)
            entry = await before.enqueue(job(3))
            [taken] = await before.take("w-1", 1.0)
            assert taken.id == entry
            # The process dies here without acking; a new one starts with the same id.
            async with open_redis_bus(tag, keys) as after:
                await after.heartbeat("w-1", 10_000)
                await asyncio.sleep(CLAIM_IDLE + 0.1)
                [again] = await take_all(after, "w-1", 1)
                assert again == taken
                # ...while the old process (still in the same Redis, alive) does not
                # re-take the job it already holds.
                assert await before.take("w-1", 0.1) == []
                await after.ack(again.id)

    async def test_the_inbox_survives_its_stream_being_deleted(
        self, redis_bus: RedisBus, keys: Keys, admin: aioredis.Redis
    ) -> None:
        [first] = [await redis_bus.enqueue(job(1))]
        assert [d.id for d in await redis_bus.take("w-1", 1.0)] == [first]
        await admin.delete(keys.inbox)  # e.g. a Redis restart without persistence
        assert await redis_bus.take("w-1", 0.1) == []
        second = await redis_bus.enqueue(job(2))
        assert [d.id for d in await take_all(redis_bus, "w-1", 1)] == [second]

    async def test_a_client_of_redis_py_defaults_works_too(self, tag: str, keys: Keys) -> None:
        """redis-py 8 defaults to RESP3 (and its own retries); the bus accepts such a client."""
        client = aioredis.Redis.from_url(services.redis_url())
        bus = RedisBus(client, keys, claim_idle_ms=CLAIM_IDLE_MS)
        try:
            assert str((await client.client_info())["resp"]) == "3"
            channel = keys.thread_channel("t-1")
            async with bus.subscribe(channel) as sub:
                assert await bus.publish(channel, b"resp3") == 1
                assert await receive(aiter(sub)) == b"resp3"
            await bus.set_wait("card-1", "w-1", 10_000)
            assert await bus.wait_holder("card-1") == "w-1"
            entry = await bus.enqueue(job(1))
            [first] = await bus.take("w-dead", 1.0)
            assert first.id == entry
            await asyncio.sleep(CLAIM_IDLE + 0.1)
            [again] = await take_all(bus, "w-2", 1)
            assert again == first
            await bus.ack(again.id)
        finally:
            await bus.close()
            await drop_keys_of(keys)

    async def test_a_client_that_decodes_responses_is_refused(self, keys: Keys) -> None:
        client = aioredis.Redis.from_url(services.redis_url(), decode_responses=True)
        try:
            with pytest.raises(ConfigError):
                RedisBus(client, keys)
        finally:
            await client.aclose()

    async def test_a_redis_restart_ends_subscriptions_and_the_bus_recovers(
        self, keys: Keys, tmp_path: Path
    ) -> None:
        """A private, non-persistent server (embedded Valkey) stopped and started again."""
        server = await asyncio.to_thread(servers.start_valkey, tmp_path)
        bus = RedisBus.from_url(server.url, keys, claim_idle_ms=CLAIM_IDLE_MS)
        channel = keys.worker_channel("w-1")
        try:
            await bus.enqueue(job(1))
            assert len(await bus.take("w-1", 1.0)) == 1
            async with bus.subscribe(channel) as sub:
                pending = asyncio.create_task(receive(aiter(sub), 5.0))
                await asyncio.sleep(0.05)
                await asyncio.to_thread(server.stop)
                with pytest.raises(BusDisconnected):
                    await pending
            with pytest.raises(Unavailable):
                async with bus.subscribe(channel):
                    pass
            with pytest.raises(Unavailable):
                await bus.publish(channel, b"down")
            server = await asyncio.to_thread(servers.start_valkey, tmp_path, server.port)
            async with bus.subscribe(channel) as sub:
                assert await bus.publish(channel, b"back") == 1
                assert await receive(aiter(sub)) == b"back"
            # The stream and its group are gone with the old server: both come back.
            entry = await bus.enqueue(job(2))
            assert [d.id for d in await take_all(bus, "w-1", 1)] == [entry]
        finally:
            await bus.close()
            await asyncio.to_thread(server.stop)

    async def test_a_take_longer_than_the_socket_timeout_returns_empty(
        self, redis_bus: RedisBus
    ) -> None:
        """redis-py 8 reads with a 5 s socket timeout by default: BLOCK is kept below it."""
        started = time.monotonic()
        assert await redis_bus.take("w-1", 6.0) == []
        assert time.monotonic() - started < 5.5
