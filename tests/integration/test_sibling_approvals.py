"""An approved card runs on its approval, whether or not its siblings are decided
(runtime/approved.py, design note 60). It used to wait for every card of its step,
and a new message sent meanwhile invalidated it: the person's approval was lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from signoff.runtime import handover
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Resolution
from signoff.runtime.errors import SignoffError, Unavailable
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.records import RunStatus
from signoff.runtime.tools import ToolContext
from signoff.runtime.worker import Worker
from tests.conftest import migrated_database
from tests.harness import Harness, harness
from tests.integration.test_app_versions import new_version_worker, old_version_worker
from tests.integration.test_decisions import Scripted, _Patched, one_card, pix
from tests.integration.test_slow_poll import lost

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """A database of this module's own: a worker adopts any lapsed run in its database,
    and the adoption case leaves one."""
    yield from migrated_database("so_siblings")


async def two_cards(h: Harness, user: str = "alice") -> tuple[str, Card, Card]:
    thread = await h.thread(user)
    await h.say(thread, "cobre os dois", user)
    first, second = sorted(await h.store.pending_cards(thread), key=lambda c: c.tool_use_id)
    return thread, first, second


def results_told(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The tool results the model was shown, by tool_use id."""
    return {
        b["tool_use_id"]: b
        for m in messages
        if m["role"] == "user"
        for b in m["content"]
        if b.get("type") == "tool_result"
    }


async def operations(h: Harness, card_id: str) -> int:
    value = await h.provider.pool.fetchval(
        "SELECT count(*) FROM operations WHERE card_id = $1::uuid", card_id
    )
    return int(value)


async def test_an_approved_card_runs_at_once_and_a_new_message_keeps_it(
    database_url: str,
) -> None:
    model = Scripted(pix("10"), pix("20", "Maria"))
    async with harness(database_url, model=model) as h:
        thread, first, second = await two_cards(h)
        done = await h.approve(first)
        assert done.status is Status.EXECUTED  # not waiting for its sibling
        assert await h.charges() == 1
        assert (await h.card(second)).status is Status.PENDING
        assert (await h.store.get_run(first.run_id)).status is RunStatus.WAITING
        assert h.worker.waits.is_parked(second.id)
        assert model.calls == 1  # the model hears of it once every card is decided
        # The person writes again before deciding the second card: it is superseded,
        # the approved one stays executed, and the new run's model is told both truths.
        await h.say(thread, "e o saldo?", "alice")
        await h.settle()
        assert (await h.card(first)).status is Status.EXECUTED
        assert (await h.card(second)).status is Status.SUPERSEDED
        assert (await h.store.get_run(first.run_id)).status is RunStatus.SUPERSEDED
        assert await h.charges() == 1 and await operations(h, first.id) == 1
        told = results_told(model.seen[-1])
        ran, dropped = told[first.tool_use_id], told[second.tool_use_id]
        assert ran["content"].startswith("Executed: the user approved this") and not ran["is_error"]
        assert "Not completed" in dropped["content"] and dropped["is_error"]


async def test_the_run_goes_on_once_every_card_is_decided_and_runs_nothing_twice(
    database_url: str,
) -> None:
    model = Scripted(pix("10"), pix("20", "Maria"))
    async with harness(database_url, model=model) as h:
        _, first, second = await two_cards(h)
        await h.approve(first)
        assert await h.charges() == 1
        assert (await h.approve(second)).status is Status.EXECUTED
        assert (await h.store.get_run(first.run_id)).status is RunStatus.DONE
        assert await h.charges() == 2
        assert [await operations(h, c.id) for c in (first, second)] == [1, 1]
        assert model.calls == 2
        told = results_told(model.seen[-1])
        for card in (first, second):
            assert '"executed"' in told[card.tool_use_id]["content"]


async def test_approvals_racing_in_one_run_execute_each_once_and_tell_the_model_once(
    database_url: str,
) -> None:
    """Both cards approved at once, one through this worker's bus and one through a
    gateway whose signal reaches nobody (the slow poll finds it): each runs once, and
    the model is told both outcomes in one continuation."""
    model = Scripted(pix("10"), pix("20", "Maria"))
    async with harness(database_url, model=model) as h:
        runs = [await two_cards(h, f"u{i}") for i in range(4)]
        calls = model.calls
        await asyncio.gather(
            *(
                job
                for _, first, second in runs
                for job in (
                    h.decide(first, Decision.APPROVE),
                    lost(h, second.id, Decision.APPROVE, second.snapshot_hash, second.owner),
                )
            )
        )
        for tick in range(1, 4):
            await h.worker.poll(tick)
            await h.settle()
        assert await h.charges() == 8
        for thread, first, second in runs:
            assert [(await h.card(c)).status for c in (first, second)] == [Status.EXECUTED] * 2
            assert [await operations(h, c.id) for c in (first, second)] == [1, 1]
            assert (await h.store.get_run(first.run_id)).status is RunStatus.DONE
            told = [e for e in await h.store.conversation(thread) if e.kind == "tool_results"]
            assert len(told) == 1 and len(told[0].body["content"]) == 2
        assert model.calls == calls + 4


