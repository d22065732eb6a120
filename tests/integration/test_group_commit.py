"""Group commit of decisions (store/group.py, lever ``group-commit``): decisions that
arrive while the deciding statements are busy are written by one statement; each person
still gets exactly the answer of their own decision (real Postgres)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import pytest

from signoff.embedded import free_port
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.decisions import Decisions, Resolution
from signoff.runtime.errors import AlreadyDecided, NotOwner, SignoffError, StaleCard
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS
from signoff.store.group import GroupCommit
from signoff.store.queries import SQL
from tests import pgbouncer
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, pix

pytestmark = pytest.mark.anyio


async def cards_on_threads(h: Harness, threads: int, user: str = "alice") -> list[Card]:
    """Two pending cards on each of ``threads`` threads (the model asks for two charges)."""
    out: list[Card] = []
    for _ in range(threads):
        thread = await h.thread(user)
        await h.say(thread, "duas cobranças", user)
        out.extend(await h.store.pending_cards(thread))
    return out


def one_slot(h: Harness) -> GroupCommit:
    """The store's deciding statements with one slot, so that concurrent decisions queue."""
    cards = h.store.cards
    group = GroupCommit(cards._db, single=cards._decide_one, batch=SQL.card_decide_batch, slots=1)
    cards._decide = group
    return group


async def decide(h: Harness, card: Card, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "principal": "alice",
        "decision": Decision.APPROVE,
        "snapshot_hash": card.snapshot_hash,
        "channel": "test",
        "tenant": h.tenant,
    }
    args.update(kw)
    return await h.store.decide(card.id, **args)


async def test_concurrent_decisions_share_statements_and_each_gets_its_own_row(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        cards = await cards_on_threads(h, 12)
        one_slot(h)
        before = COUNTERS.values["signoff_group_commit_transitions_total"]
        moved = await asyncio.gather(
            *(decide(h, c, decision=Decision.APPROVE if i % 3 else Decision.REJECT)
              for i, c in enumerate(cards))
        )  # fmt: skip
        batched = COUNTERS.values["signoff_group_commit_transitions_total"] - before
        assert batched >= len(cards) // 2  # most went in shared statements
        for i, (card, m) in enumerate(zip(cards, moved, strict=True)):
            assert m.card.id == card.id
            assert m.card.status is (Status.APPROVED if i % 3 else Status.REJECTED)
            assert m.entry.kind == "card_update" and m.entry.body["id"] == card.id
            assert m.entry.body["status"] == str(m.card.status)
            # (an approved card may have run since: it does not wait for its sibling)
            assert (await h.trail(card))[:2] == ["pending", str(m.card.status)]
        # Each thread's log: one entry per decision, seqs unique and gap-free in the log.
        for thread in {c.thread_id for c in cards}:
            log = await h.store.entries_after(thread, 0)
            seqs = [e.seq for e in log]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            updates = [  # the decisions' (an approved card may have run since)
                e
                for e in log
                if e.kind == "card_update" and e.body["status"] in ("approved", "rejected")
            ]
            assert Counter(e.body["id"] for e in updates) == Counter(
                c.id for c in cards if c.thread_id == thread
            )
            assert {m.entry.seq for m in moved if m.card.thread_id == thread} == {
                e.seq for e in updates
            }


async def test_refusals_in_a_batch_are_each_persons_own_and_change_nothing(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        cards = await cards_on_threads(h, 4)
        one_slot(h)
        good, stale, stranger, twice, *rest = cards
        results = await asyncio.gather(
            decide(h, good),
            decide(h, stale, snapshot_hash="0" * 64),
            decide(h, stranger, principal="mallory"),
            decide(h, twice),
            decide(h, twice, decision=Decision.REJECT),  # the same card twice: one wins
            *(decide(h, c) for c in rest),
            return_exceptions=True,
        )
        assert not isinstance(results[0], BaseException)
        assert results[0].card.status is Status.APPROVED
        assert isinstance(results[1], StaleCard)
        assert isinstance(results[2], NotOwner)
        won = [r for r in results[3:5] if not isinstance(r, BaseException)]
        lost = [r for r in results[3:5] if isinstance(r, BaseException)]
        assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], AlreadyDecided)
        assert all(not isinstance(r, BaseException) for r in results[5:])
        for card in (stale, stranger):
            assert (await h.card(card)).status is Status.PENDING
            assert await h.trail(card) == ["pending"]
        assert (await h.trail(twice))[:2] == ["pending", str(won[0].card.status)]


