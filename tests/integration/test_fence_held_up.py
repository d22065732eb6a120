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