async def test_an_approval_racing_a_new_message_runs_or_is_invalidated_never_lost_silently(
    database_url: str,
) -> None:
    """Whichever takes the thread's lock first wins (design notes 16, 17): the card ran
    (and stays executed), or it was superseded or invalidated before anything ran."""
    model = Scripted(pix("10"), pix("20", "Maria"))
    async with harness(database_url, model=model) as h:
        for i in range(6):
            thread, first, second = await two_cards(h, f"r{i}")
            decided, _ = await asyncio.gather(
                h.decide(first, Decision.APPROVE),
                h.say(thread, "outra coisa", f"r{i}"),
                return_exceptions=True,
            )
            assert not isinstance(decided, BaseException) or isinstance(decided, SignoffError)
            await h.settle()
            status = (await h.card(first)).status
            assert status in (Status.EXECUTED, Status.INVALIDATED, Status.SUPERSEDED)
            assert await operations(h, first.id) == (status is Status.EXECUTED)
            assert (await h.card(second)).status is Status.SUPERSEDED
            assert await operations(h, second.id) == 0


async def test_an_executed_card_is_not_run_again_by_the_worker_that_adopts_its_run(
    database_url: str,
) -> None:
    """The worker dies after running the approved card, its sibling still pending (what
    it held in memory, the park, is gone); the sibling is approved while nobody holds the
    run; the adopter runs the sibling only and tells the model both outcomes."""
    fast = Settings(lease_seconds=1.0)
    async with harness(
        database_url, model=Scripted(pix("10"), pix("20", "Maria")), settings=fast, leave_runs=True
    ) as a:
        _, first, second = await two_cards(a)
        assert (await a.approve(first)).status is Status.EXECUTED
        await a.worker.stop(drain=False, release=False)
        await lost(a, second.id, Decision.APPROVE, second.snapshot_hash)
        tenant = a.tenant
    model = Scripted(pix("10"), pix("20", "Maria"))
    async with harness(database_url, model=model, settings=fast) as b:
        deadline = asyncio.get_running_loop().time() + 15
        while (await b.store.get_run(first.run_id)).status is not RunStatus.DONE:
            assert asyncio.get_running_loop().time() < deadline, "the run was not adopted"
            await asyncio.sleep(0.1)
        assert (await b.card(second)).status is Status.EXECUTED
        assert [await operations(b, c.id) for c in (first, second)] == [1, 1]
        charges = await b.provider.pool.fetchval(
            "SELECT count(*) FROM demo_charges WHERE tenant = $1", tenant
        )
        assert charges == 2
        assert model.calls == 1
        told = results_told(model.seen[0])
        assert all('"executed"' in told[c.tool_use_id]["content"] for c in (first, second))


async def moved_in_order(h: Harness, cards: list[Card], status: str) -> list[str]:
    """The cards' ids in the order they entered ``status`` (audit ids are a sequence)."""
    first: dict[str, int] = {}
    for card in cards:
        for event in await h.events(card):
            if event.to_status == status:
                first[card.id] = event.id
    return sorted(first, key=first.__getitem__)


async def test_a_batch_is_decided_in_the_models_order_and_runs_each_card_once(
    database_url: str,
) -> None:
    """A batch listing the cards in another order than the model's is decided in the
    model's, and the worker is told once all are committed; the answers still come in
    the request's order, and every card runs once."""
    model = Scripted(pix("10"), pix("20", "Maria"), pix("30", "Ana"))
    async with harness(database_url, model=model) as h:
        for i in range(3):
            thread = await h.thread(f"b{i}")
            await h.say(thread, "cobre os três", f"b{i}")
            cards = sorted(await h.store.pending_cards(thread), key=lambda c: c.tool_use_id)
            asked = [cards[2], cards[0], cards[1]]
            answers = await h.decisions.resolve_batch(
                cards[0].run_id,
                [
                    (c.id, Resolution(decision=Decision.APPROVE, snapshot_hash=c.snapshot_hash))
                    for c in asked
                ],
                principal=f"b{i}",
                channel="test",
            )
            assert [a["card_id"] for a in answers] == [c.id for c in asked]
            assert all(a["ok"] for a in answers)
            await h.settle()
            assert await moved_in_order(h, cards, "approved") == [c.id for c in cards]
            assert [await operations(h, c.id) for c in cards] == [1, 1, 1]
        assert await h.charges() == 9


