"""Redis faults between real processes: a subscriber cut off by Redis's output-buffer
limit, slow and half-open links, and a gateway that cannot reach Redis at all.

Redis pub/sub is at-most-once; each case shows that a lost message costs latency, never
a decision, because Postgres is the truth (I6). Faults are injected with the TCP proxy
(tests/faults/proxy.py) on a private Redis server.

Cases already covered in tests/e2e/test_pools.py (not repeated here): publish before
subscribe and CLIENT KILL of the pub/sub connection
(``test_decision_published_before_subscribe_and_after_pubsub_kill``), Redis restarted
with no persistence (``test_redis_restart_with_100_parked_runs``).
"""

from __future__ import annotations

import time
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from signoff.testing.servers import EmbeddedServer
from tests.cluster import cluster
from tests.faults.conftest import Invariants
from tests.faults.helpers import (
    approve,
    count,
    inbox_drained,
    pending,
    runs_done,
    start_threads,
    wait_until,
)
from tests.faults.proxy import Link, Proxy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


def pubsub(link: Link) -> bool:
    return b"SUBSCRIBE" in link.sent


async def waiting_runs(db: asyncpg.Connection, tenant: str) -> int:
    return await count(
        db, "SELECT count(*) FROM runs WHERE tenant = $1 AND status = 'waiting'", tenant
    )


async def test_slow_subscriber_cut_off_by_output_buffer_limit_loses_no_decision(
    database_url: str, valkey: EmbeddedServer, tmp_path: Path, invariants: Invariants
) -> None:
    """I6: the worker's pub/sub connection stops reading; decisions published to it pile
    up in Redis's output buffer (PUBLISH counted the worker as a receiver), and Redis cuts
    the client off at its `client-output-buffer-limit pubsub`, discarding them. The worker
    re-subscribes, re-reads Postgres and continues every run (its slow poll is 60 s: only
    the re-read on re-subscribe can do it in time)."""
    r = aioredis.from_url(valkey.url)
    await r.config_set("client-output-buffer-limit", "pubsub 1mb 0 0")
    with (
        Proxy(valkey.port) as proxy,
        cluster(
            database_url,
            valkey.url,
            tmp_path,
            gateways=1,
            workers=0,
            SIGNOFF_POLL_SECONDS="60",
        ) as c,
    ):
        invariants.watch_cluster(c)
        c.add_worker("slow-w", SIGNOFF_REDIS_URL=proxy.url_for(valkey.url))
        (gw,) = c.gateways
        channel = f"{c.prefix}w:slow-w"
        db = await asyncpg.connect(database_url)
        try:
            n = 10
            await start_threads(c, gw.url, [f"sl{i}" for i in range(n)])
            cards = await wait_until(lambda: pending(db, c.tenant, n), what="cards")
            assert proxy.pause(pubsub) == 1

            async def queued_in_redis() -> int:
                (client,) = await r.client_list(_type="pubsub")
                return int(client["omem"])

            junk = b"x" * 64 * 1024
            for _ in range(2000):  # fill the kernel's socket buffers until Redis queues
                await r.publish(channel, junk)
                if await queued_in_redis() > 0:
                    break
            assert await queued_in_redis() > 0
            assert await approve(c, gw.url, cards) == [200] * n
            assert (await r.pubsub_numsub(channel))[0][1] == 1  # "heard" by a subscriber
            for _ in range(200):  # now over the limit: Redis drops the client and its buffer
                if (await r.pubsub_numsub(channel))[0][1] == 0:
                    break
                await r.publish(channel, junk)
            assert (await r.pubsub_numsub(channel))[0][1] == 0, "Redis did not cut it off"
            cut_at = time.monotonic()
            proxy.resume()
            await wait_until(lambda: runs_done(db, c.tenant, n), timeout=20, what="runs done")
            assert time.monotonic() - cut_at < 20
            await invariants.check()
        finally:
            await db.close()
    await r.aclose()


