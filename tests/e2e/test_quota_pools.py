"""Per-user quotas across gateway processes: one user's burst spread over two gateways
(one Redis, one Postgres) never gets past the limit (gateway/quotas.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from tests import services
from tests.cluster import Cluster, cluster
from tests.faults.helpers import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

THREADS_PER_MINUTE = 6
TURNS_IN_FLIGHT = 4


@pytest.fixture
def pools(database_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Two gateways and no worker yet: accepted messages stay in the inbox."""
    with cluster(
        database_url,
        services.redis_url(),
        tmp_path,
        gateways=2,
        workers=0,
        SIGNOFF_QUOTA_THREADS_PER_MINUTE=str(THREADS_PER_MINUTE),
        SIGNOFF_QUOTA_TURNS_IN_FLIGHT=str(TURNS_IN_FLIGHT),
    ) as c:
        yield c


def bearer(c: Cluster, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {c.token(user)}"}


async def test_bursts_across_two_gateways_stay_within_the_quotas(
    pools: Cluster, database_url: str
) -> None:
    c = pools
    clients = [httpx.AsyncClient(base_url=gw.url, timeout=30) for gw in c.gateways]
    db = await asyncpg.connect(database_url)
    r = aioredis.Redis.from_url(services.redis_url())
    try:
        # Threads: 30 at once, half on each gateway: exactly the quota is created.
        rs = await asyncio.gather(
            *(clients[i % 2].post("/v1/threads", headers=bearer(c, "ana")) for i in range(30))
        )
        codes = sorted(x.status_code for x in rs)
        assert codes == [201] * THREADS_PER_MINUTE + [429] * (30 - THREADS_PER_MINUTE), codes
        threads = [x.json()["thread"]["id"] for x in rs if x.status_code == 201]
        made = await db.fetchval(
            "SELECT count(*) FROM threads WHERE tenant = $1 AND owner = 'ana'", c.tenant
        )
        assert made == THREADS_PER_MINUTE

        # Turns: 24 messages at once over the six threads, on both gateways.
        async def say(i: int) -> httpx.Response:
            return await clients[i % 2].post(
                f"/v1/threads/{threads[i % len(threads)]}/messages",
                json={"text": "cobre 12 do João"},
                headers=bearer(c, "ana"),
            )

        rs = await asyncio.gather(*(say(i) for i in range(24)))
        assert {x.status_code for x in rs} <= {202, 429}, [x.text for x in rs]
        accepted = sum(x.status_code == 202 for x in rs)
        assert 1 <= accepted <= TURNS_IN_FLIGHT, accepted
        for x in rs:
            if x.status_code == 429:
                assert x.json()["detail"]["quota"] == "turns_in_flight"
                assert x.headers["retry-after"].isdigit()
        assert await r.xlen(c.prefix + "inbox") == accepted  # the refused left nothing

        # A worker runs them (each parks on a card: `waiting` is no model turn): the
        # user's slots come back, counted from Postgres once the runs exist.
        c.add_worker()

        async def parked() -> bool:
            n = await db.fetchval(
                "SELECT count(*) FROM runs WHERE tenant = $1 AND owner = 'ana' "
                "AND status = 'waiting'",
                c.tenant,
            )
            return bool(n >= 1) and await r.xlen(c.prefix + "inbox") == 0

        await wait_until(parked, 60, what="the accepted messages ran")
        await wait_until(
            lambda: _none_running(db, c.tenant), 60, what="no run of ana's still running"
        )
        x = await say(0)
        assert x.status_code == 202, x.text
        body = json.loads(x.text)
        assert body["accepted"] is True
    finally:
        for client in clients:
            await client.aclose()
        await db.close()
        await r.aclose()


async def _none_running(db: asyncpg.Connection, tenant: str) -> bool:
    n: int = await db.fetchval(
        "SELECT count(*) FROM runs WHERE tenant = $1 AND owner = 'ana' AND status = 'running'",
        tenant,
    )
    return n == 0