async def test_cards_approved_together_do_not_wait_for_one_that_hangs(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second hostile probe: one continuation ran the cards it claimed one after the
    other, so a batch's refund waited 65 s behind a charge whose provider call hung (a
    locked table), and a message sent meanwhile invalidated it. Each runs on its own."""
    model = Scripted(pix("10"), pix("20", "Maria"), pix("30", "Ana"))
    async with harness(database_url, model=model) as h:
        thread = await h.thread("alice")
        await h.say(thread, "cobre os três", "alice")
        first, second, third = sorted(
            await h.store.pending_cards(thread), key=lambda c: c.tool_use_id
        )
        held = Held(h, monkeypatch, snapshot=first.args_snapshot)
        await h.decisions.resolve_batch(
            first.run_id,
            [
                (c.id, Resolution(decision=Decision.APPROVE, snapshot_hash=c.snapshot_hash))
                for c in (first, second)
            ],
            principal="alice",
            channel="test",
        )
        await asyncio.wait_for(held.entered.wait(), 10)
        deadline = asyncio.get_running_loop().time() + 10
        while (await h.card(second)).status is not Status.EXECUTED:
            assert asyncio.get_running_loop().time() < deadline, "it waited for the first"
            await asyncio.sleep(0.05)
        await h.say(thread, "e o saldo?", "alice")
        held.release.set()
        await h.settle()
        assert [(await h.card(c)).status for c in (first, second, third)] == [
            Status.EXECUTED,
            Status.EXECUTED,
            Status.SUPERSEDED,
        ]
        assert await h.charges() == 2


async def test_an_approved_card_of_a_tool_not_served_here_waits_for_its_sibling_quietly(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker of another app version holds the run: an approved card it cannot run
    does not make it hand the run over (nor retry and log) while a sibling is pending;
    nothing of the run runs here, and once every card is decided the run is handed to
    a worker that serves the tool (design note 21), which runs the approved card."""
    monkeypatch.setattr(handover, "RETRY_SECONDS", 0.2)
    monkeypatch.setattr(handover, "RETRY_MAX_SECONDS", 0.5)
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        _, first, second = await two_cards(h)
        settings = h.settings.with_(lease_seconds=1.0)
        await h.worker.stop()  # hands the parked run back (holder NULL)
        old = old_version_worker(h, settings)
        new: Worker | None = None
        handed = COUNTERS.values["signoff_runs_handed_over_total"]
        try:
            await old.start()  # adopts the run, parks on both cards
            await until_parked(old, second.id)
            await h.decide(first, Decision.APPROVE)
            await asyncio.sleep(1.0)
            run = await h.store.get_run(first.run_id)
            assert run.holder == old.worker_id and run.status is RunStatus.WAITING
            assert (await h.card(first)).status is Status.APPROVED
            assert COUNTERS.values["signoff_runs_handed_over_total"] == handed
            assert old.waits.is_parked(second.id) and await h.charges() == 0
            # Nor does its slow poll wake the run for that card at every tick.
            served = [t.name for t in old.app.tools]
            assert await h.store.approved_held(old.worker_id, tools=served) == {}
            mark = old.waits.woken.spans.count
            for tick in range(1, 4):
                await old.poll(tick)
            await asyncio.sleep(0.2)
            assert [p for _, p, _ in old.waits.woken.spans.after(mark) if p == "poll"] == []
            new = await new_version_worker(h, settings)
            await h.decide(second, Decision.REJECT)
            deadline = asyncio.get_running_loop().time() + 15
            while (await h.card(first)).status is not Status.EXECUTED:
                assert asyncio.get_running_loop().time() < deadline, "not executed"
                await asyncio.sleep(0.1)
            assert await h.charges() == 1
        finally:
            await old.stop()
            if new is not None:
                await new.stop()
                await h.store.leave_app(new.worker_id)


