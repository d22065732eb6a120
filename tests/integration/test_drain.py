"""A stopping worker's runs while it drains (runtime/drain.py, design note 62).

Its runs parked with nothing in flight are handed back as the stop begins (it no longer
hears their decisions); the runs still in flight stay held, their lease renewed, however
long the drain. Before, every run stayed held until the drain was over, and a drain longer
than the lease let another worker take over the runs whose steps were still running."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from signoff.runtime import drain
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.config import Settings
from tests.conftest import migrated_database
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, one_card, pix
from tests.integration.test_sibling_approvals import Held, HeldCheck, operations

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """Its own database: the test adopts every run nobody holds in it."""
    yield from migrated_database("so_drain")


async def holder(h: object, run_id: str) -> str | None:
    value = await h.store.pool.fetchval(  # type: ignore[attr-defined]
        "SELECT worker_id FROM runs WHERE id = $1::uuid", run_id
    )
    return None if value is None else str(value)


async def beside_a_held_call(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> tuple[Card, Card, Held]:
    """A card left pending, and another approved whose provider call is held (which
    keeps a drain going)."""
    other = await one_card(h)
    running = await one_card(h, "bob")
    held = Held(h, monkeypatch)
    await h.decide(running, Decision.APPROVE)
    await asyncio.wait_for(held.entered.wait(), 10)
    return other, running, held


async def test_a_stopping_worker_hands_parked_runs_over_and_keeps_those_in_flight(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(drain, "DRAIN_SECONDS", 0.2)
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=5.0)
    async with harness(database_url, model=Scripted(pix("10")), settings=settings) as h:
        parked = await one_card(h)  # waits for its person: nothing of it is in flight
        running = await one_card(h, "bob")
        held = Held(h, monkeypatch)
        await h.decide(running, Decision.APPROVE)
        await asyncio.wait_for(held.entered.wait(), 10)  # its provider call hangs
        stop = asyncio.create_task(h.worker.stop())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while await holder(h, parked.run_id) is not None:
            assert loop.time() < deadline, "the parked run was kept through the drain"
            await asyncio.sleep(0.05)
        assert not h.worker.waits.is_parked(parked.id)
        await asyncio.sleep(2.5)  # over twice the lease, the provider call still running
        assert not stop.done()
        assert await holder(h, running.run_id) == h.worker.worker_id
        taken = {r.id for r in await h.store.adopt_runs("another-worker", 1.0, 1000)}
        assert parked.run_id in taken and running.run_id not in taken
        held.release.set()
        await asyncio.wait_for(stop, 10)
        assert (await h.card(running)).status is Status.EXECUTED
        assert await operations(h, running.id) == 1
        assert await holder(h, running.run_id) is None  # handed over once drained
        assert await holder(h, parked.run_id) == "another-worker"
        assert (await h.card(parked)).status is Status.PENDING


async def test_a_tick_still_running_at_the_stop_does_not_let_the_lease_lapse(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: the stop waited for every loop's tick to end (a sweep slow on a slow
    Postgres) before renewing the lease again, so the lease of a run whose provider call
    was in flight lapsed and another worker took it over. The lease's loop is not
    stopped while the worker drains."""
    monkeypatch.setattr(drain, "DRAIN_SECONDS", 0.2)
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=5.0, sweep_seconds=0.1)
    async with harness(database_url, model=Scripted(pix("10")), settings=settings) as h:
        running = await one_card(h)
        held = Held(h, monkeypatch)
        sweeping = asyncio.Event()
        real = h.worker.sweep

        async def slow_sweep() -> Any:
            sweeping.set()
            await asyncio.sleep(2.0)  # Postgres slow: the tick ends late
            return await real()

        monkeypatch.setattr(h.worker, "sweep", slow_sweep)
        await h.decide(running, Decision.APPROVE)
        await asyncio.wait_for(held.entered.wait(), 10)
        await asyncio.wait_for(sweeping.wait(), 5)
        stop = asyncio.create_task(h.worker.stop())
        await asyncio.sleep(1.6)  # past the lease, the sweep's tick still running
        taken = {r.id for r in await h.store.adopt_runs("another-worker", 1.0, 1000)}
        assert running.run_id not in taken
        held.release.set()
        await asyncio.wait_for(stop, 15)
        assert (await h.card(running)).status is Status.EXECUTED
        assert await operations(h, running.id) == 1


