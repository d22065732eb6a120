"""A Redis outage right after a commit never fails the step that committed (issue 10,
item 4; DESIGN.md §9: a hint never fails a step after its commit).

Redis (a private server behind the TCP proxy) is cut between ``approved -> executing``
and the provider call: the thread hint published after the move fails, and the
provider is still called, once; the card ends ``executed`` within seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Decision, Status
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS
from signoff.testing.servers import EmbeddedServer
from tests.faults.conftest import Invariants
from tests.faults.proxy import Proxy
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def test_redis_cut_between_executing_and_the_provider_call_executes_once(
    database_url: str, valkey: EmbeddedServer, invariants: Invariants
) -> None:
    with Proxy(valkey.port) as proxy:
        bus = RedisBus.from_url(proxy.url_for(valkey.url), Keys("blip:"))
        async with harness(database_url, model=Scripted(pix()), bus=bus) as h:
            invariants.watch(database_url, h.tenant)
            card = await one_card(h)
            begin = h.store.begin_execution

            async def begin_then_cut(card_id: str, actor: str) -> Any:
                moved = await begin(card_id, actor)  # committed: approved -> executing
                proxy.refuse(True)  # Redis is gone from here on
                proxy.reset()
                return moved

            h.store.begin_execution = begin_then_cut
            failed_before = COUNTERS.values["signoff_hints_failed_total"]
            errors_before = COUNTERS.values["signoff_redis_errors_total"]
            reconnects_before = COUNTERS.values["signoff_pubsub_reconnects_total"]
            await h.decide(card, Decision.APPROVE)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while (await h.store.get_card(card.id)).status is not Status.EXECUTED:
                assert loop.time() < deadline, await h.store.get_card(card.id)
                await asyncio.sleep(0.05)
            assert await h.charges() == 1
            final = await h.store.get_card(card.id)
            assert not final.needs_reconciliation
            assert COUNTERS.values["signoff_hints_failed_total"] > failed_before
            assert COUNTERS.values["signoff_redis_errors_total"] > errors_before
            proxy.heal()
            await h.settle()
            # The worker's subscription was lost with the connection: once Redis is back
            # it is opened again, and the metric says so.
            while COUNTERS.values["signoff_pubsub_reconnects_total"] == reconnects_before:
                assert loop.time() < deadline + 20, "no pub/sub reconnect counted"
                await asyncio.sleep(0.05)
            await invariants.check()
