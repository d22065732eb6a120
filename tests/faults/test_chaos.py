"""Heavy profile only (``--heavy``): everything at once, for longer.

Three workers and two gateways; hundreds of parked runs; while the decisions stream in,
workers are SIGKILLed and restarted under the same id, and Redis kills every pub/sub
connection. At the end every run has finished and the invariant checker holds: one
execution per card, one charge per executed card, every approval audited.
"""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from tests.cluster import cluster
from tests.faults.conftest import Invariants, Profile
from tests.faults.helpers import approve, pending, runs_done, start_threads, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.heavy, pytest.mark.timeout(900)]


async def test_chaos_kills_and_pubsub_drops_while_deciding(
    database_url: str, redis_url: str, tmp_path: Path, profile: Profile, invariants: Invariants
) -> None:
    """I4 + I6 + I8 under churn: 300 runs decided in waves while workers die and come back
    and pub/sub connections are killed. Cards caught mid-execution by a kill stay
    `executing` and are flagged (I4); everything else executes exactly once."""
    n = 3 * profile.parked
    rng = random.Random(11)
    with cluster(
        database_url,
        redis_url,
        tmp_path,
        gateways=2,
        workers=3,
        SIGNOFF_LEASE_SECONDS="2",
        SIGNOFF_POLL_SECONDS="1",
        SIGNOFF_CLAIM_IDLE_MS="1000",
        SIGNOFF_SWEEP_SECONDS="0.5",
        SIGNOFF_STUCK_AFTER_SECONDS="2",
    ) as c:
        invariants.watch_cluster(c)
        db = await asyncpg.connect(database_url)
        r = aioredis.from_url(redis_url)
        try:
            await start_threads(c, c.gateways[0].url, [f"ch{i}" for i in range(n)])
            cards = list(
                await wait_until(lambda: pending(db, c.tenant, n), timeout=120, what="cards")
            )
            rng.shuffle(cards)
            waves = [cards[i : i + 30] for i in range(0, n, 30)]
            stop = asyncio.Event()

            async def churn() -> None:
                while not stop.is_set():
                    await asyncio.sleep(rng.uniform(0.5, 1.5))
                    victim = rng.choice(c.workers)
                    if rng.random() < 0.3:
                        await r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")  # type: ignore[no-untyped-call]
                        continue
                    victim.signal(signal.SIGKILL)
                    await asyncio.to_thread(victim.wait, 30)
                    victim.stop()  # reaped: closes its log
                    c.workers.remove(victim)
                    await asyncio.to_thread(c.add_worker, victim.name)

            chaos = asyncio.create_task(churn())
            try:
                for i, wave in enumerate(waves):
                    codes = await approve(c, c.gateways[i % 2].url, wave)
                    assert set(codes) == {200}, codes
                    await asyncio.sleep(0.3)
            finally:
                stop.set()
                await chaos

            async def settled() -> bool:
                left = await db.fetchval(
                    "SELECT count(*) FROM runs WHERE tenant = $1 AND status IN ('running', "
                    "'waiting')",
                    c.tenant,
                )
                return bool(left == 0)

            await wait_until(settled, timeout=180, what="every run finished")
            assert await runs_done(db, c.tenant, n)
            await asyncio.sleep(3)  # past the stuck threshold: interrupted executions flagged
            await invariants.check()
        finally:
            await r.aclose()
            await db.close()