async def test_a_stop_cancelled_midway_lets_the_lease_lapse(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a stop cancelled during its drain (an embedding app's own deadline) left
    the drain's lease loop renewing for ever, so the worker's runs were never adopted
    while the process lived."""
    monkeypatch.setattr(drain, "DRAIN_SECONDS", 0.2)
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=5.0)
    async with harness(database_url, model=Scripted(pix("10")), settings=settings) as h:
        running = await one_card(h)
        held = Held(h, monkeypatch)
        await h.decide(running, Decision.APPROVE)
        await asyncio.wait_for(held.entered.wait(), 10)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(h.worker.stop(), 1.0)
        assert all(t.done() for t in h.worker.ticks.tasks) and h.worker.ticks.tasks == []
        await asyncio.sleep(1.5)  # the lease lapses
        taken = {r.id for r in await h.store.adopt_runs("another-worker", 1.0, 1000)}
        assert running.run_id in taken
        held.release.set()


async def test_a_run_waiting_out_a_retry_is_handed_over_at_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a parked run with a continuation scheduled for later (a retry backing
    off) was kept through the drain, though nothing of it runs here and a draining
    worker fires no scheduled continuation: its decisions went unheard meanwhile."""
    monkeypatch.setattr(drain, "DRAIN_SECONDS", 0.2)
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=5.0)
    async with harness(database_url, model=Scripted(pix("10")), settings=settings) as h:
        parked, running, held = await beside_a_held_call(h, monkeypatch)
        h.worker.wakes.later(parked.run_id, 1, 30.0)  # a retry, backing off
        stop = asyncio.create_task(h.worker.stop())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while await holder(h, parked.run_id) is not None:
            assert loop.time() < deadline, "the run waiting out its retry was kept"
            await asyncio.sleep(0.05)
        assert await holder(h, running.run_id) == h.worker.worker_id
        held.release.set()
        await asyncio.wait_for(stop, 15)


async def test_a_run_whose_step_ends_during_the_drain_is_handed_over_then(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile probe: an approval racing the SIGTERM had its continuation running when
    the stop began (so its run was kept); the continuation then refused to start the
    card (the worker is stopping), and the run stayed held, its card approved and not
    run, until an unrelated provider call's drain ended (14-21 s). Such a run is handed
    over once its step has ended."""
    monkeypatch.setattr(drain, "DRAIN_SECONDS", 0.2)
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=8.0)
    async with harness(database_url, model=Scripted(pix("10")), settings=settings) as h:
        racing, running, held = await beside_a_held_call(h, monkeypatch)  # keeps the drain
        check = HeldCheck(h, monkeypatch)
        await h.decide(racing, Decision.APPROVE)
        await asyncio.wait_for(check.entered.wait(), 10)  # its step runs as the stop begins
        stop = asyncio.create_task(h.worker.stop())
        await asyncio.sleep(0.3)
        assert await holder(h, racing.run_id) == h.worker.worker_id  # its step runs here
        check.release.set()  # the check answers; the card is not started (stopping)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3
        while await holder(h, racing.run_id) is not None:
            assert loop.time() < deadline, "kept until the drain's end"
            await asyncio.sleep(0.05)
        assert not stop.done()
        assert (await h.card(racing)).status is Status.APPROVED  # for the next holder
        assert await holder(h, running.run_id) == h.worker.worker_id
        held.release.set()
        await asyncio.wait_for(stop, 15)
        assert await operations(h, racing.id) == 0


class HeldModel(Scripted):
    """The scripted model, its first reply held until released."""

    def __init__(self, *uses: dict[str, object]) -> None:
        super().__init__(*uses)
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def respond(self, **kwargs: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return await super().respond(**kwargs)  # type: ignore[no-untyped-call]


async def test_a_first_turn_that_parks_during_the_drain_is_handed_over_with_its_token(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a message's first turn still running when the stop began parks its card
    here afterwards, with a wait token naming the stopping worker. The run goes to
    another worker within the drain's next hand-over, its token cleared (it stayed
    until the drain's end, the token until its TTL)."""
    monkeypatch.setattr(drain, "DRAIN_SECONDS", 0.2)
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=8.0)
    model = HeldModel(pix("10"))
    async with harness(database_url, model=model, settings=settings) as h:
        model.release.set()
        _, running, held = await beside_a_held_call(h, monkeypatch)  # keeps the drain
        model.release.clear()
        model.entered.clear()
        thread = await h.thread("carol")
        job = h.message(thread, "carol")
        await h.bus.enqueue(job)
        await asyncio.wait_for(model.entered.wait(), 10)  # the first turn is in flight
        stop = asyncio.create_task(h.worker.stop())
        await asyncio.sleep(0.3)
        model.release.set()  # the turn proposes its card and parks the run here
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not (cards := await h.store.pending_cards(thread)):
            assert loop.time() < deadline, "no card was proposed"
            await asyncio.sleep(0.05)
        (card,) = cards
        deadline = loop.time() + 3
        while await holder(h, card.run_id) is not None:
            assert loop.time() < deadline, "the parked first turn was kept until the drain's end"
            await asyncio.sleep(0.05)
        assert await h.bus.wait_holder(card.id) is None
        assert not stop.done()
        assert await holder(h, running.run_id) == h.worker.worker_id
        held.release.set()
        await asyncio.wait_for(stop, 15)


async def test_a_card_begun_and_not_yet_hinted_is_waited_for(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code review: a card counted as started only once the hint after its committed
    `executing` had gone, so a drain ending while that hint was slow (a slow Redis) cut
    the card before its provider call: left `executing`, nothing sent, for an operator
    to reconcile. It counts from before its statement now, and the drain waits for it."""
    monkeypatch.setattr(drain, "DRAIN_SECONDS", 0.3)
    settings = Settings(lease_seconds=2.0, tool_timeout_seconds=5.0)
    async with harness(database_url, model=Scripted(pix("10")), settings=settings) as h:
        card = await one_card(h)
        begun = asyncio.Event()
        notify = h.worker.agent.notify
        real_thread = notify.thread

        async def slow_thread(thread_id: str, *args: Any, **kwargs: Any) -> Any:
            if thread_id == card.thread_id and (await h.card(card)).status is Status.EXECUTING:
                begun.set()
                await asyncio.sleep(2.0)  # the hint after the begin, slow to go
            return await real_thread(thread_id, *args, **kwargs)

        monkeypatch.setattr(notify, "thread", slow_thread)
        await h.decide(card, Decision.APPROVE)
        await asyncio.wait_for(begun.wait(), 10)
        assert h.worker.agent.executor.executing() == 1
        await h.worker.stop()
        assert (await h.card(card)).status is Status.EXECUTED
        assert await operations(h, card.id) == 1
        assert await h.charges() == 1  # the provider was called, once
