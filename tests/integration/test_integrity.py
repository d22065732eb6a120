"""Issue 10's store and worker causes, each pinned by a test that goes red without its fix:
one lock order (thread, run, cards), approved cards never orphaned, a run that raises is
settled, the audit names who really moved a card (real Postgres)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.errors import SignoffError
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.models.base import ModelReply
from signoff.runtime.records import RunStatus
from tests import pgbouncer
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = pytest.mark.anyio


async def decided(h: Harness, card: Card, decision: Decision = Decision.APPROVE) -> Card:
    """Decide in the store only: no signal reaches the worker (as when it is lost)."""
    moved = await h.store.decide(
        card.id,
        principal=card.owner,
        decision=decision,
        snapshot_hash=card.snapshot_hash,
        channel="test",
    )
    return moved.card


async def blocked_behind_thread_lock(
    h: Harness, thread_id: str, write: Callable[[], Awaitable[Any]], row_sql: str, row_id: str
) -> None:
    """Hold the thread's lock in another session, start ``write``, and check that while it
    waits it holds no lock on the row it is about to change (``row_sql ... NOWAIT``)."""
    dsn = h.settings.database_url
    assert dsn is not None
    holder = await pgbouncer.connect(dsn)
    probe = await pgbouncer.connect(dsn)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM threads WHERE id = $1 FOR NO KEY UPDATE", thread_id)
        holder_pid = await holder.fetchval("SELECT pg_backend_pid()")
        task = asyncio.ensure_future(write())
        # Until the write is queued behind our lock (not merely not started yet): only
        # then does the probe below say which rows it took before waiting.
        deadline = asyncio.get_running_loop().time() + 10
        while not await probe.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
            holder_pid,
        ):
            assert not task.done(), "the write did not wait for the thread's lock"
            assert asyncio.get_running_loop().time() < deadline, "the write never blocked"
            await asyncio.sleep(0.02)
        async with probe.transaction():
            # Raises LockNotAvailableError if the waiting write already locked the row:
            # the order card/run -> thread that deadlocks against start_run.
            await probe.execute(row_sql + " FOR NO KEY UPDATE NOWAIT", row_id)
        await tx.rollback()
        await asyncio.wait_for(task, 10)
    finally:
        await holder.close()
        await probe.close()


async def test_a_decision_locks_the_thread_before_the_card(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix()), start_worker=False) as h:
        card = await one_card(h)
        await blocked_behind_thread_lock(
            h,
            card.thread_id,
            lambda: decided(h, card),
            "SELECT 1 FROM cards WHERE id = $1",
            card.id,
        )
        assert (await h.store.get_card(card.id)).status is Status.APPROVED


async def test_a_card_move_locks_the_thread_before_the_card(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix()), start_worker=False) as h:
        card = await one_card(h)
        await decided(h, card)
        await blocked_behind_thread_lock(
            h,
            card.thread_id,
            lambda: h.store.begin_execution(card.id, "worker:test"),
            "SELECT 1 FROM cards WHERE id = $1",
            card.id,
        )
        assert (await h.store.get_card(card.id)).status is Status.EXECUTING


async def test_starting_a_card_for_its_runs_holder_locks_the_thread_first(
    database_url: str,
) -> None:
    """`card_begin_execution` with the run's holder reads the run: a lock on it taken
    before the thread's deadlocked against `start_run` (a new message superseding the run
    while an approval started executing; found by a review)."""
    async with harness(database_url, model=Scripted(pix()), start_worker=False) as h:
        card = await one_card(h)
        await decided(h, card)
        holder = await h.store.db.fetchval("SELECT worker_id FROM runs WHERE id = $1", card.run_id)
        await blocked_behind_thread_lock(
            h,
            card.thread_id,
            lambda: h.store.begin_execution(card.id, f"worker:{holder}", holder),
            "SELECT 1 FROM runs WHERE id = $1",
            card.run_id,
        )
        assert (await h.store.get_card(card.id)).status is Status.EXECUTING


@pytest.mark.parametrize("row", ["card", "run"])
async def test_the_execution_fence_locks_the_thread_first(database_url: str, row: str) -> None:
    """`worker_fence` locks the card (to see a flag or reconcile committed while it
    waited) and takes the run: both after the thread. Its first version locked the card
    in a sub-select Postgres ran before the thread's lock, which deadlocked against an
    adopter flagging the card (found by a review, reproduced with two sessions)."""
    async with harness(database_url, model=Scripted(pix()), start_worker=False) as h:
        card = await one_card(h)
        await h.store.db.execute("UPDATE cards SET status = 'executing' WHERE id = $1", card.id)
        await blocked_behind_thread_lock(
            h,
            card.thread_id,
            lambda: h.store.execution_fence(card.id, "back-from-a-pause", 5.0),
            f"SELECT 1 FROM {row}s WHERE id = $1",
            card.id if row == "card" else card.run_id,
        )
        holder = await h.store.db.fetchval("SELECT worker_id FROM runs WHERE id = $1", card.run_id)
        assert holder == "back-from-a-pause"


async def test_flagging_a_card_executing_elsewhere_locks_the_thread_first(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix()), start_worker=False) as h:
        card = await one_card(h)
        await h.store.db.execute("UPDATE cards SET status = 'executing' WHERE id = $1", card.id)
        holder = await h.store.db.fetchval("SELECT worker_id FROM runs WHERE id = $1", card.run_id)
        for row, row_id in (("cards", card.id), ("runs", card.run_id)):
            await h.store.db.execute(
                "UPDATE cards SET needs_reconciliation = false WHERE id = $1", card.id
            )
            await blocked_behind_thread_lock(
                h,
                card.thread_id,
                lambda: h.store.flag_elsewhere(card.run_id, holder, [card.id]),
                f"SELECT 1 FROM {row} WHERE id = $1",
                row_id,
            )
        assert (await h.store.get_card(card.id)).needs_reconciliation


async def test_a_run_step_locks_the_thread_before_the_run(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix()), start_worker=False) as h:
        card = await one_card(h)
        run = await h.store.get_run(card.run_id)
        await blocked_behind_thread_lock(
            h,
            card.thread_id,
            lambda: h.store.run_step(
                run.id,
                run.thread_id,
                [("run", {"status": "done", "error": None})],
                "done",
                {},
                holder=h.worker.worker_id,
            ),
            "SELECT 1 FROM runs WHERE id = $1",
            run.id,
        )
        assert (await h.store.get_run(run.id)).status is RunStatus.DONE


async def test_approve_racing_a_new_message_never_deadlocks(database_url: str) -> None:
    """Approve and a new message on the same thread, 40 rounds at once: no driver error
    escapes, and every approved card ends executed or invalidated (never left approved)."""
    async with harness(database_url, model=Scripted(pix())) as h:
        errors: list[BaseException] = []
        cards: list[Card] = []
        for i in range(40):
            card = await one_card(h, user=f"racer{i % 4}")
            cards.append(card)
            results = await asyncio.gather(
                h.decide(card, Decision.APPROVE),
                h.say(card.thread_id, "e agora?", card.owner),
                return_exceptions=True,
            )
            errors += [
                r
                for r in results
                if isinstance(r, BaseException) and not isinstance(r, SignoffError)
            ]
        await h.settle()
        assert errors == []
        await h.worker.sweep()
        await h.settle()
        finals = [await h.store.get_card(c.id) for c in cards]
        assert {c.status for c in finals} <= {
            Status.EXECUTED,
            Status.INVALIDATED,
            Status.SUPERSEDED,
        }
        executed = sum(c.status is Status.EXECUTED for c in finals)
        assert await h.charges() == executed


async def test_an_approved_card_of_a_superseded_run_is_invalidated_with_it(
    database_url: str,
) -> None:
    """The approve commits just before a new message supersedes the run: the card is
    invalidated in the superseding transaction, by system:supersede, with the reason."""
    async with harness(database_url, model=Scripted(pix()), start_worker=False) as h:
        card = await one_card(h)
        await decided(h, card)  # the worker is not told: it cannot start it first
        await h.say(card.thread_id, "outra coisa", card.owner)
        final = await h.store.get_card(card.id)
        assert final.status is Status.INVALIDATED
        assert final.result is not None and "nothing was executed" in final.result["reason"]["en"]
        last = (await h.store.card_events(card.id))[-1]
        assert (last.from_status, last.to_status, last.actor) == (
            "approved",
            "invalidated",
            "system:supersede",
        )
        assert await h.charges() == 0


async def test_superseded_and_expired_cards_name_the_system_in_the_audit(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix()), start_worker=False) as h:
        first = await one_card(h)
        await h.say(first.thread_id, "esquece", first.owner)
        superseded = await h.store.get_card(first.id)
        assert superseded.status is Status.SUPERSEDED
        assert superseded.decided_by == "system:supersede"
        assert (await h.store.card_events(first.id))[-1].actor == "system:supersede"

        second = await one_card(h, user="bob")
        await h.store.pool.execute(
            "UPDATE cards SET expires_at = now() - interval '1 ms' WHERE id = $1", second.id
        )
        await h.worker.sweep()
        expired = await h.store.get_card(second.id)
        assert expired.status is Status.EXPIRED
        assert expired.decided_by == "system:expiry"
        assert (await h.store.card_events(second.id))[-1].actor == "system:expiry"


async def test_the_sweeper_invalidates_an_approved_card_whose_run_is_over(
    database_url: str,
) -> None:
    settings = Settings(approved_stale_seconds=0.1)
    async with harness(
        database_url, model=Scripted(pix()), start_worker=False, settings=settings
    ) as h:
        card = await one_card(h)
        await decided(h, card)
        # The run ended some other way (failed, done) while the card sat approved.
        await h.store.pool.execute("UPDATE runs SET status = 'failed' WHERE id = $1", card.run_id)
        await asyncio.sleep(0.2)
        # (the sweeper looks at every tenant: other tests' cards may be in the list)
        (moved,) = [c for c in await h.worker.sweep_approved() if c.id == card.id]
        assert moved.status is Status.INVALIDATED
        last = (await h.store.card_events(card.id))[-1]
        assert (last.to_status, last.actor) == ("invalidated", "system:sweeper")
        assert await h.charges() == 0


async def test_the_sweeper_wakes_the_run_of_an_approved_card_nobody_started(
    database_url: str,
) -> None:
    """The signal of an approval was lost and the slow poll has not run: the sweeper
    sees the card approved past approved_stale_seconds and the run goes on."""
    settings = Settings(approved_stale_seconds=0.1)
    async with harness(
        database_url, model=Scripted(pix()), start_worker=False, settings=settings
    ) as h:
        card = await one_card(h)
        await decided(h, card)
        await asyncio.sleep(0.2)
        assert card.id not in {c.id for c in await h.worker.sweep_approved()}
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.EXECUTED
        assert await h.charges() == 1


async def test_the_sweeper_racing_the_start_of_an_execution_one_of_them_wins(
    database_url: str,
) -> None:
    """The sweeper invalidating an approved card of an ended run and a worker starting
    that card's execution at the same instant: one conditional move wins, never both
    (no card both invalidated and executing, one audit row, at most one operation)."""
    settings = Settings(approved_stale_seconds=0.05)
    async with harness(
        database_url, model=Scripted(pix()), start_worker=False, settings=settings
    ) as h:
        outcomes: set[str] = set()
        for _ in range(12):
            card = await one_card(h)
            await decided(h, card)
            await h.store.pool.execute(
                "UPDATE runs SET status = 'failed' WHERE id = $1::uuid", card.run_id
            )
            await asyncio.sleep(0.06)
            swept, began = await asyncio.gather(
                h.worker.sweep_approved(), h.store.begin_execution(card.id, "worker:test")
            )
            mine = [c for c in swept if c.id == card.id]
            assert (began is None) == bool(mine), (began, mine)
            final = await h.store.get_card(card.id)
            assert final.status is (Status.INVALIDATED if mine else Status.EXECUTING)
            outcomes.add(str(final.status))
            trail = [e.to_status for e in await h.store.card_events(card.id)]
            assert trail == ["pending", "approved", str(final.status)], trail
            ops = await h.store.pool.fetchval(
                "SELECT count(*) FROM operations WHERE card_id = $1::uuid", card.id
            )
            assert ops == (0 if mine else 1)


async def test_the_sweeper_signals_a_stale_approved_card_at_most_once_per_interval(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under a backlog many approved cards wait longer than approved_stale_seconds: each
    sweep must not signal every one of them again (more load on a saturated pool)."""
    settings = Settings(approved_stale_seconds=0.5)
    async with harness(
        database_url, model=Scripted(pix()), start_worker=False, settings=settings
    ) as h:
        card = await one_card(h)
        await decided(h, card)
        # Its holder is elsewhere and never starts it (the run stays active).
        h.worker.waits.drop_run(card.run_id)
        await h.store.pool.execute(
            "UPDATE runs SET worker_id = 'ghost' WHERE id = $1::uuid", card.run_id
        )
        await asyncio.sleep(0.6)

        def signalled() -> int:
            return COUNTERS.values["signoff_approved_stale_total"]

        before = signalled()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="signoff"):
            await h.worker.sweep_approved()
        mine = signalled() - before
        assert mine >= 1  # this card (other tests' stale cards may count too)
        # One line a sweep, by holder (after a worker died: hundreds of lines, one a card).
        (line,) = [r.getMessage() for r in caplog.records if "not started after" in r.message]
        assert "ghost ×1" in line
        await h.worker.sweep_approved()
        await h.worker.sweep_approved()
        assert card.id in h.worker.sweeper.signalled_again
        again = signalled() - before - mine
        assert again == 0, "signalled again within the interval"
        await asyncio.sleep(0.6)
        await h.worker.sweep_approved()
        assert signalled() - before - mine >= 1  # and again once the interval passed
        assert (await h.store.get_card(card.id)).status is Status.APPROVED


