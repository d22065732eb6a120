"""A stopping worker's runs while it drains (runtime/drain.py, design note 62).

Its runs parked with nothing in flight are handed back as the stop begins (it no longer
hears their decisions); the runs still in flight stay held, their lease renewed, however
long the drain. Before, every run stayed held until the drain was over, and a drain longer
than the lease let another worker take over the runs whose steps were still running."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from signoff.runtime import drain
from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from tests.conftest import migrated_database
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix
from tests.integration.test_sibling_approvals import Held, operations

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
