"""Processes killed at precise steps (fault points armed with SIGNOFF_FAULTS), duplicated
inbox deliveries, and two workers recovering the same runs at once.

Cases already covered in tests/e2e/test_pools.py (not repeated here): a worker killed
with 100 parked runs (``test_kill9_worker_holding_100_parked_runs``), SIGTERM drain
(``test_sigterm_drains_to_the_other_worker``), an inbox entry of a worker killed before
its ack (``test_inbox_entry_of_dead_worker_is_redone_without_duplicate_card``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from signoff.demo.provider import Provider
from tests.cluster import Cluster, Proc, cluster
from tests.faults.conftest import Invariants, Profile
from tests.faults.helpers import (
    approve,
    bearer,
    count,
    inbox_drained,
    pending,
    quiescent,
    runs_done,
    start_threads,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


async def tool_results(db: asyncpg.Connection, tenant: str) -> list[str]:
    """The tenant's `tool_results` log entries, as text."""
    rows = await db.fetch(
        "SELECT m.body::text AS body FROM messages m JOIN runs r ON r.id = m.run_id "
        "WHERE r.tenant = $1 AND m.kind = 'tool_results'",
        tenant,
    )
    return [r["body"] for r in rows]


async def charge_keys(db: asyncpg.Connection, tenant: str) -> list[str]:
    """The idempotency key of each of the tenant's demo charges."""
    rows = await db.fetch("SELECT idempotency_key FROM demo_charges WHERE tenant = $1", tenant)
    return [r["idempotency_key"] for r in rows]


@contextlib.asynccontextmanager
async def a_card_on(
    database_url: str,
    redis_url: str,
    tmp_path: Path,
    invariants: Invariants,
    *,
    worker: str,
    user: str,
    **env: str,
) -> AsyncIterator[tuple[Cluster, Proc, asyncpg.Connection, asyncpg.Record, Proc]]:
    """One gateway and one worker (``worker``, with ``env``: its faults), a lease of 2 s
    and a sweep every 0.5 s; ``user``'s card pending on that worker. Yields the cluster,
    the gateway, a connection to the database, the card and the worker."""
    settings: dict[str, Any] = {"SIGNOFF_LEASE_SECONDS": "2", "SIGNOFF_SWEEP_SECONDS": "0.5"}
    settings.update((k, v) for k, v in env.items() if k != "SIGNOFF_FAULTS")
    with cluster(database_url, redis_url, tmp_path, gateways=1, workers=0, **settings) as c:
        invariants.watch_cluster(c)
        proc = c.add_worker(worker, SIGNOFF_FAULTS=env.get("SIGNOFF_FAULTS", ""))
        (gw,) = c.gateways
        db = await asyncpg.connect(database_url)
        try:
            await start_threads(c, gw.url, [user])
            (card,) = await wait_until(lambda: pending(db, c.tenant, 1), what="the card")
            yield c, gw, db, card, proc
        finally:
            await db.close()


@pytest.mark.slow  # 12-16 s: the default run leaves it to `pytest -m slow` (CI runs it)
async def test_worker_frozen_after_provider_accepted_then_thawed(
    database_url: str, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """I4: the worker is frozen (SIGSTOP: its host paused it) right after the provider
    accepted the charge, before `executed` was recorded; its lease lapses and another
    worker adopts the run, which finds the card `executing`, leaves it alone for a lease,
    then flags it and goes on without it (the model is told the outcome is unknown). Then the frozen worker is let go (SIGCONT): it
    records the outcome it knows (`executed`), its own continuation of the run is refused
    (the run is another's), and nothing is charged twice."""
    async with a_card_on(
        database_url,
        redis_url,
        tmp_path,
        invariants,
        worker="frozen",
        user="fz0",
        SIGNOFF_FAULTS="execute.after_provider=stop",
        SIGNOFF_TOOL_TIMEOUT_SECONDS="2",  # the adopter waits a lease + this
    ) as (c, gw, db, card, frozen):
        c.add_worker("survivor")
        assert await approve(c, gw.url, [card]) == [200]

        async def charged() -> bool:
            return (
                await count(db, "SELECT count(*) FROM demo_charges WHERE tenant = $1", c.tenant)
                == 1
            )

        await wait_until(charged, what="the charge (then the freeze)")
        await wait_until(lambda: runs_done(db, c.tenant, 1), what="the survivor's step")
        (told,) = await tool_results(db, c.tenant)
        assert "outcome is unknown" in told
        assert await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"]) == (
            "executing"
        )
        frozen.signal(signal.SIGCONT)

        async def recorded() -> bool:
            status = await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"])
            return bool(status == "executed")

        await wait_until(recorded, what="the thawed worker's outcome")
        await asyncio.sleep(1.0)  # its continuation, refused, has had time to try
        assert len(await tool_results(db, c.tenant)) == 1
        assert await charge_keys(db, c.tenant) == [card["operation_id"]]
        moves = await db.fetch(
            "SELECT to_status FROM card_events WHERE card_id = $1 ORDER BY id", card["id"]
        )
        assert [m["to_status"] for m in moves] == [
            "pending",
            "approved",
            "executing",
            "executing",  # flagged by the survivor before it told its model (note 49)
            "executed",
        ]
        flag = await db.fetchrow(
            "SELECT actor, detail FROM card_events WHERE card_id = $1 ORDER BY id OFFSET 3 LIMIT 1",
            card["id"],
        )
        assert flag is not None and flag["actor"] == "worker:survivor"
        assert "needs_reconciliation" in flag["detail"]
        assert not await db.fetchval(  # the outcome recorded clears the flag
            "SELECT needs_reconciliation FROM cards WHERE id = $1", card["id"]
        )
        await invariants.check()


