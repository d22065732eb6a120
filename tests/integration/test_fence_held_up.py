"""A fence held up past most of a lease (an integrity probe: another session held the
worker's lease row locked for a few seconds) must not fail an approval whose call was
never made. The fence's "ours" came too late for the worker's clock to vouch for the
lease it renewed, so the worker recorded `failed` ("not sent") while it still held the
run and nobody had adopted it: the approval was lost (15 of 611 under load)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def test_an_approval_survives_a_lease_row_locked_past_most_of_a_lease(
    database_url: str,
) -> None:
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=5.0)
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        card = await one_card(h)
        other = await asyncpg.connect(database_url)
        try:
            locked = other.transaction()
            await locked.start()
            await other.execute(
                "SELECT 1 FROM workers WHERE id = $1 FOR UPDATE", h.worker.worker_id
            )
            await asyncio.sleep(0.9)  # renewals wait on the row: the clock stops vouching
            await h.decide(card, Decision.APPROVE)
            await asyncio.sleep(2.0)  # the fence waits on the row too, past 0.8 of a lease
            assert (await h.store.get_card(card.id)).status is Status.EXECUTING
            await locked.rollback()
        finally:
            await other.close()
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.EXECUTED, final.result
        assert await h.charges() == 1
        run = await h.store.get_run(card.run_id)
        assert run.holder in (None, h.worker.worker_id)


async def test_a_database_that_stays_that_slow_gets_the_certain_outcome(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a fence answering "ours" late every time was asked again for ever, the
    card held `executing` (unflagged, each fence restarting its clock). After
    ``LATE_FENCES`` late answers nothing is sent and the card is recorded `failed`."""
    from signoff.runtime import execution

    monkeypatch.setattr(execution, "LATE_FENCES", 3)
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=5.0)
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        card = await one_card(h)
        real = h.store.execution_fence
        fences = 0

        async def slow(card_id: str, holder: str, seconds: float) -> bool:
            nonlocal fences
            fences += 1
            await asyncio.sleep(0.85)  # past 0.8 of the 1 s lease, every time
            return await real(card_id, holder, seconds)

        monkeypatch.setattr(h.store, "execution_fence", slow)
        executor = h.worker.agent.executor
        assert executor.lease is not None
        executor.lease.until = 0.0  # the clock stopped vouching (renewals held up)
        monkeypatch.setattr(executor.lease, "renewed", lambda sent: None)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.FAILED and "not sent" in str(final.result), final
        assert fences == 3 and await h.charges() == 0
