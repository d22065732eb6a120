"""A user's own test suite: a tiny shop app, tested with ``signoff.testing`` only.

Everything here imports ``signoff`` (the public API) and ``signoff.testing``, as an
application's tests would; nothing from signoff's internals or from this repository's
test helpers. The harness runs on a fresh database of an embedded Postgres (or the server
named by ``$SIGNOFF_TEST_DATABASE_URL``).
"""

from __future__ import annotations

from typing import Any, cast

import asyncpg
import httpx
import msgspec
import pytest

from signoff import (
    App,
    NotOwner,
    Policy,
    Prepared,
    Registry,
    Revalidation,
    Risk,
    Rule,
    Tool,
    ToolContext,
    ToolValidationError,
    Verdict,
)
from signoff.testing import Harness, reply, text, tool_use

pytestmark = pytest.mark.anyio

# -- the app under test ----------------------------------------------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS shop_orders (
    tenant text NOT NULL, id text NOT NULL, amount_cents bigint NOT NULL,
    status text NOT NULL DEFAULT 'paid', PRIMARY KEY (tenant, id));
CREATE TABLE IF NOT EXISTS shop_refunds (
    operation_id text PRIMARY KEY, tenant text NOT NULL, order_id text NOT NULL,
    amount_cents bigint NOT NULL);
"""


class Shop:
    """The app's own service: orders and refunds in the same Postgres."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def order(self, tenant: str, order_id: str) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(
            "SELECT id, amount_cents, status FROM shop_orders WHERE tenant = $1 AND id = $2",
            tenant,
            order_id,
        )
        return dict(row) if row else None

    async def add_order(self, tenant: str, order_id: str, amount_cents: int) -> None:
        await self.pool.execute(
            "INSERT INTO shop_orders (tenant, id, amount_cents) VALUES ($1, $2, $3)",
            tenant,
            order_id,
            amount_cents,
        )

    async def refunds(self, tenant: str) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(
            "SELECT order_id, amount_cents FROM shop_refunds WHERE tenant = $1", tenant
        )
        return [dict(r) for r in rows]


