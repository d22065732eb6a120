"""The invariant checker itself: each check added for issue 10 fires on a planted
violation and stays quiet on the legitimate state next to it (a checker that cannot
fail proves nothing)."""

from __future__ import annotations

import secrets
import time
import uuid

import asyncpg
import pytest
import redis.asyncio as aioredis

from signoff.runtime.keys import Keys
from tests.faults.conftest import Invariants
from tests.faults.invariants import Scope, check

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def plant_run(
    db: asyncpg.Connection, tenant: str, worker: str | None, idle_seconds: float
) -> str:
    """A thread with one `running` run held by ``worker``, last written ``idle_seconds`` ago."""
    thread, run = uuid.uuid4(), uuid.uuid4()
    await db.execute(
        "INSERT INTO threads (id, tenant, owner) VALUES ($1, $2, 'planter')", thread, tenant
    )
    await db.execute(
        "INSERT INTO runs (id, thread_id, tenant, owner, status, worker_id, updated_at) "
        "VALUES ($1, $2, $3, 'planter', 'running', $4, now() - make_interval(secs => $5))",
        run,
        thread,
        tenant,
        worker,
        idle_seconds,
    )
    return str(run)


async def plant_card(db: asyncpg.Connection, tenant: str, approved_seconds_ago: float) -> str:
    thread, run, card = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await db.execute(
        "INSERT INTO threads (id, tenant, owner) VALUES ($1, $2, 'planter')", thread, tenant
    )
    await db.execute(
        "INSERT INTO runs (id, thread_id, tenant, owner, status) "
        "VALUES ($1, $2, $3, 'planter', 'waiting')",
        run,
        thread,
        tenant,
    )
    await db.execute(
        """
        INSERT INTO cards (id, thread_id, run_id, tenant, owner, tool, risk, args_snapshot,
                           summary, impact, snapshot_hash, request_key, operation_id, status,
                           expires_at, decided_at, decided_by)
        VALUES ($1, $2, $3, $4, 'planter', 'create_pix_charge', 'critical', '{}', 's', '{}',
                'h', $5, $6, 'approved', now() + interval '1 hour',
                now() - make_interval(secs => $7), 'planter')
        """,
        card,
        thread,
        run,
        tenant,
        secrets.token_hex(8),
        uuid.uuid4(),
        approved_seconds_ago,
    )
    return str(card)


async def test_new_checks_fire_on_planted_violations(
    database_url: str, redis_url: str, invariants: Invariants
) -> None:
    tenant = "chk-" + secrets.token_hex(4)
    prefix = f"so-chk-{secrets.token_hex(4)}:"
    keys = Keys(prefix)
    # Checked again at teardown, once the planted rows and entries are gone.
    invariants.watch(database_url, tenant, redis_url=redis_url, prefix=prefix)
    db = await asyncpg.connect(database_url)
    r = aioredis.from_url(redis_url)
    try:
        lapsed_w, live_w = f"lapsed-{tenant}", f"live-{tenant}"
        await db.execute(
            "INSERT INTO workers (id, lease_until) VALUES "
            "($1, now() - interval '1 minute'), ($2, now() + interval '1 minute')",
            lapsed_w,
            live_w,
        )
        released = await plant_run(db, tenant, None, 60)
        ghost = await plant_run(db, tenant, f"ghost-{tenant}", 60)  # no lease row at all
        lapsed = await plant_run(db, tenant, lapsed_w, 0)
        fine = [
            await plant_run(db, tenant, live_w, 60),  # a live holder: adopted by nobody, fine
            await plant_run(db, tenant, None, 0),  # released a moment ago: not yet adoptable
        ]
        stale_card = await plant_card(db, tenant, 60)
        fresh_card = await plant_card(db, tenant, 0)
        # Inbox: an entry never delivered and one pending at a consumer, both a minute old;
        # a fresh one; all under this test's own prefix.
        old_ms = int(time.time() * 1000) - 60_000
        undelivered = f"{old_ms}-0"
        await r.xadd(keys.inbox, {"job": "{}"}, id=f"{old_ms - 1}-0")
        await r.xgroup_create(keys.inbox, keys.inbox_group, id="0")
        await r.xreadgroup(keys.inbox_group, "stuck-consumer", {keys.inbox: ">"}, count=1)
        await r.xadd(keys.inbox, {"job": "{}"}, id=undelivered)
        await r.xadd(keys.inbox, {"job": "{}"})

        scope = Scope(
            database_url,
            tenant,
            approved_after_seconds=5,
            redis_url=redis_url,
            prefix=prefix,
            inbox_idle_seconds=10,
        )
        found = await check(scope)
        by_check: dict[str, list[str]] = {}
        for line in found:
            name, _, text = line.partition(": ")
            by_check.setdefault(name, []).append(text)

        unheld = "\n".join(by_check.get("unheld", []))
        assert len(by_check.get("unheld", [])) == 3, unheld
        assert f"run {released} running with no holder" in unheld
        assert f"run {ghost} running with holder 'ghost-{tenant}' has no lease row" in unheld
        assert f"run {lapsed} running with holder {lapsed_w!r} whose lease lapsed" in unheld
        assert not any(run in unheld for run in fine)

        approved = by_check.get("approved", [])
        assert len(approved) == 1 and approved[0].startswith(f"card {stale_card} approved at")
        assert fresh_card not in "\n".join(approved)

        inbox = by_check.get("inbox", [])
        assert len(inbox) == 2, inbox
        assert any("pending at 'stuck-consumer', delivered 1 times" in line for line in inbox)
        assert any(f"entry {undelivered} " in line and "never delivered" in line for line in inbox)

        # A Redis that does not answer: a violation while the system runs, skipped at teardown.
        gone = Scope(database_url, tenant, redis_url="redis://127.0.0.1:1/0", prefix=prefix)
        assert any(v.startswith("inbox: Redis at") for v in await check(gone))
        assert not any(v.startswith("inbox:") for v in await check(gone, require_redis=False))
    finally:
        await db.execute("DELETE FROM threads WHERE tenant = $1", tenant)
        await db.execute("DELETE FROM workers WHERE id LIKE $1", f"%-{tenant}")
        await r.delete(keys.inbox)
        await r.aclose()
        await db.close()
