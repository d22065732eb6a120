"""Beyond one machine, faults at once: 2 gateways + 2 workers on a Redis Cluster (3 masters
+ 3 replicas) and on a private Postgres behind PgBouncer in transaction pooling mode.

With 100 parked runs and decisions flowing, Postgres is restarted and a Redis master
is killed with ``kill -9``: every decision is applied (retried by the client after a
503, as a person would click again), every card executed once, nothing lost.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests import pgbouncer
from tests.cluster import Cluster, cluster
from tests.e2e.test_pools import check_exactly_once
from tests.faults.conftest import Invariants, PrivatePostgres, fresh_migrated_db
from tests.faults.helpers import bearer, pending, runs_done, start_threads, wait_until
from tests.rediscluster import LocalCluster

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


async def approve_until_done(c: Cluster, urls: list[str], card: asyncpg.Record) -> int:
    """Approve, trying again (on either gateway) after a 503 or a dropped connection,
    until the card is ours (200, or 409 because our earlier try went in)."""
    deadline = time.monotonic() + 90
    attempt = 0
    async with httpx.AsyncClient(timeout=30) as http:
        while time.monotonic() < deadline:
            url = urls[attempt % len(urls)]
            attempt += 1
            try:
                r = await http.post(
                    f"{url}/v1/cards/{card['id']}/resolve",
                    json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
                    headers=bearer(c, card["owner"]),
                )
            except httpx.HTTPError:
                await asyncio.sleep(0.2)
                continue
            if r.status_code == 200:
                return attempt
            if r.status_code == 409:
                detail = r.json().get("detail", {})
                if detail.get("decided_by") == card["owner"] and detail.get("status") != "pending":
                    return attempt
            assert r.status_code == 503, r.text
            await asyncio.sleep(0.2)
    raise AssertionError(f"card {card['id']} never approved")


@pytest.mark.slow  # ~15-30 s: the default run leaves it to `pytest -m slow`
async def test_postgres_restart_and_redis_master_kill_under_load_lose_nothing(
    private_pg: PrivatePostgres,
    redis_cluster: LocalCluster,
    tmp_path: Path,
    invariants: Invariants,
) -> None:
    redis_cluster.wait_ok()  # a settled topology, whatever the tests before left
    direct = fresh_migrated_db(private_pg.url)
    bounced = pgbouncer.through(direct)
    with cluster(
        bounced,
        redis_cluster.url,
        tmp_path,
        gateways=2,
        workers=2,
        SIGNOFF_DB_STATEMENT_CACHE_SIZE="0",  # PgBouncer 1.18, transaction pooling
        SIGNOFF_LEASE_SECONDS="3",
        SIGNOFF_POLL_SECONDS="1",
    ) as c:
        invariants.watch(direct, c.tenant)
        a, b = c.gateways
        n = 100
        await start_threads(c, a.url, [f"cf{i}" for i in range(n)])
        db = await asyncpg.connect(direct)
        try:
            cards = await wait_until(lambda: pending(db, c.tenant, n), timeout=120)
        finally:
            await db.close()
        urls = [b.url, a.url]
        flowing = [asyncio.create_task(approve_until_done(c, urls, card)) for card in cards]
        await asyncio.sleep(0.2)
        await asyncio.to_thread(private_pg.restart)
        victim = redis_cluster.masters()[0]
        redis_cluster.kill(victim)
        try:
            attempts = await asyncio.gather(*flowing)
            db = await asyncpg.connect(direct)
            try:
                await wait_until(lambda: runs_done(db, c.tenant, n), timeout=120, what="runs")
                await check_exactly_once(db, c.tenant, n)
            finally:
                await db.close()
            await invariants.check(require_redis=False)
            print(f"\ndecisions tried again after the faults: {sum(x > 1 for x in attempts)}")
        finally:
            redis_cluster.restart(victim)
            redis_cluster.wait_ok()
