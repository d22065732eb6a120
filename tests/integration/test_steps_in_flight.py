"""A worker's continuations wait on the model together: a continuation lets its step slot
(SIGNOFF_STEPS_IN_FLIGHT, 10) go while the model takes its time, as a hosted model does
(seconds), so approvals are not continued ten at a time (design note 56)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings, from_env
from signoff.runtime.errors import ConfigError
from signoff.runtime.metrics_server import worker_gauges
from signoff.testing import FakeMessagesServer, ScriptedReply, reply, text, tool_use
from tests.conftest import migrated_database
from tests.harness import harness

pytestmark = pytest.mark.anyio

RUNS = 12


def _answer(body: dict[str, Any]) -> ScriptedReply:
    """A charge for a user's message; a closing text once the tool's result is in."""
    content = body["messages"][-1]["content"]
    if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
        return reply(text("Feito."))
    return reply(tool_use("create_pix_charge", {"customer": "João", "amount": "10"}))


async def _approve_all(settings: Settings, database_url: str) -> tuple[int, int]:
    """Park RUNS runs, approve them all at once; (the most model calls the continuations
    made at once, the charges made)."""
    with FakeMessagesServer(responder=_answer, latency=1.0) as fake:
        async with harness(database_url, fake=fake, settings=settings) as h:
            threads = [await h.thread("alice") for _ in range(RUNS)]
            await asyncio.gather(*(h.say(t, "cobre 10 do João", "alice") for t in threads))
            cards = [card for t in threads for card in await h.pending(t)]
            assert len(cards) == RUNS
            fake.reset_most_in_flight()
            await asyncio.gather(*(h.decide(card, "approve") for card in cards))
            await h.settle(timeout=30)
            assert [(await h.card(c)).status for c in cards] == [Status.EXECUTED] * RUNS
            for t in threads:
                assert await h.last_reply(t) == "Feito."
            return fake.most_in_flight, await h.charges()


async def test_continuations_wait_on_the_model_together(database_url: str) -> None:
    # Two slots: a worker used to continue two runs at a time, each holding its slot
    # through the model's second (`together` was 2). Their local work still passes two at
    # a time, so not all twelve reach the model in the same instant.
    together, charges = await _approve_all(Settings(steps_in_flight=2), database_url)
    assert charges == RUNS
    assert together >= 6, together


def test_steps_in_flight_is_refused_at_zero() -> None:
    with pytest.raises(ConfigError, match="SIGNOFF_STEPS_IN_FLIGHT"):
        from_env({"SIGNOFF_STEPS_IN_FLIGHT": "0"})
    assert from_env({"SIGNOFF_STEPS_IN_FLIGHT": "7"}).steps_in_flight == 7


async def test_a_second_wake_of_a_run_never_holds_the_slot_its_first_wake_needs(
    database_url: str,
) -> None:
    # One slot. The approval's continuation lets it go while the model answers; a second
    # wake of the same run (a retry, an adoption, a redelivered message) took it and
    # waited on the run's lock, and the first, back from the model, waited for the slot
    # forever: no step of this worker went on. The slot is now taken under the run's lock.
    with FakeMessagesServer(responder=_answer, latency=1.0) as fake:
        settings = Settings(steps_in_flight=1)
        async with harness(database_url, fake=fake, settings=settings) as h:
            thread = await h.thread("alice")
            await h.say(thread, "cobre 10 do João", "alice")
            [card] = await h.pending(thread)
            await h.decide(card, "approve")
            deadline = asyncio.get_running_loop().time() + 10
            while fake.in_flight == 0:  # the continuation waits on the model, slot let go
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.02)
            h.worker.wakes.now(card.run_id)
            await h.settle(timeout=20)
            assert (await h.card(card)).status is Status.EXECUTED
            assert await h.last_reply(thread) == "Feito."
            assert await h.charges() == 1


@pytest.fixture
def own_database() -> Iterator[str]:
    # Its own: a harness adopts every lapsed run of its database, other tests' included.
    yield from migrated_database("so_adopt")


async def test_adopted_runs_wait_on_the_model_together(own_database: str) -> None:
    # A worker dies with twelve runs parked; their cards are approved meanwhile. The
    # worker that adopts them had 2 x SIGNOFF_POOL_SIZE (4 here) adoption slots, each held
    # through the model's second: four at a time. A slot is now let go while the model
    # answers, as a step slot is; and an adopted continuation also takes a step slot, so
    # SIGNOFF_STEPS_IN_FLIGHT bounds everything that works (a review: it did not).
    fast = Settings(lease_seconds=1.0, pool_size=2)
    with FakeMessagesServer(responder=_answer, latency=1.0) as fake:
        async with harness(own_database, fake=fake, settings=fast, leave_runs=True) as a:
            threads = [await a.thread("alice") for _ in range(RUNS)]
            await asyncio.gather(*(a.say(t, "cobre 10 do João", "alice") for t in threads))
            cards = [card for t in threads for card in await a.pending(t)]
            assert len(cards) == RUNS
            await a.worker.stop(drain=False, release=False)  # dies: nothing released
            for card in cards:
                await a.store.decide(
                    card.id,
                    principal=card.owner,
                    decision=Decision.APPROVE,
                    snapshot_hash=card.snapshot_hash,
                    channel="test",
                )
        fake.reset_most_in_flight()
        # One step slot: adopted continuations take it too, so nothing works beside it.
        async with harness(own_database, fake=fake, settings=fast.with_(steps_in_flight=1)) as b:
            deadline = asyncio.get_running_loop().time() + 30
            while [(await b.card(c)).status for c in cards] != [Status.EXECUTED] * RUNS:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
            await b.settle(timeout=30)
            for t in threads:
                assert await b.last_reply(t) == "Feito."
            assert b.worker._step_slots.most_taken == 1  # 0: adoption bypassed the bound
        assert fake.most_in_flight >= 6, fake.most_in_flight


async def test_the_step_gauge_counts_slots_held_not_every_task(database_url: str) -> None:
    # An operator probe read signoff_steps_in_flight 200 with SIGNOFF_STEPS_IN_FLIGHT=10:
    # it counted every task (adopted runs queued for a slot, hints). It is now the slots
    # held; signoff_worker_tasks counts everything (0: idle, what benches wait for).
    with FakeMessagesServer(responder=_answer) as fake:
        async with harness(database_url, fake=fake, settings=Settings(steps_in_flight=2)) as h:

            def gauges() -> dict[str, float]:
                return {name: value for name, _, value in worker_gauges(h.worker)}

            await h.settle()
            idle = gauges()
            assert idle["signoff_steps_in_flight"] == 0
            async with h.worker._step_slots.slot():
                queued = [asyncio.create_task(asyncio.sleep(0.2)) for _ in range(3)]
                for task in queued:
                    h.worker.tasks.add(task)
                    task.add_done_callback(h.worker.tasks.discard)
                busy = gauges()
                assert busy["signoff_steps_in_flight"] == 1
                assert busy["signoff_worker_tasks"] >= 3
                await asyncio.gather(*queued)
            assert gauges()["signoff_steps_in_flight"] == 0
