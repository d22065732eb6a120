"""Workflows on real Postgres, in-process (worker + the service a gateway calls)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from signoff import (
    NotParked,
    NotRetriable,
    ReservedKey,
    WorkflowRun,
    WrongEvent,
)
from signoff.runtime.config import Settings
from signoff.runtime.errors import (
    InvalidInput,
    NotOwner,
    RunInactive,
    WorkflowNotFound,
)
from signoff.runtime.models.command import CommandModel
from signoff.testing import Harness
from tests.integration import wf_app
from tests.integration.wf_app import calls, release
from tests.integration.wf_kit import OWNER, parked, start, status_is, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    settings = Settings(lease_seconds=2.0, poll_seconds=0.3, sweep_seconds=0.2)
    async with Harness(
        wf_app.build(), database_url=database_url, model=CommandModel(), settings=settings
    ) as harness:
        yield harness


async def test_human_gate_parks_resumes_and_completes(h: Harness) -> None:
    run = await parked(h)
    assert run.step == 1 and run.state["extracted"] == 1
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    gate = interrupts[-1]
    assert gate.status == "open" and gate.kind == "human" and gate.reason == "approve the payout"
    assert gate.schema["properties"]["approved"] == {"type": "boolean"}
    assert gate.schema["required"] == ["approved"]
    await h.workflows.resume(
        run.id, {"approved": True, "note": "ok", "sneaky": 1}, tenant=h.tenant, by=OWNER
    )
    done = await until(status_is(h, run.id, "completed"), what="completed")
    assert done.state["approved"] is True and done.state["note"] == "ok"
    assert "sneaky" not in done.state  # undeclared fields are dropped
    assert "approved" in done.state["pay_saw"]  # the next step saw the gate's payload
    assert [s["name"] for s in done.steps] == ["extract", "await_human", "pay"]
    assert calls(run.id, "extract") == 1 and calls(run.id, "pay") == 1
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    assert interrupts[-1].status == "resolved" and interrupts[-1].resolved_by == OWNER
    assert interrupts[-1].payload == {"approved": True, "note": "ok"}
    assert interrupts[-1].automatic is False and interrupts[-1].resolved_at is not None


async def test_invalid_payload_is_422_and_the_run_stays_parked(h: Harness) -> None:
    run = await parked(h)
    with pytest.raises(InvalidInput):
        await h.workflows.resume(run.id, {"approved": "yes"}, tenant=h.tenant, by=OWNER)
    with pytest.raises(InvalidInput):
        await h.workflows.resume(run.id, {"note": "missing approved"}, tenant=h.tenant, by=OWNER)
    with pytest.raises(ReservedKey):
        await h.workflows.resume(run.id, {"approved": True, "steps": []}, tenant=h.tenant, by=OWNER)
    with pytest.raises(NotOwner):
        await h.workflows.resume(run.id, {"approved": True}, tenant=h.tenant, by="eve")
    with pytest.raises(WorkflowNotFound):  # another tenant does not see it
        await h.workflows.resume(run.id, {"approved": True}, tenant="other", by=OWNER)
    await asyncio.sleep(0.3)
    still = await h.store.workflows.get_workflow_run(run.id)
    assert still.status == "awaiting_human" and still.step == 1
    assert "steps" not in still.state and calls(run.id, "pay") == 0
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    assert [i.status for i in interrupts] == ["open"]


async def test_two_racing_resumes_one_wins_next_step_runs_once(h: Harness) -> None:
    for _ in range(5):
        run = await parked(h)
        results = await asyncio.gather(
            *(
                h.workflows.resume(run.id, {"approved": i % 2 == 0}, tenant=h.tenant, by=OWNER)
                for i in range(4)
            ),
            return_exceptions=True,
        )
        won = [r for r in results if isinstance(r, WorkflowRun)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(won) == 1 and all(isinstance(e, NotParked) for e in lost), results
        await until(status_is(h, run.id, "completed"))
        await asyncio.sleep(0.2)
        assert calls(run.id, "pay") == 1
        _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
        assert len(interrupts) == 1


async def test_timeout_with_response_resumes_automatically(h: Harness) -> None:
    run = await start(h, "timed")
    done = await until(status_is(h, run.id, "completed"), what="auto-resumed")
    assert done.state["approved"] is False and done.state["note"] == "auto"
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    assert interrupts[-1].automatic is True and interrupts[-1].resolved_by == "system:timeout"
    assert interrupts[-1].status == "resolved"
    assert calls(run.id, "after") == 1


async def test_timeout_without_response_fails_at_the_gate_and_retry_rearms(h: Harness) -> None:
    run = await start(h, "timed_fail")
    failed = await until(status_is(h, run.id, "failed"), what="failed at gate")
    assert failed.step == 0 and "timed out" in (failed.error or "")
    with pytest.raises(NotParked):
        await h.workflows.resume(run.id, {"approved": True}, tenant=h.tenant, by=OWNER)
    again = await h.workflows.retry(run.id, tenant=h.tenant, by=OWNER)
    assert again.status == "awaiting_human" and again.error is None
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    assert [i.status for i in interrupts] == ["timed_out", "open"]
    assert interrupts[1].deadline is not None and interrupts[0].deadline is not None
    assert interrupts[1].deadline > interrupts[0].deadline  # a fresh deadline
    await h.workflows.resume(run.id, {"approved": True}, tenant=h.tenant, by=OWNER)
    await until(status_is(h, run.id, "completed"), what="completed after retry")
    with pytest.raises(NotRetriable):
        await h.workflows.retry(run.id, tenant=h.tenant, by=OWNER)


async def test_retry_after_timeout_can_time_out_again(h: Harness) -> None:
    run = await start(h, "timed_fail")
    await until(status_is(h, run.id, "failed"))
    await h.workflows.retry(run.id, tenant=h.tenant, by=OWNER)
    await until(status_is(h, run.id, "failed"), what="failed again")
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    assert [i.status for i in interrupts] == ["timed_out", "timed_out"]


async def test_event_gate_wrong_name_and_not_parked(h: Harness) -> None:
    run = await start(h, "strict")
    await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
    with pytest.raises(NotParked):  # still running its first step; no lookback
        await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": 5}, tenant=h.tenant, by=OWNER
        )
    release(run.id)
    await until(status_is(h, run.id, "awaiting_event"))
    # A service or admin principal may deliver the event, and only that: reading,
    # retrying and cancelling the run are its owner's alone (as deciding a card is).
    for role in ("service", "admin"):
        with pytest.raises(NotOwner):
            await h.workflows.get(run.id, tenant=h.tenant, user="svc", role=role)
        with pytest.raises(NotOwner):
            await h.workflows.cancel(run.id, tenant=h.tenant, by="svc", role=role)
        with pytest.raises(NotOwner):
            await h.workflows.retry(run.id, tenant=h.tenant, by="svc", role=role)
    assert (await h.store.workflows.get_workflow_run(run.id)).status == "awaiting_event"
    with pytest.raises(WrongEvent):
        await h.workflows.deliver_event(
            run.id, "payment.failed", {"amount": 5}, tenant=h.tenant, by=OWNER
        )
    with pytest.raises(InvalidInput):
        await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": "x"}, tenant=h.tenant, by=OWNER
        )
    with pytest.raises(NotParked):  # a human gate's resume is not an event
        await h.workflows.resume(run.id, {"approved": True}, tenant=h.tenant, by=OWNER)
    passed = await h.workflows.deliver_event(
        run.id,
        "payment.confirmed",
        {"amount": 5, "extra": 1},
        tenant=h.tenant,
        by="svc",
        role="service",
    )
    assert not passed.buffered and passed.interrupt is not None
    assert passed.interrupt.resolved_by == "svc"
    done = await until(status_is(h, run.id, "completed"))
    assert done.state["amount"] == 5 and "extra" not in done.state
    with pytest.raises(NotParked):
        await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": 5}, tenant=h.tenant, by=OWNER
        )


async def test_lookback_keeps_an_early_event_inside_the_window(h: Harness) -> None:
    run = await start(h, "order")  # lookback 30 s
    await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
    passed = await h.workflows.deliver_event(
        run.id, "payment.confirmed", {"amount": 7}, tenant=h.tenant, by=OWNER
    )
    assert passed.buffered and passed.run.status == "running"
    release(run.id)
    done = await until(status_is(h, run.id, "completed"), what="early event consumed")
    assert done.state["amount"] == 7 and calls(run.id, "ship") == 1
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    assert [i.status for i in interrupts] == ["resolved"]
    assert interrupts[0].resolved_by == OWNER


async def test_lookback_ignores_an_event_outside_the_window(database_url: str) -> None:
    settings = Settings(lease_seconds=2.0, poll_seconds=0.3, sweep_seconds=0.2)
    app = wf_app.build(lookback=0.5)
    async with Harness(
        app, database_url=database_url, model=CommandModel(), settings=settings
    ) as h:
        run = await start(h, "order")
        await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
        passed = await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": 7}, tenant=h.tenant, by=OWNER
        )
        assert passed.buffered
        await asyncio.sleep(1.0)  # past the 0.5 s window
        release(run.id)
        parked_run = await until(status_is(h, run.id, "awaiting_event"), what="parked")
        assert "amount" not in parked_run.state
        await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": 9}, tenant=h.tenant, by=OWNER
        )
        done = await until(status_is(h, run.id, "completed"))
        assert done.state["amount"] == 9


async def test_cancel(h: Harness) -> None:
    run = await parked(h)
    cancelled = await h.workflows.cancel(run.id, tenant=h.tenant, by=OWNER)
    assert cancelled.status == "cancelled"
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    assert interrupts[-1].status == "cancelled"
    with pytest.raises(NotParked):
        await h.workflows.resume(run.id, {"approved": True}, tenant=h.tenant, by=OWNER)
    with pytest.raises(RunInactive):
        await h.workflows.cancel(run.id, tenant=h.tenant, by=OWNER)


async def test_start_refuses_unknown_workflow_and_bad_input(h: Harness) -> None:
    with pytest.raises(WorkflowNotFound) as unknown:
        await start(h, "nope")
    # the names it serves are in the refusal (the newcomer guessed "order_flow" from a
    # variable's name and had no way to list them)
    served = sorted(h.workflows.workflows)
    assert unknown.value.detail["workflows"] == served and served
    assert ", ".join(served) in unknown.value.message
    with pytest.raises(InvalidInput):
        await h.workflows.start("three", {"x": 1}, tenant=h.tenant, owner=OWNER)
    with pytest.raises(WorkflowNotFound):
        await h.store.workflows.get_workflow_run("not-a-uuid")


async def test_an_event_racing_the_run_to_its_gate_is_never_lost(h: Harness) -> None:
    """The event arrives while the run is on its way to the gate: kept (lookback) or
    passing the open gate, whichever order the two transactions commit in."""
    for i in range(8):
        run = await start(h, "order")
        await until(lambda run=run: asyncio.sleep(0, calls(run.id, "held")))  # type: ignore[misc]
        if i % 2:
            release(run.id)
            await asyncio.sleep(0.002 * i)
        delivered = await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": i}, tenant=h.tenant, by=OWNER
        )
        release(run.id)
        done = await until(status_is(h, run.id, "completed"), what=f"iteration {i}")
        assert done.state["amount"] == i, delivered
        assert calls(run.id, "ship") == 1


async def test_a_resume_racing_the_timeout_resolves_the_gate_once(h: Harness) -> None:
    outcomes = set()
    for _ in range(6):
        run = await start(h, "timed")  # 0.5 s timeout, automatic response approved=False
        await until(status_is(h, run.id, "awaiting_human"))
        await asyncio.sleep(0.45)
        try:
            await h.workflows.resume(run.id, {"approved": True}, tenant=h.tenant, by=OWNER)
            outcomes.add("person")
        except NotParked:
            outcomes.add("timeout")
        done = await until(status_is(h, run.id, "completed"))
        _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
        assert len(interrupts) == 1 and interrupts[0].status == "resolved"
        assert done.state["approved"] is (interrupts[0].resolved_by == OWNER)
        await asyncio.sleep(0.1)
        assert calls(run.id, "after") == 1
    assert outcomes  # (which side wins each time is the clock's business)


async def test_a_service_principal_delivering_an_event_is_not_shown_the_run(
    database_url: str,
) -> None:
    """A service or admin token may deliver an event, not read the run: its answer carried
    the whole run (the owner's input, its state, its steps)."""
    settings = Settings(lease_seconds=2.0, poll_seconds=0.3, sweep_seconds=0.2)
    app = wf_app.build()
    async with Harness(
        app, database_url=database_url, model=CommandModel(), settings=settings, gateway=True
    ) as h:
        run = await start(h, "order")  # its event gate has a 30 s lookback
        await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
        svc = {"Authorization": f"Bearer {h.tokens.issue('payments', h.tenant, 'service')}"}
        owner = {"Authorization": f"Bearer {h.tokens.issue(OWNER, h.tenant)}"}
        url = f"{h.base_url}/v1/workflow-runs/{run.id}/events"
        event = {"name": "payment.confirmed", "payload": {"amount": 7}}
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(url, json=event, headers=svc)
            assert r.status_code == 202, r.text  # kept for the gate (lookback)
            assert r.json() == {
                "run": {"id": run.id, "workflow": "order", "status": "running"},
                "delivered": "kept",
            }
            r = await http.get(f"{h.base_url}/v1/workflow-runs/{run.id}", headers=svc)
            assert r.status_code == 403, r.text
            shown = (
                await http.get(f"{h.base_url}/v1/workflow-runs/{run.id}", headers=owner)
            ).json()
            assert {"owner", "state", "input"} <= set(shown["run"])  # the owner sees it all
        release(run.id)
        done = await until(status_is(h, run.id, "completed"), what="the kept event consumed")
        assert done.state["amount"] == 7


async def test_a_step_whose_provider_stays_away_is_tried_again_less_and_less_often(
    h: Harness,
) -> None:
    """A review: a step meeting Unavailable every time was tried again every second, for
    ever, with a warning each time. The pause doubles (1, 2, 4 ... 30 s), and the run
    stays running: the provider may come back."""
    run = await start(h, "away")
    while calls(run.id, "unavailable") < 1:
        await asyncio.sleep(0.05)
    await asyncio.sleep(6.5)  # tries at ~0, 1, 3 and 7 s (every second: 7 or 8 by now)
    tried = calls(run.id, "unavailable")
    assert 2 <= tried <= 4, tried
    assert str((await h.store.workflows.get_workflow_run(run.id)).status) == "running"
    await h.workflows.cancel(run.id, tenant=h.tenant, by=OWNER)


async def test_a_gate_says_what_is_approved_from_the_state(h: Harness) -> None:
    """A first-hour walkthrough: the gate's form said "approve the payout" and nothing of
    the amount. A reason may be written from the run's state when the gate opens; one
    whose function fails fails the run at the gate, as a step that raises does."""
    run = await parked(h, "said")
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    assert interrupts[-1].reason == "Approve the payout of R$ 120"
    broken = await start(h, "unsaid")
    failed = await until(status_is(h, broken.id, "failed"), what="fail at the gate")
    assert "failed" in (failed.error or "") and "KeyError" in (failed.error or "")
