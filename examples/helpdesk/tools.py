"""The helpdesk's tools: one read, three writes that each become a confirmation card.

Each write tool freezes what will run in ``prepare`` (checked against the shop, summary
written here, never by the model), checks the world again in ``revalidate`` right before
running, and runs the frozen arguments in ``execute`` with signoff's ``operation_id`` as
the idempotency key.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

import msgspec

from examples.helpdesk.data import Shop, money
from signoff import (
    Prepared,
    Revalidation,
    Risk,
    Tool,
    ToolContext,
    ToolValidationError,
)

OrderId = Annotated[str, msgspec.Meta(description="The order number, e.g. A100.")]


def _shop(ctx: ToolContext) -> Shop:
    if not isinstance(ctx.services, Shop):
        raise ToolValidationError("the shop is not connected")
    return ctx.services


async def _order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    order_id = order_id.strip().upper()
    order = await _shop(ctx).order(ctx.tenant, ctx.user, order_id)
    if order is None:
        raise ToolValidationError(f"there is no order {order_id} for {ctx.user}")
    return order


def parse_dollars(text: str) -> int:
    """``"12.5"``, ``"$12.50"``, ``"1,200"`` -> cents; ``"20,00"`` (one comma and two
    digits, as a Portuguese page writes it) is twenty dollars, not two thousand."""
    text = re.sub(r"^([^,.]*),(\d{2})$", r"\1.\2", text.strip())
    cleaned = re.sub(r"[$,\s]", "", text)
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        raise ToolValidationError(f"{text!r} is not an amount in dollars") from None
    if not value.is_finite() or value <= 0 or value != value.quantize(Decimal("0.01")):
        raise ToolValidationError(f"{text!r} is not a positive amount in dollars and cents")
    return int(value * 100)


class OrderRef(msgspec.Struct, forbid_unknown_fields=True):
    order_id: OrderId


class LookUpOrder(Tool):
    name = "look_up_order"
    description = "Look up one of the customer's orders: item, total, status, delivery address."
    risk = Risk.READ
    input_type = OrderRef

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        order = await _order(ctx, args["order_id"])
        return {
            "order_id": order["id"],
            "item": order["item"],
            "total": money(order["total_cents"]),
            "refunded": money(order["refunded_cents"]),
            "status": order["status"],
            "delivery_address": order["address"],
        }


class RefundIn(msgspec.Struct, forbid_unknown_fields=True):
    order_id: OrderId
    reason: Annotated[str, msgspec.Meta(description="Why the customer wants the refund.")]
    amount: (
        Annotated[
            str,
            msgspec.Meta(description="Dollars to refund, e.g. 12.50; omit for the rest."),
        ]
        | None
    ) = None


class RefundOrder(Tool):
    name = "refund_order"
    description = (
        "Refund (part of) a shipped or delivered order to the original payment method. "
        "Proposes it: the customer confirms on a card."
    )
    risk = Risk.CRITICAL
    input_type = RefundIn
    editable = frozenset({"amount"})

    async def prepare(self, data: RefundIn, ctx: ToolContext) -> Prepared:
        order = await _order(ctx, data.order_id)
        if order["status"] == "processing":
            raise ToolValidationError(
                f"order {order['id']} has not shipped yet: it cannot be refunded"
            )
        left = order["total_cents"] - order["refunded_cents"]
        if left <= 0:
            raise ToolValidationError(f"order {order['id']} was already refunded in full")
        cents = left if data.amount is None else parse_dollars(data.amount)
        if cents > left:
            raise ToolValidationError(
                f"at most {money(left)} of order {order['id']} can still be refunded"
            )
        return Prepared(
            args={"order_id": order["id"], "amount_cents": cents, "reason": data.reason},
            summary=(
                f"Refund {money(cents)} for order {order['id']} ({order['item']}) "
                "to the original payment method"
            ),
            impact={
                "amount_cents": cents,
                "currency": "USD",  # the page shows reais unless told
                "target": order["id"],
                "reversible": False,
            },
            fields={"Reason": data.reason},
        )

    async def revalidate(self, args: dict[str, Any], ctx: ToolContext) -> Revalidation:
        order = await _order(ctx, args["order_id"])
        left = order["total_cents"] - order["refunded_cents"]
        if left < args["amount_cents"]:
            return Revalidation.changed(
                "the order was refunded meanwhile",
                {
                    "field": "refundable",
                    "approved": money(args["amount_cents"]),
                    "current": money(left),
                },
            )
        return Revalidation.passed()

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        return await _shop(ctx).refund(
            ctx.tenant, ctx.user, args["order_id"], args["amount_cents"], operation_id
        )


class AddressIn(msgspec.Struct, forbid_unknown_fields=True):
    order_id: OrderId
    address: Annotated[str, msgspec.Meta(description="The new delivery address, one line.")]


class ChangeDeliveryAddress(Tool):
    name = "change_delivery_address"
    description = "Change where an order that has not shipped yet will be delivered."
    risk = Risk.REVERSIBLE
    input_type = AddressIn
    editable = frozenset({"address"})
    ttl = timedelta(minutes=30)

    async def prepare(self, data: AddressIn, ctx: ToolContext) -> Prepared:
        order = await _order(ctx, data.order_id)
        if order["status"] != "processing":
            raise ToolValidationError(
                f"order {order['id']} is already {order['status']}: its address is fixed"
            )
        address = " ".join(data.address.split())
        if not 5 <= len(address) <= 200:
            raise ToolValidationError("the address must be 5 to 200 characters")
        return Prepared(
            args={"order_id": order["id"], "address": address},
            summary=f"Change the delivery address of order {order['id']} ({order['item']})",
            impact={"target": order["id"], "reversible": True},
            fields={"From": order["address"], "To": address},
        )

    async def revalidate(self, args: dict[str, Any], ctx: ToolContext) -> Revalidation:
        order = await _order(ctx, args["order_id"])
        if order["status"] != "processing":
            return Revalidation.changed(
                "the order shipped meanwhile",
                {"field": "status", "approved": "processing", "current": order["status"]},
            )
        return Revalidation.passed()

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        return await _shop(ctx).change_address(
            ctx.tenant, ctx.user, args["order_id"], args["address"], operation_id
        )


class CloseIn(msgspec.Struct, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(description="Why the customer leaves.")] = ""


class CloseAccount(Tool):
    name = "close_account"
    description = "Close the customer's own account for good."
    risk = Risk.CRITICAL
    input_type = CloseIn

    async def prepare(self, data: CloseIn, ctx: ToolContext) -> Prepared:
        account = await _shop(ctx).account(ctx.tenant, ctx.user)
        if account["status"] != "open":
            raise ToolValidationError("the account is already closed")
        return Prepared(
            args={"reason": data.reason},
            summary=f"Close the account of {account['customer']} ({account['email']}) for good",
            impact={"target": account["customer"], "reversible": False},
            fields={"Reason": data.reason} if data.reason else {},
        )

    async def revalidate(self, args: dict[str, Any], ctx: ToolContext) -> Revalidation:
        account = await _shop(ctx).account(ctx.tenant, ctx.user)
        if account["status"] != "open":
            return Revalidation.changed("the account was closed meanwhile")
        return Revalidation.passed()

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        return await _shop(ctx).close_account(ctx.tenant, ctx.user, args["reason"], operation_id)


TOOLS: list[Tool] = [LookUpOrder(), RefundOrder(), ChangeDeliveryAddress(), CloseAccount()]
