"""A workflow event's own id (`event_id`, design note 65): sent again, it applies nothing.

A hostile probe: a provider whose event got no answer (a gateway killed after the commit,
a timeout) and sent it again had it applied twice: one payment confirmation passed both
gates of a two-installment workflow, or was kept and consumed by the second gate. With an
event id the retry is answered as the first delivery was, and nothing more happens.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from signoff.runtime.config import Settings
from signoff.runtime.errors import InvalidInput
from signoff.runtime.models.command import CommandModel
from signoff.testing import Harness
from tests.integration import wf_app
from tests.integration.wf_app import calls, release
from tests.integration.wf_kit import OWNER, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PAID = "payment.confirmed"


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    settings = Settings(lease_seconds=2.0, poll_seconds=0.3, sweep_seconds=0.2)
    async with Harness(
        wf_app.build(), database_url=database_url, model=CommandModel(), settings=settings,
        gateway=True,
    ) as harness:  # fmt: skip
        yield harness


async def status_at(h: Harness, run_id: str, status: str, step: int) -> bool:
    run = await h.store.workflows.get_workflow_run(run_id)
    return str(run.status) == status and run.step == step


async def test_an_event_sent_again_passes_one_gate_not_two(h: Harness) -> None:
    run = await h.workflows.start("installments", tenant=h.tenant, owner=OWNER)
    await until(lambda: status_at(h, run.id, "awaiting_event", 0), what="parked at gate 1")
    pay = {"amount": 100, "reference": "PIX-1"}
    first = await h.workflows.deliver_event(
        run.id, PAID, pay, tenant=h.tenant, by=OWNER, event_id="pix-1"
    )
    assert not first.buffered and not first.repeated
    await until(lambda: status_at(h, run.id, "awaiting_event", 2), what="parked at gate 2")
    again = await h.workflows.deliver_event(
        run.id, PAID, pay, tenant=h.tenant, by=OWNER, event_id="pix-1"
    )
    assert again.repeated and not again.buffered  # answered as the first: passed
    await asyncio.sleep(0.5)
    assert await status_at(h, run.id, "awaiting_event", 2)  # still waiting for the second
    assert calls(run.id, "second_paid") == 0
    second = await h.workflows.deliver_event(
        run.id, PAID, {"amount": 100, "reference": "PIX-2"}, tenant=h.tenant, by=OWNER,
        event_id="pix-2",
    )  # fmt: skip
    assert not second.repeated
    await until(lambda: status_at(h, run.id, "completed", 4), what="both installments")
    assert (calls(run.id, "first_paid"), calls(run.id, "second_paid")) == (1, 1)


async def test_a_kept_event_sent_again_is_kept_once(h: Harness) -> None:
    run = await h.workflows.start("order", tenant=h.tenant, owner=OWNER)  # lookback 30 s
    await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
    answers = [
        await h.workflows.deliver_event(
            run.id, PAID, {"amount": 5}, tenant=h.tenant, by=OWNER, event_id="pix-k"
        )
        for _ in range(3)
    ]
    assert [(a.buffered, a.repeated) for a in answers] == [(True, False)] + [(True, True)] * 2
    kept = await h.store.db.fetchval(
        "SELECT count(*) FROM workflow_events WHERE run_id = $1", uuid.UUID(run.id)
    )
    assert kept == 1
    release(run.id)
    await until(lambda: status_at(h, run.id, "completed", 3), what="the kept event consumed")


async def test_racing_deliveries_of_one_event_apply_it_once(h: Harness) -> None:
    run = await h.workflows.start("installments", tenant=h.tenant, owner=OWNER)
    await until(lambda: status_at(h, run.id, "awaiting_event", 0), what="parked at gate 1")
    answers = await asyncio.gather(
        *(
            h.workflows.deliver_event(
                run.id, PAID, {"amount": 1}, tenant=h.tenant, by=OWNER, event_id="pix-r"
            )
            for _ in range(10)
        )
    )
    assert sorted(a.repeated for a in answers) == [False] + [True] * 9
    await until(lambda: status_at(h, run.id, "awaiting_event", 2), what="parked at gate 2")
    await asyncio.sleep(0.5)
    assert await status_at(h, run.id, "awaiting_event", 2)
    assert calls(run.id, "first_paid") == 1


async def test_an_event_id_names_one_event_and_has_a_shape(h: Harness) -> None:
    run = await h.workflows.start("installments", tenant=h.tenant, owner=OWNER)
    await until(lambda: status_at(h, run.id, "awaiting_event", 0), what="parked at gate 1")
    for bad in ("", "a b", "x" * 101, "é", 5):
        with pytest.raises(InvalidInput):
            await h.workflows.deliver_event(
                run.id,
                PAID,
                {"amount": 1},
                tenant=h.tenant,
                by=OWNER,
                event_id=bad,  # type: ignore[arg-type]
            )
    await h.workflows.deliver_event(
        run.id, PAID, {"amount": 1}, tenant=h.tenant, by=OWNER, event_id="e-1"
    )
    await until(lambda: status_at(h, run.id, "awaiting_event", 2), what="parked at gate 2")
    with pytest.raises(InvalidInput):  # another event under the same id: refused
        await h.workflows.deliver_event(
            run.id, "other.event", {}, tenant=h.tenant, by=OWNER, event_id="e-1"
        )
    assert await status_at(h, run.id, "awaiting_event", 2)


async def test_over_http_a_repeat_is_answered_as_the_first_and_said_so(h: Harness) -> None:
    run = await h.workflows.start("installments", tenant=h.tenant, owner=OWNER)
    await until(lambda: status_at(h, run.id, "awaiting_event", 0), what="parked at gate 1")
    svc = {"Authorization": f"Bearer {h.tokens.issue('payments', h.tenant, 'service')}"}
    url = f"{h.base_url}/v1/workflow-runs/{run.id}/events"
    event = {"name": PAID, "payload": {"amount": 9}, "event_id": "pix-h"}
    async with httpx.AsyncClient(timeout=30) as http:
        first = await http.post(url, json=event, headers=svc)
        assert first.status_code == 200 and first.json()["delivered"] == "passed", first.text
        assert "repeated" not in first.json()
        again = await http.post(url, json=event, headers=svc)
        assert again.status_code == 200, again.text
        assert again.json()["delivered"] == "passed" and again.json()["repeated"] is True
        bad = await http.post(url, json={**event, "event_id": "a b"}, headers=svc)
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_input", bad.text


async def test_an_integer_beyond_what_json_readers_agree_on_is_refused(h: Harness) -> None:
    """A hostile probe stored 10**40 as a payment's amount (the schema said `int`): a
    JavaScript client or an audit tool would read another number. Refused with a 422 that
    says why, and nothing is applied or kept; 2**53 - 1 still passes."""
    run = await h.workflows.start("installments", tenant=h.tenant, owner=OWNER)
    await until(lambda: status_at(h, run.id, "awaiting_event", 0), what="parked at gate 1")
    svc = {"Authorization": f"Bearer {h.tokens.issue('payments', h.tenant, 'service')}"}
    url = f"{h.base_url}/v1/workflow-runs/{run.id}/events"
    headers = {**svc, "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=30) as http:
        huge = b'{"name": "%s", "payload": {"amount": 1%s}}' % (PAID.encode(), b"0" * 40)
        bad = await http.post(url, content=huge, headers=headers)
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_input", bad.text
        assert "out of range" in bad.json()["message"], bad.text
        negative = huge.replace(b": 1", b": -1")
        assert (await http.post(url, content=negative, headers=headers)).status_code == 422
        await asyncio.sleep(0.3)
        assert await status_at(h, run.id, "awaiting_event", 0)  # nothing passed, nothing kept
        fine = {"name": PAID, "payload": {"amount": 2**53 - 1}}
        ok = await http.post(url, json=fine, headers=svc)
        assert ok.status_code == 200 and ok.json()["delivered"] == "passed", ok.text
    await until(lambda: status_at(h, run.id, "awaiting_event", 2), what="parked at gate 2")
