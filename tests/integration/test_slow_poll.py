"""The worker's slow poll (runtime/worker.py) finds decisions whose signal was lost.

At each tick it reads only the approved cards of runs it holds (constant however many
runs are parked); every ``POLL_FULL_EVERY``-th tick it re-reads every parked card, in
chunks, for the decisions that are not approvals. Before, every tick sent every parked
card id to Postgres: ~0.3-0.7 s of Postgres per tick and worker at 100k parked runs.
"""

from __future__ import annotations

import asyncio

import pytest

from signoff.runtime import poller as worker_module
from signoff.runtime.cards import Decision, Status
from signoff.runtime.decisions import Resolution
from signoff.runtime.records import RunStatus
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, one_card, pix
from tests.integration.test_wake_spans import elsewhere, executed, wakes

pytestmark = pytest.mark.anyio


async def lost(
    h: Harness, card_id: str, decision: Decision, snapshot_hash: str, user: str = "alice"
) -> None:
    """A decision committed by a gateway whose signal reaches no worker."""
    await elsewhere(h).resolve(
        card_id,
        Resolution(decision=decision, snapshot_hash=snapshot_hash, reason="no"),
        principal=user,
        channel="test",
    )


async def test_an_approval_whose_signal_was_lost_is_found_at_the_next_tick(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        await lost(h, card.id, Decision.APPROVE, card.snapshot_hash)
        assert h.worker.waits.is_parked(card.id)  # nothing told the worker
        assert await h.store.approved_held(h.worker.worker_id) == {card.id: card.run_id}
        await h.worker.poll(tick=1)  # not a full re-read
        await asyncio.sleep(0)  # the future's done callback
        assert not h.worker.waits.is_parked(card.id)  # woken by this tick
        await executed(h, card.id)
        assert await h.store.approved_held(h.worker.worker_id) == {}


async def test_a_rejection_whose_signal_was_lost_waits_for_the_full_reread(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        await lost(h, card.id, Decision.REJECT, card.snapshot_hash)
        for tick in range(1, worker_module.POLL_FULL_EVERY):
            await h.worker.poll(tick)
        assert h.worker.waits.is_parked(card.id)  # approvals-only ticks do not see it
        await h.worker.poll(worker_module.POLL_FULL_EVERY)
        deadline = asyncio.get_running_loop().time() + 10
        while h.worker.waits.is_parked(card.id):
            assert asyncio.get_running_loop().time() < deadline, "the run was not woken"
            await asyncio.sleep(0.02)
        assert (await h.store.get_card(card.id)).status is Status.REJECTED


async def test_an_edit_whose_signal_was_lost_then_an_approval_is_found_at_the_next_tick(
    database_url: str,
) -> None:
    """The run never parked on the card the edit proposed: the poll wakes it by its run
    (before, only the full re-read of the old card, then 'modified', woke it)."""
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        edited = await elsewhere(h).resolve(
            card.id,
            Resolution(
                decision=Decision.EDIT, snapshot_hash=card.snapshot_hash, edits={"amount": "90"}
            ),
            principal="alice",
            channel="test",
        )
        new = edited.new_card
        assert new is not None
        await lost(h, new["id"], Decision.APPROVE, new["snapshot_hash"])
        assert h.worker.waits.is_parked(card.id) and not h.worker.waits.is_parked(new["id"])
        await h.worker.poll(tick=1)
        await asyncio.sleep(0)  # the future's done callback
        assert not h.worker.waits.is_parked(card.id)  # woken by this tick, not a later one
        await executed(h, new["id"])
        assert (await h.store.get_card(card.id)).status is Status.MODIFIED


async def test_an_approval_lost_beside_a_pending_card_runs_at_the_next_tick_and_once(
    database_url: str,
) -> None:
    """Two cards, one approved (its signal lost), one still pending: the approved one
    does not wait for its sibling (design note 60), so the next tick finds it and runs it;
    once it ran, the run waiting on the other card is not woken at every tick again."""
    async with harness(database_url, model=Scripted(pix(), pix("90"))) as h:
        thread = await h.thread("alice")
        await h.say(thread, "cobre os dois", "alice")
        first, second = sorted(await h.store.pending_cards(thread), key=lambda c: c.created_at)
        await lost(h, first.id, Decision.APPROVE, first.snapshot_hash)
        assert await h.store.approved_held(h.worker.worker_id) == {first.id: first.run_id}
        assert first.id in [c.id for c, _, _ in await h.store.approved_stale(0.0)]
        await h.worker.poll(tick=1)
        await executed(h, first.id)
        await h.settle()
        assert await h.charges() == 1
        assert (await h.store.get_card(second.id)).status is Status.PENDING
        assert h.worker.waits.is_parked(second.id)
        # Nothing approved is left: the ticks that follow do not wake the run.
        assert await h.store.approved_held(h.worker.worker_id) == {}
        mark = h.worker.waits.woken.spans.count
        for tick in range(1, 4):
            await h.worker.poll(tick)
        await h.settle()
        assert [p for p, _ in wakes(h, mark) if p == "poll"] == []
        await h.decide(second, Decision.REJECT)
        await h.settle()
        assert (await h.store.get_card(second.id)).status is Status.REJECTED
        assert (await h.store.get_run(first.run_id)).status is RunStatus.DONE
        assert await h.charges() == 1


async def test_approved_cards_of_another_workers_runs_are_not_read(database_url: str) -> None:
    async with (
        harness(database_url, model=Scripted(pix()), worker_id="poll-a") as a,
        harness(database_url, model=Scripted(pix()), worker_id="poll-b") as b,
    ):
        card = await one_card(a)
        await lost(a, card.id, Decision.APPROVE, card.snapshot_hash)
        assert await b.store.approved_held("poll-b") == {}
        assert await a.store.approved_held("poll-a") == {card.id: card.run_id}
        await b.worker.poll(tick=1)
        assert a.worker.waits.is_parked(card.id)  # b neither took nor woke a's run
        await a.worker.poll(tick=1)
        await executed(a, card.id)


async def test_the_full_reread_goes_in_chunks(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "RECHECK_CHUNK", 2)
    async with harness(database_url, model=Scripted(pix(), pix(), pix(), pix(), pix())) as h:
        cards = [await one_card(h, f"user{i}") for i in range(5)]
        for card in cards:
            await lost(h, card.id, Decision.REJECT, card.snapshot_hash, card.owner)
        sizes: list[int] = []
        decided_among = h.store.decided_among

        async def counted(card_ids: list[str]) -> dict[str, str]:
            sizes.append(len(card_ids))
            return await decided_among(card_ids)

        monkeypatch.setattr(h.store, "decided_among", counted)
        parked = len(h.worker.waits.parked_cards())  # ours, and any run it adopted here
        assert parked >= 5
        await h.worker.poll(0)  # a full re-read
        assert max(sizes) == 2 and sum(sizes) == parked and len(sizes) == (parked + 1) // 2
        deadline = asyncio.get_running_loop().time() + 10
        while any(h.worker.waits.is_parked(c.id) for c in cards):
            assert asyncio.get_running_loop().time() < deadline, "a run was not woken"
            await asyncio.sleep(0.02)