@pytest.mark.slow  # 12-16 s: the default run leaves it to `pytest -m slow` (CI runs it)
async def test_worker_frozen_after_starting_execution_calls_nothing_when_thawed(
    database_url: str, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """The integrity probe's F2: a worker frozen (SIGSTOP) after recording `executing` and
    before calling the provider; its run is adopted (the model told the outcome is
    unknown, so the person may ask again, or an operator finds no charge and reconciles
    the card `failed`). Let go, it called the provider with the card's key: a charge for a
    card everyone had given up on. It now calls nothing (it was held up past its lease)
    and records `failed`, saying nothing was sent."""
    async with a_card_on(
        database_url,
        redis_url,
        tmp_path,
        invariants,
        worker="frozen",
        user="fs0",
        SIGNOFF_FAULTS="execute.after_start=stop",
        SIGNOFF_TOOL_TIMEOUT_SECONDS="2",  # the adopter waits a lease + this
    ) as (c, gw, db, card, frozen):
        c.add_worker("survivor")
        assert await approve(c, gw.url, [card]) == [200]
        await wait_until(lambda: runs_done(db, c.tenant, 1), what="the survivor's step")
        (told,) = await tool_results(db, c.tenant)
        assert "outcome is unknown" in told
        frozen.signal(signal.SIGCONT)

        async def recorded() -> bool:
            status = await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"])
            return bool(status == "failed")

        await wait_until(recorded, what="the thawed worker's outcome")
        result = await db.fetchval("SELECT result FROM cards WHERE id = $1", card["id"])
        assert "not sent to the provider" in str(result), result
        await asyncio.sleep(1.0)  # a call would have been made by now
        assert await charge_keys(db, c.tenant) == []
        await invariants.check()


async def test_worker_frozen_after_starting_execution_and_thawed_soon_takes_its_run_back(
    database_url: str, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """The fault suite's Postgres restart, made exact: a worker held up after recording
    `executing` (here frozen; there cut off from Postgres) whose run another worker
    adopted. The adopter told its model at once that the outcome was unknown, so the
    first, back a moment later, could only record `failed`: an approval lost. The adopter
    now leaves the card alone for a lease; the first worker, back within it, takes its
    run back (``worker_fence``) and executes the card: one charge, `executed`, and the
    model told so, once (design note 49)."""
    async with a_card_on(
        database_url,
        redis_url,
        tmp_path,
        invariants,
        worker="frozen-soon",
        user="ft0",
        SIGNOFF_FAULTS="execute.after_start=stop",
    ) as (c, gw, db, card, frozen):
        c.add_worker("adopter")
        assert await approve(c, gw.url, [card]) == [200]

        async def adopted() -> bool:
            holder = await db.fetchval(
                "SELECT r.worker_id FROM runs r JOIN cards k ON k.run_id = r.id "
                "WHERE k.id = $1 AND k.status = 'executing'",
                card["id"],
            )
            return bool(holder == "adopter")

        await wait_until(adopted, what="the adoption of the frozen worker's run")
        frozen.signal(signal.SIGCONT)
        await wait_until(lambda: runs_done(db, c.tenant, 1), what="the run's end")
        status = await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"])
        assert status == "executed"
        assert await charge_keys(db, c.tenant) == [str(card["operation_id"])]
        (told,) = await tool_results(db, c.tenant)
        assert "outcome is unknown" not in told and "not sent" not in told, told
        holder = await db.fetchval(
            "SELECT worker_id FROM runs WHERE id = (SELECT run_id FROM cards WHERE id = $1)",
            card["id"],
        )
        assert holder == "frozen-soon"
        await invariants.check()


async def test_worker_killed_after_provider_accepted_before_recording(
    database_url: str, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """I4: the worker is SIGKILLed right after the provider accepted the charge and before
    `executed` was recorded. The run is adopted by another worker and continues, but the
    card is never executed again: it stays `executing`, is flagged for reconciliation after
    the stuck threshold, and the provider holds exactly one charge, under the card's
    operation_id — the key any later reconciliation re-sends (which adds no charge)."""
    async with a_card_on(
        database_url,
        redis_url,
        tmp_path,
        invariants,
        worker="doomed",
        user="cr0",
        SIGNOFF_FAULTS="execute.after_provider",
        SIGNOFF_TOOL_TIMEOUT_SECONDS="2",  # the adopter waits a lease + this
        SIGNOFF_STUCK_AFTER_SECONDS="1",
    ) as (c, gw, db, card, doomed):
        c.add_worker("survivor")
        assert await approve(c, gw.url, [card]) == [200]
        await asyncio.to_thread(doomed.wait, 30)
        assert doomed.popen is not None and doomed.popen.returncode == -signal.SIGKILL

        async def flagged() -> asyncpg.Record | None:
            row = await db.fetchrow(
                "SELECT status, needs_reconciliation FROM cards WHERE id = $1", card["id"]
            )
            return row if row is not None and row["needs_reconciliation"] else None

        row = await wait_until(flagged, what="the stuck card flagged")
        assert row is not None and row["status"] == "executing"
        await wait_until(lambda: runs_done(db, c.tenant, 1), what="the run continued")
        (told,) = await tool_results(db, c.tenant)
        assert "outcome is unknown" in told
        assert await charge_keys(db, c.tenant) == [card["operation_id"]]
        op = await db.fetchval(
            "SELECT status FROM operations WHERE operation_id = $1::uuid", card["operation_id"]
        )
        assert op == "started"
        # An operator reconciling re-sends the stored snapshot with the stored key.
        provider = await Provider.connect(database_url)
        try:
            snap = await db.fetchval(
                "SELECT args_snapshot::text FROM cards WHERE id = $1", card["id"]
            )
            args = json.loads(snap)
            await provider.create_charge(
                card["operation_id"], c.tenant, args["customer_id"], args["amount_cents"], ""
            )
        finally:
            await provider.close()
        assert await count(db, "SELECT count(*) FROM demo_charges WHERE tenant = $1", c.tenant) == 1
        await invariants.check()


async def test_gateway_killed_after_commit_before_publish(
    database_url: str, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """I6: a gateway is SIGKILLed after committing a decision and before publishing it.
    The person sees the connection drop; the decision is in Postgres with its audit row,
    the worker finds it on its slow poll and executes it once, and the person's retry on
    another gateway gets a typed 409 saying they already approved it."""
    with cluster(
        database_url,
        redis_url,
        tmp_path,
        gateways=1,
        workers=1,
        SIGNOFF_POLL_SECONDS="1",
    ) as c:
        invariants.watch_cluster(c)
        doomed = c.add_gateway(SIGNOFF_FAULTS="decide.before_publish")
        db = await asyncpg.connect(database_url)
        try:
            await start_threads(c, c.gateways[0].url, ["gk0"])
            (card,) = await wait_until(lambda: pending(db, c.tenant, 1), what="the card")
            body = {"decision": "approve", "snapshot_hash": card["snapshot_hash"]}
            async with httpx.AsyncClient(timeout=30) as http:
                with pytest.raises(httpx.TransportError):
                    await http.post(
                        f"{doomed.url}/v1/cards/{card['id']}/resolve",
                        json=body,
                        headers=bearer(c, "gk0"),
                    )
                await asyncio.to_thread(doomed.wait, 30)
                audit = await db.fetchrow(
                    "SELECT actor, hash_seen FROM card_events "
                    "WHERE card_id = $1 AND to_status = 'approved'",
                    card["id"],
                )
                assert audit is not None
                assert (audit["actor"], audit["hash_seen"]) == ("gk0", card["snapshot_hash"])
                await wait_until(lambda: runs_done(db, c.tenant, 1), timeout=15, what="done")
                r = await http.post(
                    f"{c.gateways[0].url}/v1/cards/{card['id']}/resolve",
                    json=body,
                    headers=bearer(c, "gk0"),
                )
                assert r.status_code == 409 and r.json()["error"] == "already_decided"
                assert r.json()["detail"]["decided_by"] == "gk0"
            await invariants.check()
        finally:
            await db.close()


async def test_duplicated_inbox_delivery_runs_once(
    database_url: str, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """I5: every user message is in the inbox three times (a gateway that retried XADD
    after losing the reply), and two workers take the copies concurrently: one run and one
    card per message, and one charge once approved."""
    with cluster(database_url, redis_url, tmp_path, gateways=1, workers=2) as c:
        invariants.watch_cluster(c)
        (gw,) = c.gateways
        db = await asyncpg.connect(database_url)
        r = aioredis.from_url(redis_url)
        try:
            n = 10
            users = [f"dup{i}" for i in range(n)]
            threads = []
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                for user in users:
                    resp = await http.post("/v1/threads", headers=bearer(c, user))
                    threads.append(resp.json()["thread"]["id"])
            for user, thread in zip(users, threads, strict=True):
                job = {
                    "thread_id": thread,
                    "text": "cobre 21 do João",
                    "user": user,
                    "tenant": c.tenant,
                    "channel": "http",
                    "message_id": str(uuid.uuid4()),
                }
                for _ in range(3):
                    await r.xadd(f"{c.prefix}inbox", {"job": json.dumps(job)})
            cards = await wait_until(lambda: pending(db, c.tenant, n), what="one card each")
            # Every copy taken, handled and acked, and no run still going: only then are
            # the counts final (a copy handled late would add its run after a quick look).
            await wait_until(
                lambda: quiescent(db, c), timeout=20, what="all 30 copies handled, runs parked"
            )
            assert await count(db, "SELECT count(*) FROM runs WHERE tenant = $1", c.tenant) == n
            assert await count(db, "SELECT count(*) FROM cards WHERE tenant = $1", c.tenant) == n
            users_logged = await count(
                db,
                "SELECT count(*) FROM messages m JOIN threads t ON t.id = m.thread_id "
                "WHERE t.tenant = $1 AND m.kind = 'user'",
                c.tenant,
            )
            assert users_logged == n
            assert await approve(c, gw.url, cards) == [200] * n
            await wait_until(lambda: runs_done(db, c.tenant, n), what="runs done")
            await invariants.check()
        finally:
            await r.aclose()
            await db.close()


async def test_two_workers_recovering_the_same_runs_at_once(
    database_url: str, redis_url: str, tmp_path: Path, profile: Profile, invariants: Invariants
) -> None:
    """I4 + I6: the worker holding the runs is killed; decisions land while nobody holds
    them; two new workers try to adopt the same lapsed runs at the same moment (the test
    holds the rows locked until both are trying). Each run is continued by one worker:
    one tool_results entry, one final answer, one execution per card."""
    n = profile.parked
    with cluster(
        database_url,
        redis_url,
        tmp_path,
        gateways=1,
        workers=0,
        SIGNOFF_LEASE_SECONDS="2",
        SIGNOFF_POLL_SECONDS="1",
        # the killed worker may die before acking an entry whose run it stored: the others
        # reclaim it after this (the default, 30 s, outlasts the waits below)
        SIGNOFF_CLAIM_IDLE_MS="1000",
    ) as c:
        invariants.watch_cluster(c)
        first = c.add_worker("first")
        (gw,) = c.gateways
        db = await asyncpg.connect(database_url)
        try:
            await start_threads(c, gw.url, [f"tw{i}" for i in range(n)])
            cards = await wait_until(lambda: pending(db, c.tenant, n), what="parked cards")
            # Its entries acked too (the ack follows the park): an entry it still held would
            # be claimed only after SIGNOFF_CLAIM_IDLE_MS (30 s), past the waits below.
            await wait_until(lambda: inbox_drained(c), what="the first worker's acks")
            first.signal(signal.SIGKILL)
            await asyncio.to_thread(first.wait)
            assert await approve(c, gw.url, cards) == [200] * n

            async def lapsed() -> bool:
                return bool(
                    await db.fetchval("SELECT lease_until < now() FROM workers WHERE id = 'first'")
                )

            await wait_until(lapsed, timeout=10, what="the killed worker's lease lapsed")
            holder = await asyncpg.connect(database_url)
            tx = holder.transaction()
            await tx.start()
            await holder.execute(
                "SELECT id FROM runs WHERE tenant = $1 AND status = 'waiting' FOR UPDATE",
                c.tenant,
            )
            starting = [asyncio.to_thread(c.add_worker, name) for name in ("second", "third")]
            started = asyncio.gather(*starting)
            await asyncio.sleep(3.0)  # both are up (or blocked) and trying to adopt
            await tx.rollback()
            await holder.close()
            await started
            await wait_until(lambda: runs_done(db, c.tenant, n), timeout=60, what="runs done")
            # A done run takes no more writes (every step is fenced on an active run held
            # by the writer), so once nothing is left to do the counts below are final.
            await wait_until(lambda: quiescent(db, c), timeout=20, what="nothing left to do")
            rows = await db.fetch(
                "SELECT r.id::text, r.worker_id, "
                "count(*) FILTER (WHERE m.kind = 'tool_results') AS results, "
                "count(*) FILTER (WHERE m.kind = 'run') AS ends "
                "FROM runs r JOIN messages m ON m.run_id = r.id "
                "WHERE r.tenant = $1 GROUP BY r.id, r.worker_id",
                c.tenant,
            )
            assert len(rows) == n
            for row in rows:
                assert (row["results"], row["ends"]) == (1, 1), dict(row)
            assert {row["worker_id"] for row in rows} <= {"second", "third"}
            executed = await count(
                db, "SELECT count(*) FROM cards WHERE tenant = $1 AND status = 'executed'", c.tenant
            )
            assert executed == n
            await invariants.check()
        finally:
            await db.close()


@pytest.mark.slow  # ~15 s: the default run leaves it to `pytest -m slow` (CI runs it)
async def test_worker_killed_during_the_drains_wait_for_a_provider_call(
    database_url: str, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """A SIGTERM'd worker waits for its provider call past the drain (runtime/drain.py),
    holding the card's run (its lease renewed); its host then loses patience and
    SIGKILLs it (a grace period shorter than the deploy files'). The run is adopted once
    the lease lapses; the card, `executing` with an unknown outcome, is never started
    again: it is flagged, the model told the outcome is unknown, and at most the one
    charge the provider may have taken exists, under the card's operation id (I4)."""
    with cluster(
        database_url,
        redis_url,
        tmp_path,
        gateways=1,
        workers=0,
        SIGNOFF_LEASE_SECONDS="2",
        SIGNOFF_TOOL_TIMEOUT_SECONDS="8",  # the drain would wait up to 8 + 5 s
        SIGNOFF_SWEEP_SECONDS="0.5",
    ) as c:
        invariants.watch_cluster(c)
        doomed = c.add_worker("doomed")
        (gw,) = c.gateways
        db = await asyncpg.connect(database_url)
        lock = await asyncpg.connect(database_url)
        try:
            await start_threads(c, gw.url, ["dr0"])
            (card,) = await wait_until(lambda: pending(db, c.tenant, 1), what="the card")
            c.add_worker("survivor")
            tx = lock.transaction()
            await tx.start()
            await lock.execute("LOCK TABLE demo_charges IN SHARE ROW EXCLUSIVE MODE")
            assert await approve(c, gw.url, [card]) == [200]

            async def blocked() -> bool:  # the provider call waits on the lock
                waiting = await db.fetchval(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class t ON t.oid = l.relation "
                    "WHERE t.relname = 'demo_charges' AND NOT l.granted"
                )
                return bool(waiting)

            await wait_until(blocked, what="the provider call in flight")
            doomed.signal(signal.SIGTERM)
            await asyncio.sleep(3.0)  # past the lease: the drain still waits, holding it
            assert doomed.alive()
            holder = "SELECT worker_id FROM runs WHERE id = $1::uuid"
            assert await db.fetchval(holder, card["run_id"]) == "doomed"
            doomed.signal(signal.SIGKILL)
            await asyncio.to_thread(doomed.wait, 30)
            await tx.rollback()

            async def flagged() -> bool:
                return bool(
                    await db.fetchval(
                        "SELECT needs_reconciliation FROM cards WHERE id = $1", card["id"]
                    )
                )

            await wait_until(flagged, timeout=60, what="the card flagged")
            await wait_until(lambda: runs_done(db, c.tenant, 1), what="the run continued")
            assert await db.fetchval(holder, card["run_id"]) in (None, "survivor")
            (told,) = await tool_results(db, c.tenant)
            assert "outcome is unknown" in told
            assert await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"]) == (
                "executing"
            )
            assert set(await charge_keys(db, c.tenant)) <= {card["operation_id"]}
            await invariants.check()
        finally:
            await lock.close()
            await db.close()