class Exploding:
    """A model whose call raises something no layer expects."""

    name = "exploding"

    async def respond(self, *, system, messages, tools, on_text=None):  # type: ignore[no-untyped-def]
        raise OverflowError("int too large to convert to float")


async def test_a_step_that_raises_settles_its_run_as_failed(database_url: str) -> None:
    async with harness(database_url, model=Exploding(), start_worker=False) as h:
        thread = await h.thread("alice")
        run = await h.say(thread, "cobre 10 do João", "alice")
        assert run is not None and run.status is RunStatus.FAILED
        assert run.error == "internal error (OverflowError)"
        (entry,) = [e for e in await h.store.entries_after(thread, 0) if e.kind == "run"]
        assert entry.body == {"status": "failed", "error": "internal error (OverflowError)"}


class ExplodingOnResume:
    """Proposes a charge, then raises when shown the result (a continuation that raises)."""

    name = "exploding-on-resume"

    async def respond(self, *, system, messages, tools, on_text=None):  # type: ignore[no-untyped-def]
        last = messages[-1]["content"]
        if any(b.get("type") == "tool_result" for b in last):
            raise RuntimeError("boom")
        use = {"type": "tool_use", "id": "toolu_1", **pix()}
        return ModelReply(content=[use], stop_reason="tool_use")


