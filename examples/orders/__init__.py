"""An order flow that waits for the payment provider: ``await_event('payment.confirmed')``.

``reserve`` (plain step: hold the stock) -> ``payment`` (the run parks until the payment
provider's webhook delivers ``payment.confirmed`` to it, up to a day; an event that
arrives up to ten minutes before the run reaches the gate is kept: ``lookback``) ->
``ship`` (plain step). Serve it with ``signoff dev --app examples.orders:app``; the
provider integration delivers ``POST /v1/workflow-runs/{id}/events`` with ``{"name":
"payment.confirmed", "payload": {"reference": ..., "paid_cents": ...}}`` (a principal
with the role ``service`` may deliver to any run of its tenant).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec

from signoff import App, Registry, Workflow, WorkflowContext, await_event

__all__ = ["Order", "Payment", "Warehouse", "app", "order_flow"]


class Order(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str
    amount_cents: int


class Payment(msgspec.Struct):
    """What the payment provider confirms (merged into the run's state)."""

    reference: str
    paid_cents: int


class Warehouse:
    """Stock holds and shipments, keyed by the run id: a step that runs again after a
    crash (steps run at least once) changes nothing the second time."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}
        self.shipped: dict[str, str] = {}


async def reserve(ctx: WorkflowContext) -> dict[str, Any]:
    order: Order = ctx.input
    warehouse: Warehouse = ctx.services
    warehouse.held.setdefault(ctx.run_id, order.order_id)
    return {"order_id": order.order_id, "amount_cents": order.amount_cents, "held": True}


async def ship(ctx: WorkflowContext) -> dict[str, Any]:
    s = ctx.state
    if s["amount_cents"] != s["paid_cents"]:
        return {"shipped": False, "problem": "paid amount differs from the order's"}
    warehouse: Warehouse = ctx.services
    tracking = warehouse.shipped.setdefault(ctx.run_id, f"TRK-{s['order_id']}")
    return {"shipped": True, "tracking": tracking}


order_flow = Workflow(
    "order",
    input=Order,
    steps=[
        reserve,
        await_event(
            "payment.confirmed",
            schema=Payment,
            timeout=timedelta(days=1),
            lookback=timedelta(minutes=10),
            name="payment",
        ),
        ship,
    ],
)


def app() -> App:
    return App(name="orders", tools=Registry([]), services=Warehouse(), workflows=[order_flow])
