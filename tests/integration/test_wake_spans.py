"""Every wake of a parked run is timed and labelled by the path that woke it (issue 14):
the signal, the slow poll (its signal lost), adoption (its worker gone). Before, only
the fast path was sampled, so the slowest decisions were missing from the tail."""

from __future__ import annotations

import asyncio

import pytest

from signoff.runtime.bus.memory import MemoryBus
from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Decisions, Resolution
from signoff.runtime.keys import Keys
from signoff.runtime.policy import Policy
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = pytest.mark.anyio


def wakes(h: Harness, after: int = 0) -> list[tuple[str, int]]:
    """The wakes recorded after the ``after``-th span. The session's database is shared:
    the worker may also adopt runs other tests left (labelled ``adoption``)."""
    return [(path, ns) for name, path, ns in h.worker.waits.woken.spans.after(after)
            if name == "wake_to_step_done"]  # fmt: skip


async def executed(h: Harness, card_id: str, timeout: float = 15) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (await h.store.get_card(card_id)).status is not Status.EXECUTED:
        assert asyncio.get_running_loop().time() < deadline, "the card was not executed"
        await asyncio.sleep(0.05)


def elsewhere(h: Harness) -> Decisions:
    """A gateway whose signal reaches nobody (another, unconnected bus)."""
    return Decisions(
        store=h.store,
        bus=MemoryBus(),
        tools=h.decisions.tools,
        policy=Policy(),
        keys=Keys(),
        services=h.decisions.services,
    )


async def test_a_signalled_decision_is_timed_under_signal(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        mark = h.worker.waits.woken.spans.count
        await h.decide(card, Decision.APPROVE)
        await executed(h, card.id)
        await h.settle()
        signalled = [ns for path, ns in wakes(h, mark) if path == "signal"]
        assert len(signalled) == 1 and signalled[0] > 0


async def test_a_decision_whose_signal_was_lost_is_timed_under_poll(database_url: str) -> None:
    async with harness(
        database_url, model=Scripted(pix()), settings=Settings(poll_seconds=0.2)
    ) as h:
        card = await one_card(h)
        mark = h.worker.waits.woken.spans.count
        await elsewhere(h).resolve(
            card.id,
            Resolution(decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash),
            principal="alice",
            channel="test",
        )
        await executed(h, card.id)
        await h.settle()
        paths = [p for p, _ in wakes(h, mark)]
        assert "poll" in paths and "signal" not in paths  # no signal could reach it


async def test_an_adopted_run_is_timed_under_adoption(database_url: str) -> None:
    fast = Settings(lease_seconds=1.0)
    async with harness(database_url, model=Scripted(pix()), settings=fast, leave_runs=True) as a:
        card = await one_card(a)
        await a.worker.stop(drain=False, release=False)
        await elsewhere(a).resolve(
            card.id,
            Resolution(decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash),
            principal="alice",
            channel="test",
        )
    async with harness(database_url, model=Scripted(pix()), settings=fast) as b:
        await executed(b, card.id)
        await b.settle()
        assert "adoption" in [p for p, _ in wakes(b)]
