"""A Redis outage right after a commit never fails the step that committed (issue 10,
item 4; DESIGN.md §9: a hint never fails a step after its commit).

Redis (a private server behind the TCP proxy) is cut between ``approved -> executing``
and the provider call: the thread hint published after the move fails, and the
provider is still called, once; the card ends ``executed`` within seconds.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import httpx
import pytest
import redis.asyncio

from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Resolution
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS
from signoff.testing import FakeGraphAPI, delivery, signed, text_message
from signoff.testing.servers import EmbeddedServer
from tests.faults.conftest import Invariants
from tests.faults.proxy import Proxy
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix
from tests.integration.test_whatsapp_delivery import post as wa_post
from tests.integration.test_whatsapp_sim_scope import (
    TOKEN,
    approvals,
    channel,
    effect_of,
    one_card_shown,
)

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

            async def begin_then_cut(
                card_id: str,
                actor: str,
                holder: str | None = None,
                in_flight_seconds: float | None = None,
                attempt: str | None = None,
            ) -> Any:
                # committed: approved -> executing
                moved = await begin(card_id, actor, holder, in_flight_seconds, attempt)
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
            # The hints after the cut failed, were counted and did not stop the step (the
            # `executing` hint goes beside the provider call: it may be counted just after).
            while COUNTERS.values["signoff_hints_failed_total"] == failed_before:
                assert loop.time() < deadline, "no failed hint counted"
                await asyncio.sleep(0.05)
            assert COUNTERS.values["signoff_redis_errors_total"] > errors_before
            proxy.heal()
            await h.settle()
            # The worker's subscription was lost with the connection: once Redis is back
            # it is opened again, and the metric says so.
            while COUNTERS.values["signoff_pubsub_reconnects_total"] == reconnects_before:
                assert loop.time() < deadline + 20, "no pub/sub reconnect counted"
                await asyncio.sleep(0.05)
            await invariants.check()


async def test_redis_cut_right_after_a_message_started_its_run_runs_it_once(
    database_url: str, valkey: EmbeddedServer, invariants: Invariants
) -> None:
    """The inbox entry is taken, its run committed (the old ones superseded), then Redis
    goes: the run goes on without it (its card is proposed), the entry can be neither
    acked nor handed back, and once Redis is back its redelivery finds that run (I5):
    one run, one card, one charge, nothing left pending in the inbox."""
    keys = Keys(f"blip-{secrets.token_hex(3)}:")
    settings = Settings(claim_idle_ms=300)
    with Proxy(valkey.port) as proxy:
        # The bus the test builds takes the claim idle time as the node's does (without it,
        # the redelivery came after 30 s: the test passed only while the hints' retries
        # held the ack back until Redis was back).
        bus = RedisBus.from_url(proxy.url_for(valkey.url), keys, claim_idle_ms=300)
        async with harness(database_url, model=Scripted(pix()), bus=bus, settings=settings) as h:
            invariants.watch(database_url, h.tenant)
            start = h.store.start_run
            cut = asyncio.Event()

            async def start_then_cut(*args: Any, **kwargs: Any) -> Any:
                started = await start(*args, **kwargs)  # committed
                if not cut.is_set():
                    cut.set()
                    proxy.refuse(True)
                    proxy.reset()
                return started

            h.store.start_run = start_then_cut
            thread = await h.thread("alice")
            job = h.message(thread, "alice")
            await bus.enqueue(job)
            await asyncio.wait_for(cut.wait(), 10)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while not (cards := await h.store.pending_cards(thread)):
                assert loop.time() < deadline, "the run did not go on without Redis"
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # past the claim idle time, Redis still gone
            proxy.heal()

            direct = redis.asyncio.Redis.from_url(valkey.url)
            try:
                deadline = loop.time() + 20
                while int((await direct.xpending(keys.inbox, keys.inbox_group))["pending"]):
                    assert loop.time() < deadline, "the inbox entry stayed pending"
                    await asyncio.sleep(0.1)
            finally:
                await direct.aclose()
            runs = await h.store.pool.fetchval(
                "SELECT count(*) FROM runs WHERE thread_id = $1::uuid", thread
            )
            assert runs == 1
            assert len(await h.store.pending_cards(thread)) == 1
            await h.decide(cards[0], Decision.APPROVE)
            deadline = loop.time() + 10
            while (await h.store.get_card(cards[0].id)).status is not Status.EXECUTED:
                assert loop.time() < deadline, await h.store.get_card(cards[0].id)
                await asyncio.sleep(0.05)
            assert await h.charges() == 1
            await h.settle()
            await invariants.check()


async def test_whatsapp_message_while_redis_is_down_is_refused_then_redelivered_once(
    database_url: str, valkey: EmbeddedServer, invariants: Invariants
) -> None:
    """A WhatsApp text arriving while the inbox is unreachable gets a typed 503 and is
    not recorded as seen, so Meta's redelivery after Redis is back queues it, once."""
    keys = Keys(f"wa-blip-{secrets.token_hex(3)}:")
    secret = "wa-secret"
    settings = Settings(
        whatsapp_phone_number_id="100",
        whatsapp_token="wa-token",
        whatsapp_app_secret=secret,
        whatsapp_verify_token="verify",
        whatsapp_base_url="http://127.0.0.1:9",
    )
    with Proxy(valkey.port) as proxy:
        bus = RedisBus.from_url(proxy.url_for(valkey.url), keys)
        async with harness(
            database_url,
            model=Scripted(pix()),
            bus=bus,
            settings=settings,
            gateway=True,
            start_worker=False,
        ) as h:
            invariants.watch(database_url, h.tenant)
            message = text_message("5511" + str(secrets.randbelow(10**9)).zfill(9), "saldo")
            body = delivery(message)

            async def post() -> httpx.Response:
                async with httpx.AsyncClient(base_url=h.base_url, timeout=30) as client:
                    return await client.post(
                        "/v1/whatsapp/webhook", content=body, headers=signed(body, secret)
                    )

            proxy.refuse(True)
            proxy.reset()
            down = await post()
            assert down.status_code == 503, down.text
            assert down.json()["error"] == "unavailable"
            rows = "SELECT count(*) FROM deliveries WHERE channel = 'whatsapp' AND message_id = $1"
            # Nothing was chosen for it (text confirmation off): its row is gone, so a
            # gateway of any version takes the redelivery as new.
            assert await h.store.pool.fetchval(rows, message["id"]) == 0
            seen = rows + " AND handled"
            proxy.heal()
            assert (await post()).status_code == 200
            assert (await post()).status_code == 200  # a duplicate redelivery: ignored
            assert await h.store.pool.fetchval(seen, message["id"]) == 1
            direct = redis.asyncio.Redis.from_url(valkey.url)
            try:
                assert await direct.xlen(keys.inbox) == 1
            finally:
                await direct.aclose()