class OrderIn(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str


class RefundIn(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str
    amount_cents: int | None = None


class OrderStatus(Tool):
    name = "order_status"
    description = "Look an order up."
    risk = Risk.READ
    input_type = OrderIn

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        order = await ctx.services.order(ctx.tenant, args["order_id"])
        return order or {"error": "no such order"}


class RefundOrder(Tool):
    name = "refund_order"
    description = "Refund an order, fully or in part. Needs confirmation."
    risk = Risk.CRITICAL
    input_type = RefundIn
    editable = frozenset({"amount_cents"})

    async def prepare(self, data: Any, ctx: ToolContext) -> Prepared:
        order = await ctx.services.order(ctx.tenant, data.order_id)
        if order is None or order["status"] != "paid":
            raise ToolValidationError(f"order {data.order_id} cannot be refunded")
        amount = data.amount_cents or order["amount_cents"]
        if not 0 < amount <= order["amount_cents"]:
            raise ToolValidationError("the amount must be between 1 and the order's amount")
        return Prepared(
            args={"order_id": data.order_id, "amount_cents": amount},
            summary=f"Refund {amount / 100:.2f} EUR on order {data.order_id}",
            impact={"amount_cents": amount, "reversible": False},
        )

    async def revalidate(self, args: dict[str, Any], ctx: ToolContext) -> Revalidation:
        order = await ctx.services.order(ctx.tenant, args["order_id"])
        status = order["status"] if order else "missing"
        if status != "paid":
            return Revalidation.changed(
                "the order is no longer paid",
                {"field": "status", "approved": "paid", "current": status},
            )
        return Revalidation.passed()

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        async with ctx.services.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO shop_refunds VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (operation_id) DO NOTHING",
                operation_id,
                ctx.tenant,
                args["order_id"],
                args["amount_cents"],
            )
            await conn.execute(
                "UPDATE shop_orders SET status = 'refunded' WHERE tenant = $1 AND id = $2",
                ctx.tenant,
                args["order_id"],
            )
        return {"refunded_cents": args["amount_cents"]}


def make_app() -> App:
    """A zero-argument factory, as ``--app tests.shop:make_app`` would name it."""
    app = App(
        name="shop",
        tools=Registry([OrderStatus(), RefundOrder()]),
        policy=Policy(
            [
                Rule(
                    Verdict.DENY,
                    tool="refund_order",
                    when=lambda args: int(args["amount_cents"]) > 50_000,
                    reason="refunds above 500 EUR go through the back office",
                ),
                Rule(Verdict.ASK, tool="refund_order"),
            ]
        ),
    )

    async def setup(database_url: str) -> Shop:
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
        await pool.execute(SCHEMA)
        app.services = service = Shop(pool)
        return service

    async def teardown() -> None:
        await shop(app).pool.close()

    app.setup = setup
    app.teardown = teardown
    return app


def shop(app: App) -> Shop:
    return cast(Shop, app.services)


# -- the tests -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_approved_refund_is_executed_once(stream: bool) -> None:
    async with Harness(make_app, stream=stream) as h:
        await shop(h.app).add_order(h.tenant, "A-1", 2000)
        card = await h.propose("refund_order", {"order_id": "A-1"}, user="alice")
        assert card.status == "pending"
        assert card.owner == "alice"
        assert card.summary == "Refund 20.00 EUR on order A-1"
        assert await shop(h.app).refunds(h.tenant) == []  # nothing runs before a decision

        done = await h.approve(card)

        assert done.status == "executed"
        assert done.decided_by == "alice"
        assert await h.trail(card) == ["pending", "approved", "executing", "executed"]
        result = await h.tool_result(card)
        assert not result.is_error
        assert result.json()["status"] == "executed"
        assert result.json()["result"] == {"refunded_cents": 2000}
        assert await shop(h.app).refunds(h.tenant) == [{"order_id": "A-1", "amount_cents": 2000}]


async def test_rejected_refund_runs_nothing_and_the_model_hears_why() -> None:
    async with Harness(make_app) as h:
        await shop(h.app).add_order(h.tenant, "A-2", 1500)
        card = await h.propose("refund_order", {"order_id": "A-2"})

        done = await h.reject(card, reason="the customer kept the goods")

        assert done.status == "rejected"
        assert await h.trail(card) == ["pending", "rejected"]
        result = await h.tool_result(card)
        assert result.is_error
        assert "REJECTED" in result.content and "kept the goods" in result.content
        assert await shop(h.app).refunds(h.tenant) == []


async def test_revalidation_refuses_when_the_order_changed_after_the_card() -> None:
    async with Harness(make_app) as h:
        await shop(h.app).add_order(h.tenant, "A-3", 900)
        card = await h.propose("refund_order", {"order_id": "A-3"})
        # The world moves between the card and the click: the order was cancelled.
        await shop(h.app).pool.execute(
            "UPDATE shop_orders SET status = 'cancelled' WHERE tenant = $1", h.tenant
        )

        done = await h.approve(card)

        assert done.status == "invalidated"
        assert await h.trail(card) == ["pending", "approved", "invalidated"]
        result = await h.tool_result(card)
        assert result.is_error and "no longer paid" in result.content
        assert await shop(h.app).refunds(h.tenant) == []


async def test_an_edited_amount_is_proposed_again_then_executed() -> None:
    async with Harness(make_app) as h:
        await shop(h.app).add_order(h.tenant, "A-4", 5000)
        card = await h.propose("refund_order", {"order_id": "A-4"})

        new = await h.edit(card, {"amount_cents": 1200})

        assert (await h.card(card)).status == "modified"
        assert new.status == "pending" and new.summary == "Refund 12.00 EUR on order A-4"
        assert (await h.approve(new)).status == "executed"
        assert await shop(h.app).refunds(h.tenant) == [{"order_id": "A-4", "amount_cents": 1200}]


async def test_only_the_owner_decides() -> None:
    async with Harness(make_app) as h:
        await shop(h.app).add_order(h.tenant, "A-5", 700)
        card = await h.propose("refund_order", {"order_id": "A-5"}, user="alice")
        with pytest.raises(NotOwner):
            await h.approve(card, user="mallory")
        assert (await h.card(card)).status == "pending"


async def test_policy_and_prepare_refusals_reach_the_model_without_a_card() -> None:
    async with Harness(make_app) as h:
        await shop(h.app).add_order(h.tenant, "BIG", 90_000)
        denied = await h.call("refund_order", {"order_id": "BIG"})
        assert denied.is_error and "back office" in denied.content
        invalid = await h.call("refund_order", {"order_id": "NOPE"})
        assert invalid.is_error and "cannot be refunded" in invalid.content
        with pytest.raises(AssertionError, match="made no card"):
            await h.propose("refund_order", {"order_id": "BIG"})


async def test_a_read_tool_answers_at_once() -> None:
    async with Harness(make_app) as h:
        await shop(h.app).add_order(h.tenant, "A-6", 300)
        result = await h.call("order_status", {"order_id": "A-6"})
        assert result.json() == {"id": "A-6", "amount_cents": 300, "status": "paid"}


async def test_parallel_calls_make_one_card_each() -> None:
    async with Harness(make_app) as h:
        for order in ("P-1", "P-2"):
            await shop(h.app).add_order(h.tenant, order, 100)
        one, two = await h.propose_many(
            [("refund_order", {"order_id": "P-1"}), ("refund_order", {"order_id": "P-2"})]
        )
        assert one.run_id == two.run_id and one.id != two.id
        # Each card runs on its own approval; the model hears of both once both are decided.
        assert (await h.approve(one)).status == "executed"
        assert await shop(h.app).refunds(h.tenant) == [{"order_id": "P-1", "amount_cents": 100}]
        assert (await h.reject(two)).status == "rejected"
        assert (await h.tool_result(one)).json()["status"] == "executed"
        assert await shop(h.app).refunds(h.tenant) == [{"order_id": "P-1", "amount_cents": 100}]


async def test_a_scripted_conversation_reads_then_proposes() -> None:
    async with Harness(make_app) as h:
        await shop(h.app).add_order(h.tenant, "S-1", 4200)
        lookup = tool_use("order_status", {"order_id": "S-1"})
        h.reply_to(
            "refund S-1 please",
            reply(text("Let me look."), lookup),
            reply(tool_use("refund_order", {"order_id": "S-1"})),
        )
        thread = await h.thread("alice")
        await h.say(thread, "refund S-1 please", "alice")
        (card,) = await h.pending(thread)
        assert card.summary == "Refund 42.00 EUR on order S-1"
        # The model had the read tool's answer before it proposed: two model calls so far.
        assert (await h.tool_result(lookup["id"], thread=thread)).json()["amount_cents"] == 4200
        assert len(h.fake.requests) == 2
        assert (await h.approve(card)).status == "executed"
        assert len(h.fake.requests) == 3


async def test_the_gateway_takes_the_decision_over_http() -> None:
    async with Harness(make_app, gateway=True) as h:
        await shop(h.app).add_order(h.tenant, "G-1", 800)
        card = await h.propose("refund_order", {"order_id": "G-1"}, user="bob")
        async with httpx.AsyncClient(base_url=h.base_url, trust_env=False) as http:
            response = await http.post(
                f"/v1/cards/{card.id}/resolve",
                json={"decision": "approve", "snapshot_hash": card.snapshot_hash},
                headers={"Authorization": f"Bearer {h.token('bob')}"},
            )
        assert response.status_code == 200, response.text
        await h.settle()
        assert (await h.card(card)).status == "executed"
        events = await h.events(card)
        assert events[1].actor == "bob" and events[1].channel == "http"


async def test_offline_the_generic_command_model_takes_slash_commands() -> None:
    # make_app has no offline model of its own: offline=True runs signoff's generic one.
    async with Harness(make_app, offline=True) as h:
        await shop(h.app).add_order(h.tenant, "O-1", 600)
        thread = await h.thread()
        await h.say(thread, "/refund_order order_id=O-1 amount_cents=250")
        (card,) = await h.pending(thread)
        assert card.summary == "Refund 2.50 EUR on order O-1"
        assert (await h.approve(card)).status == "executed"
        assert "refunded_cents: 250" in await h.last_reply(thread)  # in words, not JSON
        with pytest.raises(RuntimeError):
            h.script(reply(text("no fake server offline")))