async def test_a_continuation_that_raises_settles_its_run_as_failed(database_url: str) -> None:
    async with harness(database_url, model=ExplodingOnResume()) as h:
        card = await one_card(h)
        await h.decide(card, Decision.APPROVE)
        for _ in range(100):
            run = await h.store.get_run(card.run_id)
            if run.status is RunStatus.FAILED:
                break
            await asyncio.sleep(0.1)
        assert run.status is RunStatus.FAILED, run
        assert run.error == "internal error (RuntimeError)"
        # the approved card itself ran once: its outcome is known and recorded
        assert (await h.store.get_card(card.id)).status is Status.EXECUTED
        assert await h.charges() == 1
        assert card.run_id not in h.worker.waits.parked_runs()


async def test_an_inbox_message_whose_step_raises_is_settled_and_acked(
    database_url: str,
) -> None:
    """Through the Redis inbox: the run ends failed with its error entry, and the entry
    leaves the stream's pending list at once (not ten minutes later, nor never)."""
    import secrets

    import redis.asyncio as aioredis

    from signoff.runtime.bus import Job
    from signoff.runtime.bus.redis import RedisBus
    from signoff.runtime.keys import Keys
    from tests import services

    keys = Keys(f"so-int-{secrets.token_hex(4)}:")
    bus = RedisBus.from_url(services.redis_url(), keys, claim_idle_ms=60_000)
    admin = aioredis.Redis.from_url(services.redis_url())
    try:
        async with harness(database_url, model=Exploding(), bus=bus) as h:
            thread = await h.thread("alice")
            job = Job(
                thread_id=thread,
                text="cobre 10 do João",
                user="alice",
                tenant=h.tenant,
                role="user",
                channel="http",
                message_id="m-" + secrets.token_hex(4),
            )
            await bus.enqueue(job)
            run_id = h.worker.agent.run_id_for(job.message_id)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while True:
                pending = await admin.xpending(keys.inbox, keys.inbox_group)
                done = False
                try:
                    done = (await h.store.get_run(run_id)).status is RunStatus.FAILED
                except SignoffError:
                    pass
                if done and pending["pending"] == 0:
                    break
                assert loop.time() < deadline, (pending, done)
                await asyncio.sleep(0.05)
            assert await admin.xlen(keys.inbox) == 0
    finally:
        doomed = [k async for k in admin.scan_iter(match=f"{keys.prefix}*")]
        if doomed:
            await admin.delete(*doomed)
        await admin.aclose()