@pytest.mark.slow  # ~15-30 s: the default run leaves it to `pytest -m slow`
async def test_redis_latency_and_half_open_links_lose_no_decision(
    database_url: str, valkey: EmbeddedServer, tmp_path: Path, invariants: Invariants
) -> None:
    """I6: the worker reaches Redis through the proxy. With 20 ms of latency each way the
    flow works; when its pub/sub connection goes half-open (Redis still counts it, messages
    vanish, no error anywhere) decisions arrive through the slow poll of Postgres; when every
    connection goes half-open the worker's command timeouts move it to fresh connections and
    it keeps taking new work."""
    with (
        Proxy(valkey.port) as proxy,
        cluster(
            database_url,
            valkey.url,
            tmp_path,
            gateways=1,
            workers=0,
            SIGNOFF_POLL_SECONDS="1",
            SIGNOFF_CLAIM_IDLE_MS="1000",
        ) as c,
    ):
        invariants.watch_cluster(c)
        c.add_worker("ho-w", SIGNOFF_REDIS_URL=proxy.url_for(valkey.url))
        (gw,) = c.gateways
        db = await asyncpg.connect(database_url)
        try:
            proxy.delay(up=0.02, down=0.02)
            await start_threads(c, gw.url, [f"la{i}" for i in range(5)])
            cards = await wait_until(lambda: pending(db, c.tenant, 5), what="5 cards")
            assert await approve(c, gw.url, cards) == [200] * 5
            await wait_until(lambda: runs_done(db, c.tenant, 5), what="5 runs done")
            proxy.delay()

            await start_threads(c, gw.url, [f"hp{i}" for i in range(5)])
            cards = await wait_until(lambda: pending(db, c.tenant, 5), what="5 more cards")
            assert proxy.blackhole(pubsub) == 1
            t0 = time.monotonic()
            assert await approve(c, gw.url, cards) == [200] * 5
            # the pub/sub health ping would notice only after 15-30 s: the poll does it
            await wait_until(lambda: runs_done(db, c.tenant, 10), timeout=10, what="poll")
            assert time.monotonic() - t0 < 10

            proxy.blackhole()  # every live connection of the worker goes half-open
            await start_threads(c, gw.url, [f"hx{i}" for i in range(3)])
            cards = await wait_until(
                lambda: pending(db, c.tenant, 3), timeout=45, what="new work taken"
            )
            assert await approve(c, gw.url, cards) == [200] * 3
            await wait_until(lambda: runs_done(db, c.tenant, 13), timeout=45, what="13 done")
            # An ack sent on a half-open connection fails only after the command timeouts;
            # the entry is then handed back and reclaimed (its run found, not run again).
            await wait_until(lambda: inbox_drained(c), timeout=45, what="inbox drained")
            await invariants.check()
        finally:
            await db.close()


async def test_gateway_without_redis_still_commits_and_the_worker_applies_it(
    database_url: str, valkey: EmbeddedServer, tmp_path: Path, invariants: Invariants
) -> None:
    """I6: the gateway loses Redis entirely (connections reset, new ones refused) after the
    cards were shown. A decision is committed in Postgres before anything is published, so
    it answers 200 (not a 503 for a decision that was in fact taken) and the worker finds
    the decision on its slow poll and executes it once."""
    with (
        Proxy(valkey.port) as proxy,
        cluster(
            database_url,
            valkey.url,
            tmp_path,
            gateways=0,
            workers=1,
            SIGNOFF_POLL_SECONDS="1",
        ) as c,
    ):
        invariants.watch_cluster(c)
        gw = c.add_gateway(SIGNOFF_REDIS_URL=proxy.url_for(valkey.url))
        db = await asyncpg.connect(database_url)
        try:
            await start_threads(c, gw.url, [f"nr{i}" for i in range(3)])
            cards = await wait_until(lambda: pending(db, c.tenant, 3), what="3 cards")
            proxy.refuse()
            proxy.reset()
            assert await approve(c, gw.url, cards) == [200] * 3
            await wait_until(lambda: runs_done(db, c.tenant, 3), timeout=15, what="runs done")
            await invariants.check()
        finally:
            await db.close()