async def test_an_approved_card_blocked_by_another_versions_sibling_is_not_polled_for_nothing(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Last stop's note: a run held by a worker of another app version, with a card
    pending, one approved of a tool it lacks and one approved of its own, was woken by
    every poll tick (every 5 s) for nothing: the approved card it serves cannot start
    while the run is to be handed over whole. The tick leaves it be, and re-reads the
    pending sibling instead, so that sibling's lost decision is still found at once."""
    monkeypatch.setattr(handover, "RETRY_SECONDS", 0.2)
    monkeypatch.setattr(handover, "RETRY_MAX_SECONDS", 0.5)
    refund: dict[str, object] = {"name": "refund_sale", "input": {"sale_id": "V001"}}
    other: dict[str, object] = {"name": "refund_sale", "input": {"sale_id": "V002"}}
    async with harness(database_url, model=Scripted(pix("10"), refund, other)) as h:
        thread = await h.thread("alice")
        await h.say(thread, "faz os três", "alice")
        unserved, served, pending = sorted(
            await h.store.pending_cards(thread), key=lambda c: c.tool_use_id
        )
        settings = h.settings.with_(lease_seconds=1.0)
        await h.worker.stop()  # hands the parked run back (holder NULL)
        old = old_version_worker(h, settings)
        new: Worker | None = None
        try:
            await old.start()  # adopts the run, parks on its cards
            await until_parked(old, pending.id)
            for card in (unserved, served):
                await h.decide(card, Decision.APPROVE)
            await asyncio.sleep(0.5)
            assert (await h.card(served)).status is Status.APPROVED  # blocked, as designed
            mark = old.waits.woken.spans.count
            for tick in range(1, 4):
                await old.poll(tick)
            await asyncio.sleep(0.2)
            assert [p for _, p, _ in old.waits.woken.spans.after(mark) if p == "poll"] == []
            new = await new_version_worker(h, settings)
            await lost(h, pending.id, Decision.REJECT, pending.snapshot_hash)
            await old.poll(4)  # not a full re-read: the blocked run's sibling is read
            await asyncio.sleep(0)  # the future's done callback
            assert not old.waits.is_parked(pending.id)  # woken by this tick
            deadline = asyncio.get_running_loop().time() + 15
            while (await h.card(unserved)).status is not Status.EXECUTED:
                assert asyncio.get_running_loop().time() < deadline, "not executed"
                await asyncio.sleep(0.1)
            await h.settle()
            assert (await h.card(served)).status is Status.EXECUTED
            assert await operations(h, unserved.id) == 1 and await operations(h, served.id) == 1
            await old.poll(5)  # the run is no longer held here: forgotten
            assert old.agent.approved.blocked == {}
        finally:
            await old.stop()
            if new is not None:
                await new.stop()
                await h.store.leave_app(new.worker_id)


async def until_parked(worker: Worker, card_id: str) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while not worker.waits.is_parked(card_id):
        assert asyncio.get_running_loop().time() < deadline, "the run was not parked"
        await asyncio.sleep(0.05)


class Held:
    """The demo's Pix charge held inside the provider call until released (only the
    charge of the card with this ``snapshot`` when given)."""

    def __init__(self, h: Harness, monkeypatch: pytest.MonkeyPatch, snapshot: Any = None) -> None:
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        self.real = tool.execute
        self.snapshot = snapshot
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        monkeypatch.setattr(tool, "execute", self.execute)  # the demo's tools are shared

    async def execute(self, snapshot: Any, operation_id: str, ctx: Any) -> Any:
        if self.snapshot is None or snapshot == self.snapshot:
            self.entered.set()
            await self.release.wait()
        return await self.real(snapshot, operation_id, ctx)


class HeldCheck:
    """The demo's Pix charge held inside its revalidation until released."""

    def __init__(self, h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        self.tool, self.real = tool, tool.revalidate
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        monkeypatch.setattr(tool, "revalidate", self.revalidate)

    async def revalidate(self, args: Any, ctx: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return await self.real(args, ctx)


async def test_an_approved_card_does_not_wait_for_a_siblings_slow_provider_call(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile probe: with the first card's provider call hanging, the second card,
    approved meanwhile, waited for it (its continuation queued on the run's lock), and a
    message sent then invalidated it. It runs at once now, in its own continuation."""
    model = Scripted(pix("10"), pix("20", "Maria"))
    async with harness(database_url, model=model) as h:
        thread, first, second = await two_cards(h)
        held = Held(h, monkeypatch, snapshot=first.args_snapshot)
        await h.decide(first, Decision.APPROVE)
        await asyncio.wait_for(held.entered.wait(), 10)
        await h.decide(second, Decision.APPROVE)
        deadline = asyncio.get_running_loop().time() + 10
        while (await h.card(second)).status is not Status.EXECUTED:
            assert asyncio.get_running_loop().time() < deadline, "the second card waited"
            await asyncio.sleep(0.05)
        assert (await h.card(first)).status is Status.EXECUTING
        await h.say(thread, "e o saldo?", "alice")  # the run is superseded meanwhile
        held.release.set()
        await h.settle()
        assert [(await h.card(c)).status for c in (first, second)] == [Status.EXECUTED] * 2
        assert [await operations(h, c.id) for c in (first, second)] == [1, 1]
        assert await h.charges() == 2
        told = results_told(model.seen[-1])
        assert told[second.tool_use_id]["content"].startswith("Executed")


async def test_a_sibling_decided_while_the_approved_card_runs_resumes_the_run(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Scripted(pix("10"), pix("20", "Maria"))
    async with harness(database_url, model=model) as h:
        _, first, second = await two_cards(h)
        held = Held(h, monkeypatch)
        await h.decide(first, Decision.APPROVE)
        await asyncio.wait_for(held.entered.wait(), 10)
        await h.decide(second, Decision.REJECT)  # while the provider has the first
        held.release.set()
        await h.settle()
        assert (await h.card(first)).status is Status.EXECUTED
        assert (await h.store.get_run(first.run_id)).status is RunStatus.DONE
        assert model.calls == 2 and await h.charges() == 1
        told = results_told(model.seen[-1])
        assert '"executed"' in told[first.tool_use_id]["content"]
        assert "REJECTED" in told[second.tool_use_id]["content"]


async def test_a_run_superseded_while_its_approved_card_runs_leaves_no_wait_behind(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's finding: the continuation parked again on the sibling after the run
    was superseded, writing its wait token back after the supersede had deleted it."""
    model = Scripted(pix("10"), pix("20", "Maria"))
    async with harness(database_url, model=model) as h:
        thread, first, second = await two_cards(h)
        held = Held(h, monkeypatch)
        await h.decide(first, Decision.APPROVE)
        await asyncio.wait_for(held.entered.wait(), 10)
        await h.say(thread, "outra coisa", "alice")
        assert (await h.card(second)).status is Status.SUPERSEDED
        held.release.set()
        await h.settle()
        assert (await h.card(first)).status is Status.EXECUTED
        assert await h.bus.wait_holder(second.id) is None
        assert not h.worker.waits.is_parked(second.id)
        assert await h.charges() == 1


async def test_a_store_outage_after_the_early_card_ran_is_tried_again_and_runs_it_once(
    database_url: str,
) -> None:
    """The re-read after the approved card ran finds Postgres away (a retriable
    ``Unavailable``): the continuation is tried again later (runtime/worker.py ``wake``),
    parks on the pending card, and nothing runs twice."""
    model = Scripted(pix("10"), pix("20", "Maria"))
    async with harness(database_url, model=model) as h:
        _, first, second = await two_cards(h)
        agent = h.worker.agent
        real = agent.store
        reads = {"n": 0}

        async def flaky(run_id: str) -> Any:
            reads["n"] += 1
            if reads["n"] == 2:  # the read again, once the claimed card ran
                raise Unavailable("postgres did not answer (test)")
            return await real.run_with_cards(run_id)

        agent.store = _Patched(real, run_with_cards=flaky)  # type: ignore[assignment]
        try:
            await h.decide(first, Decision.APPROVE)
            deadline = asyncio.get_running_loop().time() + 15
            while not (reads["n"] >= 3 and h.worker.waits.is_parked(second.id)):
                assert asyncio.get_running_loop().time() < deadline, "not parked again"
                await asyncio.sleep(0.05)
        finally:
            agent.store = real
        assert (await h.card(first)).status is Status.EXECUTED
        assert not agent.approved.busy(first.run_id)
        assert (await h.approve(second)).status is Status.EXECUTED
        assert (await h.store.get_run(first.run_id)).status is RunStatus.DONE
        assert [await operations(h, c.id) for c in (first, second)] == [1, 1]


async def test_a_run_nobody_holds_is_not_run_early_in_a_loop(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's repro: a run released (holder NULL: a graceful stop, a hand-over)
    continued directly (as an agent step does): its approved card could not start (only
    the run's holder starts one), came back `approved`, was claimed again, and the
    continuation revalidated it 1,079 times in 2 s without returning."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        _, first, _ = await two_cards(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        real, calls = tool.revalidate, {"n": 0}

        async def counting(args: Any, ctx: Any) -> Any:
            calls["n"] += 1
            return await real(args, ctx)

        monkeypatch.setattr(tool, "revalidate", counting)
        await h.store.pool.execute(
            "UPDATE runs SET worker_id = NULL WHERE id = $1::uuid", first.run_id
        )
        await lost(h, first.id, Decision.APPROVE, first.snapshot_hash)
        h.worker.waits.drop_run(first.run_id)
        await asyncio.wait_for(h.worker.agent.continue_run(first.run_id), 5)
        assert calls["n"] <= 1
        assert await operations(h, first.id) == 0


async def test_an_adopted_runs_sibling_approved_while_a_card_hangs_runs_at_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's repro: the adopter ran the dead worker's approved card without parking
    on its pending sibling first, so the sibling's approval was heard by nobody and
    waited for the hanging provider call (and a message sent then invalidated it)."""
    fast = Settings(lease_seconds=1.0)
    async with harness(
        database_url, model=Scripted(pix("10"), pix("20", "Maria")), settings=fast, leave_runs=True
    ) as a:
        _, first, second = await two_cards(a)
        await a.worker.stop(drain=False, release=False)
        await lost(a, first.id, Decision.APPROVE, first.snapshot_hash)
        held = Held(a, monkeypatch, snapshot=first.args_snapshot)  # the tools are shared
    async with harness(
        database_url, model=Scripted(pix("10"), pix("20", "Maria")), settings=fast
    ) as b:
        await asyncio.wait_for(held.entered.wait(), 15)  # adopted; its first card hangs
        assert b.worker.waits.is_parked(second.id)
        await b.decide(second, Decision.APPROVE)
        deadline = asyncio.get_running_loop().time() + 10
        while (await b.card(second)).status is not Status.EXECUTED:
            assert asyncio.get_running_loop().time() < deadline, "the sibling waited"
            await asyncio.sleep(0.05)
        held.release.set()
        deadline = asyncio.get_running_loop().time() + 10
        while (await b.store.get_run(first.run_id)).status is not RunStatus.DONE:
            assert asyncio.get_running_loop().time() < deadline, "the run did not go on"
            await asyncio.sleep(0.05)
        assert [await operations(b, c.id) for c in (first, second)] == [1, 1]


async def test_a_claim_ends_however_its_card_ends_and_the_run_goes_on(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first revalidation of the approved card fails for a moment (a retriable
    outcome: the continuation is tried again); the sibling is rejected meanwhile. A claim
    kept after that failure would leave the run waiting for ever on a card nobody runs."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        _, first, second = await two_cards(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        real, failed = tool.revalidate, asyncio.Event()

        async def once_down(args: Any, ctx: Any) -> Any:
            if not failed.is_set():
                failed.set()
                raise ConnectionError("the provider did not answer (test)")
            return await real(args, ctx)

        monkeypatch.setattr(tool, "revalidate", once_down)
        await h.decide(first, Decision.APPROVE)
        await asyncio.wait_for(failed.wait(), 10)
        await h.decide(second, Decision.REJECT)
        deadline = asyncio.get_running_loop().time() + 15
        while (await h.store.get_run(first.run_id)).status is not RunStatus.DONE:
            assert asyncio.get_running_loop().time() < deadline, "the run did not go on"
            await asyncio.sleep(0.05)
        assert (await h.card(first)).status is Status.EXECUTED
        assert not h.worker.agent.approved.busy(first.run_id)


async def test_two_continuations_of_one_run_start_its_approved_card_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two continuations of the run at once (a signal and the slow poll, say) while the
    card is still `approved` (its revalidation under way): the one that claimed it runs
    it; the other does not revalidate it again."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        _, first, _ = await two_cards(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        real, calls = tool.revalidate, {"n": 0}
        entered, release = asyncio.Event(), asyncio.Event()

        async def held(args: Any, ctx: Any) -> Any:
            calls["n"] += 1
            entered.set()
            await release.wait()
            return await real(args, ctx)

        monkeypatch.setattr(tool, "revalidate", held)
        await lost(h, first.id, Decision.APPROVE, first.snapshot_hash)
        agent = h.worker.agent
        one = asyncio.ensure_future(agent.continue_run(first.run_id))
        await asyncio.wait_for(entered.wait(), 10)
        assert (await h.card(first)).status is Status.APPROVED
        await asyncio.wait_for(agent.continue_run(first.run_id), 5)  # finds it claimed
        release.set()
        await one
        await h.settle()
        assert calls["n"] == 1 and await operations(h, first.id) == 1


async def test_a_stopping_worker_starts_no_approved_card(database_url: str) -> None:
    """A second hostile probe: a worker told to stop (SIGTERM) went on starting cards
    approved meanwhile, then cancelled their provider calls at the end of its drain.
    A stopping worker continues nothing: its runs are released to the others."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        _, first, _ = await two_cards(h)
        h.worker.agent.accepting = False  # what Worker.stop sets first
        await h.decide(first, Decision.APPROVE)
        await h.settle()
        assert (await h.card(first)).status is Status.APPROVED and await h.charges() == 0
        assert not h.worker.waits.is_parked(first.id)  # let go, for another worker
        h.worker.agent.accepting = True
        await h.worker.wake(first.run_id)  # what the worker adopting it does
        await h.settle()
        assert (await h.card(first)).status is Status.EXECUTED


async def test_a_provider_call_cut_by_a_stop_is_said_in_the_log(
    database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same probe: the calls cancelled at the end of the drain left cards
    `executing` (outcome unknown) without a word in the stopping worker's log."""
    async with harness(
        database_url, model=Scripted(pix("10"), pix("20", "Maria")), leave_runs=True
    ) as h:
        _, first, _ = await two_cards(h)
        held = Held(h, monkeypatch, snapshot=first.args_snapshot)
        await h.decide(first, Decision.APPROVE)
        await asyncio.wait_for(held.entered.wait(), 10)
        with caplog.at_level(logging.ERROR, logger="signoff.agent"):
            await h.worker.stop(drain=False)
        said = [r.getMessage() for r in caplog.records]
        assert any(f"card {first.id}: stopping while its provider call" in m for m in said)
        assert (await h.card(first)).status is Status.EXECUTING


async def test_a_card_another_process_ran_is_not_logged_as_executed_here(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same probe: a worker thawed after its run was adopted logged `card executed`
    for 13 cards the adopter had executed (a false alarm for a log-based check)."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        _, first, _ = await two_cards(h)
        assert (await h.approve(first)).status is Status.EXECUTED
        run = await h.store.get_run(first.run_id)
        stale = msgspec.structs.replace(first, status=Status.APPROVED)
        with caplog.at_level(logging.INFO, logger="signoff.agent"):
            done = await h.worker.agent.executor.execute(stale, ToolContext.of(run, h.provider))
        assert done.status is Status.EXECUTED
        assert not [r for r in caplog.records if r.getMessage() == "card executed"]
        assert await operations(h, first.id) == 1


async def test_an_approve_all_runs_its_cards_side_by_side(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's repro: a batch deciding every card of the run ("approve all") left none
    pending, so one continuation ran them one after the other under the run's lock: the
    second waited behind the first's hanging provider call, and a message sent meanwhile
    invalidated it. Several approved with none pending run each on their own too."""
    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        thread, first, second = await two_cards(h)
        held = Held(h, monkeypatch, snapshot=first.args_snapshot)
        await h.decisions.resolve_batch(
            first.run_id,
            [
                (c.id, Resolution(decision=Decision.APPROVE, snapshot_hash=c.snapshot_hash))
                for c in (first, second)
            ],
            principal="alice",
            channel="test",
        )
        await asyncio.wait_for(held.entered.wait(), 10)
        deadline = asyncio.get_running_loop().time() + 10
        while (await h.card(second)).status is not Status.EXECUTED:
            assert asyncio.get_running_loop().time() < deadline, "it waited for the first"
            await asyncio.sleep(0.05)
        await h.say(thread, "e o saldo?", "alice")  # supersedes the run: nothing is lost
        held.release.set()
        await h.settle()
        assert [(await h.card(c)).status for c in (first, second)] == [Status.EXECUTED] * 2
        assert await operations(h, first.id) == 1 and await operations(h, second.id) == 1


async def test_a_worker_stopped_and_started_again_continues_its_runs(database_url: str) -> None:
    """A review's repro: ``Worker.stop`` stops continuations and ``start`` did not let
    them go on again: an approval reached the restarted worker, which held the run and
    renewed its lease, so nobody else adopted it, and the card stayed approved."""
    async with harness(database_url, model=Scripted(pix("10"))) as h:
        thread = await h.thread("alice")
        await h.say(thread, "cobre", "alice")
        (card,) = await h.store.pending_cards(thread)
        await h.worker.stop()
        await h.worker.start()
        await h.decide(card, Decision.APPROVE)
        deadline = asyncio.get_running_loop().time() + 10
        while (await h.card(card)).status is not Status.EXECUTED:
            assert asyncio.get_running_loop().time() < deadline, "the approval was not run"
            await asyncio.sleep(0.05)
        await h.settle()
        assert (await h.store.get_run(card.run_id)).status is RunStatus.DONE


async def test_a_released_run_with_every_card_decided_calls_no_model(database_url: str) -> None:
    """A review's repro: a run nobody holds (a graceful stop, a hand-over) continued
    directly (as an agent step does) with every card decided: its card could not start
    here, yet the model was called, told "approved", and its reply streamed to the
    thread before the write was refused. The worker that adopts it goes on instead."""
    model = Scripted(pix("10"))
    async with harness(database_url, model=model) as h:
        thread = await h.thread("alice")
        await h.say(thread, "cobre", "alice")
        (card,) = await h.store.pending_cards(thread)
        await h.store.pool.execute(
            "UPDATE runs SET worker_id = NULL WHERE id = $1::uuid", card.run_id
        )
        await lost(h, card.id, Decision.APPROVE, card.snapshot_hash)
        h.worker.waits.drop_run(card.run_id)
        calls = model.calls
        run = await asyncio.wait_for(h.worker.agent.continue_run(card.run_id), 5)
        assert run is not None and run.status is RunStatus.WAITING and run.holder is None
        assert model.calls == calls and await operations(h, card.id) == 0


@pytest.mark.parametrize("sibling", [True, False])
async def test_a_card_whose_tool_lets_a_cancellation_out_is_tried_again(
    database_url: str, monkeypatch: pytest.MonkeyPatch, sibling: bool
) -> None:
    """A review: a card whose task ended cancelled (a tool letting a cancellation out of
    its revalidation) ended its continuation as if the worker were stopping, with no
    retry: the approval waited for the sweeper (a card claimed beside a pending sibling)
    or a restart (a card alone in its run, run inside the resume). It is tried again."""
    model = Scripted(pix("10"), pix("20", "Maria")) if sibling else Scripted(pix("10"))
    async with harness(database_url, model=model) as h:
        if sibling:
            _, first, second = await two_cards(h)
        else:
            first = await one_card(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        real, cancelled = tool.revalidate, asyncio.Event()

        async def leaks(args: Any, ctx: Any) -> Any:
            if not cancelled.is_set():
                cancelled.set()
                raise asyncio.CancelledError
            return await real(args, ctx)

        async def nothing(*_: Any) -> None:
            return None

        monkeypatch.setattr(tool, "revalidate", leaks)
        monkeypatch.setattr(h.worker, "poll", nothing)  # only a retry can run it now
        monkeypatch.setattr(h.worker, "sweep", nothing)
        await h.decide(first, Decision.APPROVE)
        await asyncio.wait_for(cancelled.wait(), 10)
        deadline = asyncio.get_running_loop().time() + 5
        while (await h.card(first)).status is not Status.EXECUTED:
            assert asyncio.get_running_loop().time() < deadline, "it was not tried again"
            await asyncio.sleep(0.05)
        if sibling:
            assert (await h.card(second)).status is Status.PENDING
        assert await operations(h, first.id) == 1


async def approved_beside_executing(h: Harness, first: Card, second: Card) -> None:
    """Both cards approved, and the first started by another process (its run's previous
    holder, which may be back: design note 49)."""
    for card in (first, second):
        await h.store.decide(
            card.id,
            principal=card.owner,
            decision=Decision.APPROVE,
            snapshot_hash=card.snapshot_hash,
            channel="test",
        )
    await h.store.db.execute(
        "UPDATE cards SET status = 'executing', executing_since = now() WHERE id = $1",
        first.id,
    )


async def test_an_approved_card_beside_one_executing_elsewhere_runs_at_once(
    database_url: str,
) -> None:
    """A card found `executing` (its run's previous holder started it and may be back:
    design note 49) is left for a lease and a tool deadline; its approved sibling waited
    that long too (about 70 s in a hostile probe), and a message sent meanwhile
    invalidated it. It runs at once; the run goes on once the other is settled."""
    from signoff.runtime.errors import ExecutingElsewhere

    async with harness(
        database_url, model=Scripted(pix("10"), pix("20", "Maria")), start_worker=False
    ) as h:
        _, first, second = await two_cards(h)
        h.worker.agent.executor.lease = h.worker.lease  # what Worker.start sets
        await approved_beside_executing(h, first, second)
        with pytest.raises(ExecutingElsewhere):
            await h.worker.agent.continue_run(first.run_id)
        assert (await h.card(second)).status is Status.EXECUTED
        assert await operations(h, second.id) == 1 and await operations(h, first.id) == 0
        assert (await h.card(first)).status is Status.EXECUTING
        assert (await h.store.get_run(first.run_id)).status is RunStatus.WAITING


async def test_a_card_executing_elsewhere_is_seen_when_its_sibling_is_claimed(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window before a card executing elsewhere is told unknown (a lease and a tool
    deadline, note 49) starts when a continuation first sees it. On the claim path it
    started only once the approved sibling claimed beside it was done, so the model was
    told that much later."""
    from signoff.runtime.errors import ExecutingElsewhere

    async with harness(
        database_url, model=Scripted(pix("10"), pix("20", "Maria")), start_worker=False
    ) as h:
        _, first, second = await two_cards(h)
        executor = h.worker.agent.executor
        executor.lease = h.worker.lease  # what Worker.start sets
        await approved_beside_executing(h, first, second)
        held = Held(h, monkeypatch, snapshot=second.args_snapshot)
        going = asyncio.create_task(h.worker.agent.continue_run(first.run_id))
        await asyncio.wait_for(held.entered.wait(), 10)  # the sibling's call hangs
        assert executor.elsewhere.first_seen(first.id) is not None
        assert executor.elsewhere.first_seen(second.id) is None  # running here
        held.release.set()
        with pytest.raises(ExecutingElsewhere):
            await going
        assert (await h.card(second)).status is Status.EXECUTED


@pytest.mark.parametrize("siblings", [True, False])
async def test_a_stopping_worker_lets_a_provider_call_finish_within_its_deadline(
    database_url: str, monkeypatch: pytest.MonkeyPatch, siblings: bool
) -> None:
    """Last stop's note: a SIGTERM'd worker cut a provider call that outlived its 10 s
    drain, leaving the card `executing` with an unknown outcome (an operator's to
    reconcile). A card being executed gets up to its tool's deadline (runtime/drain.py;
    the drain of everything else is shortened here to keep the test short). Its outcome
    recorded, the stopping worker does not call the model: the next holder will."""
    from signoff.runtime import drain

    monkeypatch.setattr(drain, "DRAIN_SECONDS", 0.2)
    settings = Settings(tool_timeout_seconds=5.0)
    model = Scripted(pix("10"), pix("20", "Maria")) if siblings else Scripted(pix("10"))
    async with harness(database_url, model=model, settings=settings) as h:
        if siblings:
            _, first, _ = await two_cards(h)
        else:
            first = await one_card(h)
        held = Held(h, monkeypatch, snapshot=first.args_snapshot)
        await h.decide(first, Decision.APPROVE)
        await asyncio.wait_for(held.entered.wait(), 10)
        calls = model.calls
        asyncio.get_running_loop().call_later(1.0, held.release.set)  # past the drain
        await h.worker.stop()
        assert (await h.card(first)).status is Status.EXECUTED
        assert await operations(h, first.id) == 1
        assert model.calls == calls
        assert (await h.store.get_run(first.run_id)).status is RunStatus.WAITING


async def test_a_stopping_worker_starts_no_card_it_was_revalidating(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a card still revalidating when the stop began went on to start once
    its check answered, its provider call then cut at the drain's end (an unknown
    outcome the drain itself made). It is left approved for the worker that takes the
    run over, and the stop does not wait for it."""
    async with harness(database_url, model=Scripted(pix("10"))) as h:
        card = await one_card(h)
        check = HeldCheck(h, monkeypatch)
        await h.decide(card, Decision.APPROVE)
        await asyncio.wait_for(check.entered.wait(), 10)
        asyncio.get_running_loop().call_later(0.3, check.release.set)  # the check answers
        await h.worker.stop()
        assert (await h.card(card)).status is Status.APPROVED
        assert await operations(h, card.id) == 0
        monkeypatch.setattr(check.tool, "revalidate", check.real)
        await h.worker.start()  # as the worker taking the run over would
        await h.worker.wake(card.run_id)
        await h.settle()
        assert (await h.card(card)).status is Status.EXECUTED
        assert await operations(h, card.id) == 1