async def test_a_batch_that_fails_as_a_whole_runs_each_decision_alone(database_url: str) -> None:
    """One person's value that Postgres refuses (a NUL in the reason) fails the shared
    statement: every decision of the batch is then run on its own, and only that one is
    refused."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        cards = await cards_on_threads(h, 4)
        group = one_slot(h)
        before = COUNTERS.values["signoff_group_commit_fallbacks_total"]
        blocker = asyncio.create_task(decide(h, cards[0]))  # takes the one slot
        await asyncio.sleep(0)
        rest = [decide(h, c, reason="bad\x00reason" if i == 2 else "ok") for i, c in
                enumerate(cards[1:])]  # fmt: skip
        results = await asyncio.gather(*rest, return_exceptions=True)
        await blocker
        assert COUNTERS.values["signoff_group_commit_fallbacks_total"] - before >= 1
        assert isinstance(results[2], SignoffError)
        assert (await h.card(cards[3])).status is Status.PENDING
        for i, r in enumerate(results):
            if i != 2:
                assert not isinstance(r, BaseException), r
                assert r.card.reason == "ok"
        assert group._busy == 0 and not group._queue


class Holder:
    """A session holding a thread's row lock, and a second one watching who waits for it.

    The watcher is outside any transaction: Postgres keeps one snapshot of
    ``pg_stat_activity`` for a whole transaction, so polling it from the holder's own
    transaction would see the moment of its first look forever. Waiters are found by
    ``pg_blocking_pids``: only statements blocked by this holder, never another test's."""

    def __init__(self, holder: asyncpg.Connection, watcher: asyncpg.Connection) -> None:
        self.holder = holder
        self.watcher = watcher
        self.pid = 0
        self.killed: set[int] = set()  # a terminated backend may linger in the view

    async def lock(self, thread_id: str) -> None:
        await self.holder.execute("BEGIN")
        await self.holder.execute("SELECT 1 FROM threads WHERE id = $1::uuid FOR UPDATE", thread_id)
        # Inside the transaction: behind PgBouncer's transaction pooling, the server
        # session is this client's only until it ends.
        self.pid = await self.holder.fetchval("SELECT pg_backend_pid()")

    async def release(self) -> None:
        await self.holder.execute("ROLLBACK")

    async def blocked(self) -> list[int]:
        rows = await self.watcher.fetch(
            "SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", self.pid
        )
        return [r["pid"] for r in rows if r["pid"] not in self.killed]

    async def waiting(self, n: int = 1) -> list[int]:
        """Until ``n`` statements wait for this holder's lock (10 s at most)."""
        for _ in range(500):
            pids = await self.blocked()
            if len(pids) >= n:
                return pids
            await asyncio.sleep(0.02)
        raise AssertionError(f"no {n} statement(s) waiting for the held thread")

    async def kill_waiting(self) -> int:
        """Terminate the backends waiting for this holder's lock; how many."""
        killed = 0
        for pid in await self.blocked():
            killed += bool(await self.watcher.fetchval("SELECT pg_terminate_backend($1)", pid))
            self.killed.add(pid)
        return killed

    async def close(self) -> None:
        await self.holder.close()
        await self.watcher.close()


async def holder(database_url: str) -> Holder:
    return Holder(await pgbouncer.connect(database_url), await pgbouncer.connect(database_url))


async def queued(group: GroupCommit, n: int) -> None:
    for _ in range(500):
        if len(group._queue) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(group._queue)} decisions queued, not {n}")


