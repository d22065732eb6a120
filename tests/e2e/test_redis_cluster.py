"""Gateway and worker pools on a Redis Cluster (3 masters + 3 replicas), failovers included.

The pool test of ``test_pools.py`` on the cluster (500 threads, each charged exactly
once), then decisions flowing through 100 parked runs while a master is killed
with ``kill -9`` (its replica promoted) and while another is handed over with a manual
``CLUSTER FAILOVER``: every decision applied, every card executed once, nothing lost.
The time to recover (a bus write on the failed shard answers again) is printed and
recorded in design note 31.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from signoff.runtime.bus.cluster import ClusterClient
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.errors import Unavailable
from signoff.runtime.keys import Keys
from tests.cluster import Cluster, cluster
from tests.e2e.test_pools import (
    _count_pending,
    all_runs_done,
    approve_all,
    check_exactly_once,
    parked_threads,
    wait_until,
)
from tests.rediscluster import LocalCluster, cli

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


@pytest.fixture
def cluster_pools(
    database_url: str, redis_cluster: LocalCluster, tmp_path: Path
) -> Iterator[Cluster]:
    redis_cluster.wait_ok()  # a settled topology, whatever the tests before left
    with cluster(
        database_url,
        redis_cluster.url,
        tmp_path,
        gateways=2,
        workers=2,
        SIGNOFF_LEASE_SECONDS="3",
    ) as c:
        yield c


@pytest.mark.slow  # ~15-30 s: the default run leaves it to `pytest -m slow`
async def test_500_threads_across_pools_on_a_redis_cluster(
    cluster_pools: Cluster, database_url: str, redis_cluster: LocalCluster
) -> None:
    a, b = cluster_pools.gateways
    masters = redis_cluster.masters()
    before = {p: redis_cluster.command_calls(p, "spublish") for p in masters}
    db = await asyncpg.connect(database_url)
    try:
        n = 500
        await parked_threads(cluster_pools, a.url, n)
        cards = await wait_until(lambda: _count_pending(db, cluster_pools.tenant, n), timeout=120)
        codes = await approve_all(cluster_pools, b.url, cards)
        assert codes == [200] * n
        await wait_until(lambda: all_runs_done(db, cluster_pools.tenant, n), timeout=120)
        await check_exactly_once(db, cluster_pools.tenant, n)
    finally:
        await db.close()
    # Signals went out as sharded publishes, on every shard (channels spread over slots).
    after = {p: redis_cluster.command_calls(p, "spublish") for p in masters}
    assert all(after[p] > before[p] for p in masters), (before, after, redis_cluster.state())
    assert all(redis_cluster.command_calls(p, "publish") == 0 for p in masters)


async def probe_until_writable(bus: RedisBus, key: str, started: float) -> float:
    """Seconds from ``started`` until a bus write of ``key`` succeeds again."""
    while True:
        try:
            await bus.client.set_px(key, "probe", 10_000)
            return time.monotonic() - started
        except Unavailable:
            await asyncio.sleep(0.02)


@pytest.mark.slow  # 10-11 s: the default run leaves it to `pytest -m slow` (CI runs it)
async def test_failovers_under_load_lose_no_decision(
    cluster_pools: Cluster, database_url: str, redis_cluster: LocalCluster
) -> None:
    """100 parked runs; decisions flow while one master is killed and another fails over."""
    c = cluster_pools
    a, b = c.gateways
    keys = Keys(c.prefix)
    probe = RedisBus.from_url(redis_cluster.url, keys)
    assert isinstance(probe.client, ClusterClient)
    db = await asyncpg.connect(database_url)
    try:
        n = 100
        await parked_threads(c, a.url, n)
        cards = await wait_until(
            lambda: _count_pending(db, c.tenant, n), timeout=120, what="parked"
        )
        await probe.client.ready()
        victim = int(probe.client.node_of(keys.wait("probe-kill")).port)
        promoted = redis_cluster.replica_of(victim)
        # Decisions start flowing; the master dies while they do.
        first, second, third = cards[:40], cards[40:70], cards[70:]
        flowing = asyncio.create_task(approve_all(c, b.url, first))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        redis_cluster.kill(victim)
        kill_recovery = await probe_until_writable(probe, keys.wait("probe-kill"), started)
        codes = await flowing
        in_flight_answered = time.monotonic() - started  # the 40 decisions sent around it
        codes += await approve_all(c, a.url, second)
        # A manual failover of another master while the rest of the decisions flow.
        probe.client.suspect()
        await probe.client.refresh()
        other = next(p for p in redis_cluster.masters() if p not in (victim, promoted))
        replica = redis_cluster.replica_of(other)
        flowing = asyncio.create_task(approve_all(c, b.url, third))
        started = time.monotonic()
        cli(replica, "CLUSTER", "FAILOVER")
        key = next(
            k
            for k in (keys.wait(f"probe-{i}") for i in range(1000))
            if int(probe.client.node_of(k).port) == other
        )
        deadline = time.monotonic() + 20
        while "role:master" not in cli(replica, "INFO", "replication"):
            assert time.monotonic() < deadline, "the replica was not promoted"
            await asyncio.sleep(0.02)
        failover_recovery = await probe_until_writable(probe, key, started)
        codes += await flowing
        assert codes == [200] * n
        try:
            await wait_until(lambda: all_runs_done(db, c.tenant, n), timeout=120, what="runs")
        except AssertionError as exc:
            runs = await db.fetch(
                "SELECT status, count(*) FROM runs WHERE tenant = $1 GROUP BY 1", c.tenant
            )
            states = await db.fetch(
                "SELECT status, count(*) FROM cards WHERE tenant = $1 GROUP BY 1", c.tenant
            )
            raise AssertionError(
                f"runs {[tuple(r) for r in runs]}, cards {[tuple(r) for r in states]}"
            ) from exc
        await check_exactly_once(db, c.tenant, n)
        print(
            f"\nrecovery: kill -9 of a master {kill_recovery:.2f}s "
            f"(decisions in flight all answered after {in_flight_answered:.2f}s), "
            f"manual CLUSTER FAILOVER {failover_recovery:.2f}s"
        )
    finally:
        await db.close()
        await probe.close()
        for port in redis_cluster.ports:
            if port not in redis_cluster.live():
                redis_cluster.restart(port)
        redis_cluster.wait_ok()
