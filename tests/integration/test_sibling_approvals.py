"""An approved card runs on its approval, whether or not its siblings are decided
(runtime/approved.py, design note 60). It used to wait for every card of its step,
and a new message sent meanwhile invalidated it: the person's approval was lost."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.errors import SignoffError
from signoff.runtime.records import RunStatus
from tests.conftest import migrated_database
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, pix
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