async def test_an_approve_all_while_redis_is_down_runs_each_card_once_side_by_side(
    database_url: str,
    valkey: EmbeddedServer,
    invariants: Invariants,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An "approve all" committed while Redis is unreachable: the person is answered
    (a hint never fails the commit), no signal reaches the worker, and its slow poll
    claims both cards, each on its own (design note 60): the second runs while the
    first's provider call hangs, each runs once, and the model is told once."""
    from tests.integration.test_sibling_approvals import Held, operations, two_cards

    keys = Keys(f"blip-all-{secrets.token_hex(3)}:")
    model = Scripted(pix("10"), pix("20", "Maria"))
    with Proxy(valkey.port) as proxy:
        bus = RedisBus.from_url(proxy.url_for(valkey.url), keys)
        async with harness(
            database_url, model=model, bus=bus, settings=Settings(poll_seconds=0.2)
        ) as h:
            invariants.watch(database_url, h.tenant)
            _, first, second = await two_cards(h)
            held = Held(h, monkeypatch, snapshot=first.args_snapshot)
            proxy.refuse(True)
            proxy.reset()
            failed = COUNTERS.values["signoff_hints_failed_total"]
            outcome = await h.decisions.resolve_batch(
                first.run_id,
                [
                    (c.id, Resolution(decision=Decision.APPROVE, snapshot_hash=c.snapshot_hash))
                    for c in (first, second)
                ],
                principal="alice",
                channel="test",
            )
            assert [o["card"]["status"] for o in outcome] == ["approved"] * 2, outcome
            assert COUNTERS.values["signoff_hints_failed_total"] > failed
            await asyncio.wait_for(held.entered.wait(), 10)  # found by the poll
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while (await h.store.get_card(second.id)).status is not Status.EXECUTED:
                assert loop.time() < deadline, "the second card waited for the first"
                await asyncio.sleep(0.05)
            calls = model.calls
            held.release.set()
            deadline = loop.time() + 10
            while (await h.store.get_card(first.id)).status is not Status.EXECUTED:
                assert loop.time() < deadline, await h.store.get_card(first.id)
                await asyncio.sleep(0.05)
            proxy.heal()
            await h.settle()
            assert await operations(h, first.id) == 1 and await operations(h, second.id) == 1
            assert await h.charges() == 2
            assert model.calls == calls + 1  # told once, of both results
            run = await h.store.get_run(first.run_id)
            assert run.status.value == "done", run
            await invariants.check()


async def test_a_worker_stopping_while_redis_is_down_drains_and_hands_its_runs_over(
    database_url: str,
    valkey: EmbeddedServer,
    invariants: Invariants,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGTERM'd worker with Redis unreachable: its parked run is handed over as the
    stop begins and its card in flight is let finish (neither needs Redis: the wait
    tokens it cannot clear expire), and the stop ends within its drain."""
    from signoff.runtime import drain
    from tests.integration.test_sibling_approvals import Held, operations

    monkeypatch.setattr(drain, "DRAIN_SECONDS", 0.2)
    keys = Keys(f"blip-stop-{secrets.token_hex(3)}:")
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=5.0)
    with Proxy(valkey.port) as proxy:
        bus = RedisBus.from_url(proxy.url_for(valkey.url), keys)
        async with harness(database_url, model=Scripted(pix()), bus=bus, settings=settings) as h:
            invariants.watch(database_url, h.tenant)
            parked = await one_card(h)
            running = await one_card(h, "bob")
            held = Held(h, monkeypatch)
            await h.decide(running, Decision.APPROVE)
            await asyncio.wait_for(held.entered.wait(), 10)
            proxy.refuse(True)
            proxy.reset()
            loop = asyncio.get_running_loop()
            loop.call_later(1.5, held.release.set)  # past the lease: still held
            began = loop.time()
            await asyncio.wait_for(h.worker.stop(), 15)
            assert loop.time() - began < 5.0 + 5.0  # the tool deadline and its margin
            assert (await h.store.get_card(running.id)).status is Status.EXECUTED
            assert await operations(h, running.id) == 1
            held_by = "SELECT worker_id FROM runs WHERE id = $1::uuid"
            for card in (parked, running):
                assert await h.store.pool.fetchval(held_by, card.run_id) is None
            proxy.heal()
            await h.worker.start()  # the worker back (as another would): it goes on
            await h.decide(parked, Decision.APPROVE)
            deadline = loop.time() + 10
            while (await h.store.get_card(parked.id)).status is not Status.EXECUTED:
                assert loop.time() < deadline, await h.store.get_card(parked.id)
                await asyncio.sleep(0.05)
            await h.settle()
            assert await h.charges() == 2
            await invariants.check()


async def test_a_sim_after_a_request_refused_while_redis_was_down_is_a_message(
    database_url: str, valkey: EmbeddedServer, invariants: Invariants
) -> None:
    """Text confirmation with Redis down under the write path: a new request written
    after card A was shown is refused (503: the inbox is unreachable; Meta sends it again
    later), yet it was written, so a "sim" written after it, once Redis is back, is not
    about A: a message, and A is not approved."""
    keys = Keys(f"wa-sim-{secrets.token_hex(3)}:")
    with FakeGraphAPI(token=TOKEN) as graph, Proxy(valkey.port) as proxy:
        bus = RedisBus.from_url(proxy.url_for(valkey.url), keys)
        async with channel(database_url, graph, bus=bus) as h:
            invariants.watch(database_url, h.tenant)
            wa_id, _, first = await one_card_shown(h)
            await asyncio.sleep(1.1)
            proxy.refuse(True)
            proxy.reset()
            newer = text_message(wa_id, "cobre 90 do João")
            assert (await wa_post(h, delivery(newer))).status_code == 503
            proxy.heal()
            await asyncio.sleep(1.1)
            sim = text_message(wa_id, "sim")
            assert (await wa_post(h, delivery(sim))).status_code == 200
            assert await effect_of(h, sim["id"]) == "message"
            assert await approvals(h, first) == 0