async def test_a_slow_thread_holds_its_batch_then_it_commits_whole(database_url: str) -> None:
    """Postgres slow: a card's thread is locked by another session; the batch holding that
    card waits for it (threads are locked in id order, then cards: the one lock order)
    and then commits every decision in it."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        cards = await cards_on_threads(h, 3)
        group = one_slot(h)
        held = await holder(database_url)
        try:
            await held.lock(cards[0].thread_id)
            first = asyncio.create_task(decide(h, cards[0]))  # holds the one slot, blocked
            await held.waiting()
            batch = asyncio.gather(*(decide(h, c) for c in cards[1:]))
            await queued(group, len(cards) - 1)
            await asyncio.sleep(0.2)
            assert not first.done() and not batch.done()
            await held.release()
            moved = [await first, *await batch]
            assert [m.card.status for m in moved] == [Status.APPROVED] * len(cards)
            for card in cards:  # (an approved card may have run since)
                assert (await h.trail(card))[:2] == ["pending", "approved"]
        finally:
            await held.close()


async def test_a_batch_killed_mid_statement_writes_nothing_then_each_runs_alone(
    database_url: str,
) -> None:
    """The process (here: the backend) killed mid-statement: the batch's transaction is
    gone whole, nothing of it written; its decisions are then run one by one, so each is
    taken once, and the caller whose own statement was killed hears a typed error."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        cards = await cards_on_threads(h, 4)
        group = one_slot(h)
        held = await holder(database_url)
        try:
            await held.lock(cards[0].thread_id)
            first = asyncio.create_task(decide(h, cards[0]))  # the slot, blocked
            await held.waiting()
            rest = asyncio.gather(
                *(decide(h, c) for c in (cards[2], cards[4], cards[1], cards[6])),
                return_exceptions=True,
            )
            await queued(group, 4)
            assert await held.kill_waiting() == 1  # the lone statement of cards[0]
            with pytest.raises(SignoffError):
                await first
            await held.waiting()  # the batch has started and waits for cards[1]'s thread
            for card in cards[1:7:2] + cards[2:7:2]:
                assert await h.trail(card) == ["pending"]  # nothing half written
            assert await held.kill_waiting() == 1  # the batch statement itself
            await held.release()
            results = await rest
            assert all(not isinstance(r, BaseException) for r in results), results
            for card in (cards[2], cards[4], cards[1], cards[6]):
                assert (await h.trail(card))[:2] == ["pending", "approved"]
            assert await h.trail(cards[0]) == ["pending"]
        finally:
            await held.close()


async def test_batched_decisions_commit_and_answer_with_redis_down(database_url: str) -> None:
    """Redis is only told after the commit: with it unreachable, decisions that share a
    statement are all taken and each person answered; the lost hints are counted, and
    the worker's poll finds the decisions in Postgres (I6)."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        cards = await cards_on_threads(h, 4)
        one_slot(h)
        keys = Keys(h.settings.key_prefix)
        dead = RedisBus.from_url(f"redis://127.0.0.1:{free_port()}/0", keys)
        decisions = Decisions(
            store=h.store, bus=dead, tools=h.app.tools, policy=h.app.policy, keys=keys
        )
        before = COUNTERS.values["signoff_group_commit_transitions_total"]
        failed = COUNTERS.values["signoff_hints_failed_total"]
        try:
            outcomes = await asyncio.gather(
                *(
                    decisions.resolve(
                        c.id,
                        Resolution(decision=Decision.APPROVE, snapshot_hash=c.snapshot_hash),
                        principal="alice",
                        channel="test",
                        tenant=h.tenant,
                    )
                    for c in cards
                )
            )
        finally:
            await dead.close()
        assert [o.card["status"] for o in outcomes] == ["approved"] * len(cards)
        assert COUNTERS.values["signoff_group_commit_transitions_total"] > before
        assert COUNTERS.values["signoff_hints_failed_total"] > failed
        for card in cards:  # decided once; the worker's poll may already be executing it
            trail = await h.trail(card)
            assert trail[:2] == ["pending", "approved"] and trail.count("approved") == 1
            assert trail.count("executing") <= 1
