"""The helpdesk example (examples/helpdesk): its tools, policy and offline model, run by a
real worker on real Postgres with its own offline model. (Its HTTP path through
`signoff dev --app examples.helpdesk:app` is in tests/e2e/test_apps.py.)"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from examples.helpdesk import app as helpdesk_app
from examples.helpdesk.data import Shop
from examples.helpdesk.model import understand
from examples.helpdesk.tools import parse_dollars
from signoff import App, Risk, ToolValidationError, Verdict
from signoff.runtime.bus_memory import MemoryBus
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Decisions, Resolution
from signoff.runtime.keys import Keys
from signoff.runtime.worker import Worker
from signoff.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio


@dataclass
class Desk:
    app: App
    shop: Shop
    store: PostgresStore
    worker: Worker
    decisions: Decisions
    tenant: str

    async def say(self, user: str, text: str, thread: str | None = None) -> str:
        thread = thread or (await self.store.create_thread(self.tenant, user)).id
        await self.worker.run_message(thread, text, user=user)
        return thread

    async def card(self, thread: str) -> Card:
        (card,) = await self.store.pending_cards(thread)
        return card

    async def decide(self, card: Card, decision: Decision, **kw: Any) -> Any:
        res = Resolution(decision=decision, snapshot_hash=card.snapshot_hash, **kw)
        return await self.decisions.resolve(card.id, res, principal=card.owner, channel="test")

    async def settled(self, card: Card) -> Card:
        """The card once its run is over (executed, invalidated ... and the reply written)."""
        deadline = asyncio.get_running_loop().time() + 10
        while (await self.store.get_run(card.run_id)).status not in ("done", "failed"):
            assert asyncio.get_running_loop().time() < deadline, "the run did not finish"
            await asyncio.sleep(0.05)
        return await self.store.get_card(card.id)

    async def reply(self, thread: str) -> str:
        entries = await self.store.conversation(thread)
        blocks = entries[-1].body.get("content", [])
        return " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")

    async def order(self, user: str, order_id: str) -> dict[str, Any]:
        order = await self.shop.order(self.tenant, user, order_id)
        assert order is not None
        return order


@asynccontextmanager
async def desk(database_url: str) -> AsyncIterator[Desk]:
    tenant = "hd-" + secrets.token_hex(4)
    settings = Settings(
        database_url=database_url,
        worker_id="hd-" + secrets.token_hex(3),
        tenant=tenant,
        poll_seconds=1.0,
        sweep_seconds=0.5,
    )
    store = await PostgresStore.connect(database_url, max_size=10)
    bus = MemoryBus()
    app = helpdesk_app()
    assert app.setup is not None and app.offline_model is not None
    shop = await app.setup(database_url)
    app.services = shop
    worker = Worker(settings=settings, store=store, bus=bus, app=app, model=app.offline_model)
    decisions = Decisions(
        store=store, bus=bus, tools=app.tools, policy=app.policy, keys=Keys(), services=shop
    )
    await worker.start()
    try:
        yield Desk(app, shop, store, worker, decisions, tenant)
    finally:
        await worker.stop()
        await store._pool.execute(
            "UPDATE runs SET status = 'superseded' WHERE tenant = $1"
            " AND status IN ('running', 'waiting')",
            tenant,
        )
        await bus.close()
        if app.teardown is not None:
            await app.teardown()
        await store.close()


def test_the_offline_model_understands_the_four_requests() -> None:
    def call(text: str) -> tuple[str, dict[str, Any]] | None:
        use = understand(text)
        return None if use is None else (use["name"], use["input"])

    assert call("where is order A101?") == ("look_up_order", {"order_id": "A101"})
    assert call("refund $10 of order a100, it arrived broken") == (
        "refund_order",
        {"order_id": "A100", "reason": "it arrived broken", "amount": "10"},
    )
    assert call("please ship A101 to 12 Oak Street, Leeds") == (
        "change_delivery_address",
        {"order_id": "A101", "address": "12 Oak Street, Leeds"},
    )
    assert call("close my account because I'm moving") == (
        "close_account",
        {"reason": "I'm moving"},
    )
    assert call("hello") is None


def test_amounts_and_the_refund_limit() -> None:
    assert parse_dollars("$1,200.50") == 120_050 and parse_dollars("12.5") == 1250
    for bad in ("0", "-1", "ten", "1.234", "nan"):
        with pytest.raises(ToolValidationError):
            parse_dollars(bad)
    app = helpdesk_app()
    refund = app.tools.get("refund_order")
    assert refund is not None and refund.risk is Risk.CRITICAL
    big = app.policy.evaluate(refund, {"amount_cents": 60_000}, tenant="t")
    assert big.verdict is Verdict.DENY and "human agent" in big.reason
    assert app.policy.unruled_writes(app.tools) == []


async def test_a_refund_is_confirmed_on_a_card_then_executed_once(database_url: str) -> None:
    async with desk(database_url) as d:
        thread = await d.say("ana", "refund order A100, it arrived broken")
        card = await d.card(thread)
        assert card.tool == "refund_order" and card.risk is Risk.CRITICAL
        assert card.summary == (
            "Refund $25.00 for order A100 (Wireless mouse) to the original payment method"
        )
        assert card.impact["fields"] == [{"label": "Reason", "value": "it arrived broken"}]
        # critical cards wait five minutes at most (the helpdesk's policy)
        assert (card.expires_at - card.created_at).total_seconds() == pytest.approx(300, abs=2)
        assert (await d.order("ana", "A100"))["refunded_cents"] == 0

        await d.decide(card, Decision.APPROVE)
        done = await d.settled(card)
        assert done.status is Status.EXECUTED
        assert done.result == {
            "refunded": "$25.00",
            "order_id": "A100",
            "operation_id": card.operation_id,
        }
        assert (await d.order("ana", "A100"))["refunded_cents"] == 2500
        assert await d.shop.operations(d.tenant, "ana") == 1
        assert "Done." in await d.reply(thread)

        # nothing left to refund: prepare refuses, no card, the model is told why
        again = await d.say("ana", "refund order A100 please")
        assert await d.store.pending_cards(again) == []
        assert "already refunded in full" in await d.reply(again)


async def test_an_address_change_can_be_edited_and_a_shipped_order_refuses_it(
    database_url: str,
) -> None:
    async with desk(database_url) as d:
        thread = await d.say("bo", "change the address of A101 to 12 Oak Street, Leeds")
        card = await d.card(thread)
        assert card.summary == "Change the delivery address of order A101 (Mechanical keyboard)"
        assert [f["label"] for f in card.impact["fields"]] == ["From", "To"]
        assert card.editable == ["address"]
        out = await d.decide(card, Decision.EDIT, edits={"address": "14 Oak Street, Leeds"})
        edited = await d.store.get_card(out.new_card["id"])
        assert edited.args_snapshot["address"] == "14 Oak Street, Leeds"
        await d.decide(edited, Decision.APPROVE)
        assert (await d.settled(edited)).status is Status.EXECUTED
        assert (await d.order("bo", "A101"))["address"] == "14 Oak Street, Leeds"

        shipped = await d.say("bo", "ship A102 to 1 Elm Road, York")
        assert await d.store.pending_cards(shipped) == []
        assert "already shipped" in await d.reply(shipped)


async def test_an_approved_refund_is_checked_again_before_it_runs(database_url: str) -> None:
    async with desk(database_url) as d:
        thread = await d.say("cy", "refund $20 of order A102, wrong colour")
        card = await d.card(thread)
        assert card.args_snapshot == {
            "order_id": "A102",
            "amount_cents": 2000,
            "reason": "wrong colour",
        }
        # meanwhile, a colleague refunded most of the order
        await d.shop.pool.execute(
            "UPDATE helpdesk_orders SET refunded_cents = 14000"
            " WHERE tenant = $1 AND customer = 'cy' AND id = 'A102'",
            d.tenant,
        )
        await d.decide(card, Decision.APPROVE)
        done = await d.settled(card)
        assert done.status is Status.INVALIDATED
        assert (
            done.result is not None and done.result["reason"] == "the order was refunded meanwhile"
        )
        assert await d.shop.operations(d.tenant, "cy") == 0


async def test_closing_the_account_rejected_then_approved(database_url: str) -> None:
    async with desk(database_url) as d:
        thread = await d.say("di", "close my account, I'm moving away")
        card = await d.card(thread)
        assert card.summary == "Close the account of di (di@example.com) for good"
        await d.decide(card, Decision.REJECT, reason="changed my mind")
        assert (await d.settled(card)).status is Status.REJECTED
        assert (await d.shop.account(d.tenant, "di"))["status"] == "open"

        thread = await d.say("di", "close my account")
        card = await d.card(thread)
        await d.decide(card, Decision.APPROVE)
        assert (await d.settled(card)).status is Status.EXECUTED
        assert (await d.shop.account(d.tenant, "di"))["status"] == "closed"


async def test_a_look_up_runs_at_once_and_shows_only_the_users_own_orders(
    database_url: str,
) -> None:
    async with desk(database_url) as d:
        thread = await d.say("ed", "where is order A101?")
        assert await d.store.pending_cards(thread) == []
        reply = await d.reply(thread)
        assert "A101 (Mechanical keyboard, $89.00) is processing" in reply
        missing = await d.say("ed", "where is order Z999?")
        assert "there is no order Z999 for ed" in await d.reply(missing)
