"""Workflows the workflow tests run (in-process): each step counts its runs per run id."""

from __future__ import annotations

import asyncio
import collections
import secrets
from typing import Any

import msgspec

from signoff import (
    App,
    Registry,
    Unavailable,
    Workflow,
    WorkflowContext,
    await_event,
    await_human,
)

# (run_id, step) -> how many times the step's body ran
CALLS: collections.Counter[tuple[str, str]] = collections.Counter()
# run_id -> released when the test lets the step that waits on it go on
GATES: dict[str, asyncio.Event] = {}


class Approval(msgspec.Struct):
    approved: bool
    note: str = ""


class Payment(msgspec.Struct):
    amount: int
    reference: str = ""


def counted(name: str, **update: Any) -> Any:
    async def step(ctx: WorkflowContext) -> dict[str, Any]:
        CALLS[(ctx.run_id, name)] += 1
        return {f"{name}_saw": sorted(ctx.state), **update}

    step.__name__ = name
    return step


async def held(ctx: WorkflowContext) -> dict[str, Any]:
    """Counts, then waits until the test releases the run (``GATES``)."""
    CALLS[(ctx.run_id, "held")] += 1
    gate = GATES.setdefault(ctx.run_id, asyncio.Event())
    await gate.wait()
    return {"held": True}


async def unavailable(ctx: WorkflowContext) -> dict[str, Any]:
    """Counts, then says its provider is away, every time."""
    CALLS[(ctx.run_id, "unavailable")] += 1
    raise Unavailable("the provider is away")


def release(run_id: str) -> None:
    GATES.setdefault(run_id, asyncio.Event()).set()


def calls(run_id: str, step: str) -> int:
    return CALLS[(run_id, step)]


def build(lookback: float = 30.0) -> App:
    return App(
        name="wf-test-" + secrets.token_hex(3),
        tools=Registry([]),
        workflows=[
            Workflow(
                "three",
                steps=[
                    counted("extract", extracted=1),
                    await_human("approve the payout", schema=Approval),
                    counted("pay", paid=True),
                ],
            ),
            Workflow(
                "timed",
                steps=[
                    await_human(
                        "quick one",
                        schema=Approval,
                        timeout=0.5,
                        timeout_response={"approved": False, "note": "auto"},
                    ),
                    counted("after"),
                ],
            ),
            Workflow(
                "timed_fail",
                steps=[await_human("quick one", schema=Approval, timeout=0.5), counted("after")],
            ),
            Workflow(
                "order",
                steps=[
                    held,
                    await_event("payment.confirmed", schema=Payment, lookback=lookback),
                    counted("ship"),
                ],
            ),
            Workflow(
                "strict",
                steps=[held, await_event("payment.confirmed", schema=Payment), counted("ship")],
            ),
            Workflow("crashy", steps=[counted("first"), held, counted("last")]),
            Workflow("away", steps=[unavailable, counted("after")]),
            Workflow(  # what is asked, written from the state when the gate opens
                "said",
                steps=[
                    counted("extract", amount=120),
                    await_human(
                        lambda s: f"Approve the payout of R$ {s['amount']}", schema=Approval
                    ),
                    counted("pay"),
                ],
            ),
            Workflow(  # ... by a function that fails: the run fails at the gate
                "unsaid",
                steps=[await_human(lambda s: f"{s['missing']}", schema=Approval)],
            ),
            Workflow(  # two installments: one confirmation for each
                "installments",
                steps=[
                    await_event("payment.confirmed", schema=Payment, lookback=lookback),
                    counted("first_paid"),
                    await_event("payment.confirmed", schema=Payment, lookback=lookback),
                    counted("second_paid"),
                ],
            ),
        ],
    )
