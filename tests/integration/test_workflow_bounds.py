"""Per-user bounds on workflows (G14): starts per minute, events a run keeps.

Before: one user could start workflow runs without bound (each agent step a model call and
a thread, beside the thread quota they were not counted against), and deliver events a run
keeps for a later gate without bound (200 × 200 kB to one run: 200 rows kept).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from signoff.runtime.config import Settings
from signoff.runtime.errors import EventsFull, RateLimited
from signoff.runtime.models.command import CommandModel
from signoff.testing import Harness
from tests.integration import wf_app
from tests.integration.wf_app import calls, release
from tests.integration.wf_kit import OWNER, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    settings = Settings(
        lease_seconds=2.0,
        poll_seconds=0.3,
        sweep_seconds=0.2,
        quota_workflow_runs_per_minute=3,
        workflow_events_kept=2,
    )
    async with Harness(
        wf_app.build(), database_url=database_url, model=CommandModel(), settings=settings
    ) as harness:
        yield harness


async def runs_of(h: Harness, owner: str) -> int:
    return int(
        await h.store.db.fetchval(
            "SELECT count(*) FROM workflow_runs WHERE tenant = $1 AND owner = $2", h.tenant, owner
        )
    )


async def test_starts_past_the_quota_are_refused_and_make_nothing(h: Harness) -> None:
    chosen = str(uuid.uuid4())
    first = await h.workflows.start("three", tenant=h.tenant, owner=OWNER, run_id=chosen)
    for _ in range(2):
        await h.workflows.start("three", tenant=h.tenant, owner=OWNER)
    with pytest.raises(RateLimited) as refused:
        await h.workflows.start("three", tenant=h.tenant, owner=OWNER)
    assert refused.value.detail["quota"] == "workflow_runs_per_minute"
    assert 1 <= refused.value.retry_after <= 60
    assert await runs_of(h, OWNER) == 3
    # a retried start of a run that exists is never refused: it is the same run
    again = await h.workflows.start("three", tenant=h.tenant, owner=OWNER, run_id=chosen)
    assert again.id == first.id
    # another user has a quota of their own
    await h.workflows.start("three", tenant=h.tenant, owner="bea")


async def test_racing_starts_on_the_quota_make_exactly_the_limit(h: Harness) -> None:
    results = await asyncio.gather(
        *(h.workflows.start("three", tenant=h.tenant, owner="carl") for _ in range(10)),
        return_exceptions=True,
    )
    made = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, RateLimited)]
    assert len(made) == 3 and len(refused) == 7
    assert await runs_of(h, "carl") == 3


async def test_a_run_keeps_at_most_its_bound_of_events(h: Harness) -> None:
    run = await h.workflows.start("order", tenant=h.tenant, owner=OWNER)  # lookback 30 s
    await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
    for amount in (1, 2):
        passed = await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": amount}, tenant=h.tenant, by=OWNER
        )
        assert passed.buffered
    with pytest.raises(EventsFull):
        await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": 3}, tenant=h.tenant, by=OWNER
        )
    kept = await h.store.db.fetchval(
        "SELECT count(*) FROM workflow_events WHERE run_id = $1", uuid.UUID(run.id)
    )
    assert kept == 2
    release(run.id)
    done = await until(lambda: done_run(h, run.id), what="the first kept event consumed")
    assert done.state["amount"] == 1


async def done_run(h: Harness, run_id: str):  # type: ignore[no-untyped-def]
    run = await h.store.workflows.get_workflow_run(run_id)
    return run if str(run.status) == "completed" else None


async def test_events_past_every_lookback_do_not_count_against_the_bound(
    database_url: str,
) -> None:
    """Events no gate can take any more (older than the longest lookback) filled the bound
    for the rest of the run's life: every later event was refused."""
    settings = Settings(poll_seconds=0.3, sweep_seconds=0.2, workflow_events_kept=2)
    async with Harness(
        wf_app.build(lookback=0.5),
        database_url=database_url,
        model=CommandModel(),
        settings=settings,
    ) as h:
        run = await h.workflows.start("order", tenant=h.tenant, owner=OWNER)
        await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
        for amount in (1, 2):
            await h.workflows.deliver_event(
                run.id, "payment.confirmed", {"amount": amount}, tenant=h.tenant, by=OWNER
            )
        with pytest.raises(EventsFull):
            await h.workflows.deliver_event(
                run.id, "payment.confirmed", {"amount": 3}, tenant=h.tenant, by=OWNER
            )
        await asyncio.sleep(0.7)  # both are past the gate's lookback now
        passed = await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": 4}, tenant=h.tenant, by=OWNER
        )
        assert passed.buffered
        release(run.id)
        done = await until(lambda: done_run(h, run.id), what="the fresh event consumed")
        assert done.state["amount"] == 4


async def test_racing_events_at_the_bound_keep_exactly_the_bound(h: Harness) -> None:
    """Ten deliveries at once to a run that may keep two: the count and the insert happen
    under the run's lock, so exactly two are kept and eight refused."""
    run = await h.workflows.start("order", tenant=h.tenant, owner="dora")  # lookback 30 s
    await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
    results = await asyncio.gather(
        *(
            h.workflows.deliver_event(
                run.id, "payment.confirmed", {"amount": i}, tenant=h.tenant, by="dora"
            )
            for i in range(10)
        ),
        return_exceptions=True,
    )
    assert sum(isinstance(r, EventsFull) for r in results) == 8
    assert sum(not isinstance(r, BaseException) and r.buffered for r in results) == 2
    kept = await h.store.db.fetchval(
        "SELECT count(*) FROM workflow_events WHERE run_id = $1", uuid.UUID(run.id)
    )
    assert kept == 2
    release(run.id)
