"""Workflow events with an ``event_id`` while Redis refuses connections (design note 65).

The event, its id's record and what it did commit together in Postgres; the hint that
wakes the run's worker comes after and may fail. With Redis down a delivery must still
be answered at once (never an error after its commit: the provider would send it again),
a repeat of the same id must still be answered as the first, and the run must go on
through the worker's poll, each gate passing once.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator

import pytest

from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.config import Settings
from signoff.runtime.keys import Keys
from signoff.runtime.models.command import CommandModel
from signoff.testing import Harness
from signoff.testing.servers import EmbeddedServer
from tests.faults.conftest import Invariants
from tests.faults.proxy import Proxy
from tests.integration import wf_app
from tests.integration.wf_app import calls
from tests.integration.wf_kit import OWNER, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

PAID = "payment.confirmed"


@pytest.fixture
async def proxied(
    database_url: str, valkey: EmbeddedServer, invariants: Invariants
) -> AsyncIterator[tuple[Harness, Proxy, RedisBus]]:
    keys = Keys(f"wfdown-{secrets.token_hex(3)}:")
    with Proxy(valkey.port) as proxy:
        bus = RedisBus.from_url(proxy.url_for(valkey.url), keys)
        settings = Settings(lease_seconds=2.0, poll_seconds=0.2, sweep_seconds=0.2)
        async with Harness(
            wf_app.build(), database_url=database_url, model=CommandModel(),
            settings=settings, bus=bus,
        ) as h:  # fmt: skip
            invariants.watch(database_url, h.tenant)
            yield h, proxy, bus


async def status_at(h: Harness, run_id: str, status: str, step: int) -> bool:
    run = await h.store.workflows.get_workflow_run(run_id)
    return str(run.status) == status and run.step == step


async def test_events_with_ids_during_an_outage_apply_once_and_the_run_goes_on(
    proxied: tuple[Harness, Proxy, RedisBus],
) -> None:
    h, proxy, bus = proxied
    run = await h.workflows.start("installments", tenant=h.tenant, owner=OWNER)
    await until(lambda: status_at(h, run.id, "awaiting_event", 0), what="parked at gate 1")

    proxy.refuse(True)
    proxy.reset()
    pay = {"amount": 100, "reference": "PIX-1"}
    took = []
    for _ in range(3):  # the provider sends it again: no answer reached it, say
        t0 = time.monotonic()
        passed = await h.workflows.deliver_event(
            run.id, PAID, pay, tenant=h.tenant, by=OWNER, event_id="pix-1"
        )
        took.append(time.monotonic() - t0)
        assert not passed.buffered
    assert max(took[1:]) < 0.5, took  # one call's tries at most, then one try each
    # Found by the worker's poll, not by the hint: gate 1 passed once, then gate 2 waits.
    await until(lambda: status_at(h, run.id, "awaiting_event", 2), what="gate 2, in the outage")
    again = await h.workflows.deliver_event(
        run.id, PAID, pay, tenant=h.tenant, by=OWNER, event_id="pix-1"
    )
    assert again.repeated
    await asyncio.sleep(0.6)  # three polls: nothing more passes
    assert await status_at(h, run.id, "awaiting_event", 2)
    assert calls(run.id, "first_paid") == 1 and calls(run.id, "second_paid") == 0
    assert bus.client.failing

    proxy.heal()
    second = await h.workflows.deliver_event(
        run.id, PAID, {"amount": 100, "reference": "PIX-2"}, tenant=h.tenant, by=OWNER,
        event_id="pix-2",
    )  # fmt: skip
    assert not second.repeated and not second.buffered
    await until(lambda: status_at(h, run.id, "completed", 4), what="completed after the outage")
    assert calls(run.id, "first_paid") == 1 and calls(run.id, "second_paid") == 1
