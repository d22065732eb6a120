"""The workflow examples (examples/contracts, examples/orders), tested as their author
would: with ``signoff.testing`` and the public API only (the last test checks it).

A :class:`~signoff.testing.Harness` runs each app in-process on a fresh database of a real
Postgres, driven by the app's own offline model; ``h.workflows`` starts, resumes and
delivers events as the HTTP API does.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import signoff
import signoff.testing
from examples import contracts, orders
from examples.contracts.model import risky
from examples.contracts.tools import Register
from examples.orders import Warehouse
from signoff import Edit, InvalidInput, WorkflowRun, WrongEvent
from signoff.testing import Harness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

REVIEWER = "rita"
CONTRACT = {
    "title": "Supply deal",
    "text": "C1: The supplier delivers the goods within 30 days.\n"
    "C2: The customer accepts unlimited liability for any damage.\n"
    "C3: This agreement renews automatically every year.\n"
    "C4: Payment is due within 60 days.",
}


async def until(h: Harness, run_id: str, *statuses: str, timeout: float = 30.0) -> WorkflowRun:
    """The run once its status is one of ``statuses``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        run, _ = await h.workflows.get(run_id, tenant=h.tenant, user=REVIEWER)
        if str(run.status) in statuses:
            return run
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"run {run_id} is {run.status}, not {statuses}")
        await asyncio.sleep(0.05)


async def open_gate(h: Harness, run_id: str) -> Any:
    _, interrupts = await h.workflows.get(run_id, tenant=h.tenant, user=REVIEWER)
    return next(i for i in reversed(interrupts) if i.status == "open")


# -- contract review ------------------------------------------------------------------


def test_the_offline_model_flags_the_risky_clauses() -> None:
    flags = risky("C1: fine\nC2: unlimited liability for all\nC3: renews automatically")
    assert [(f["clause"], f["level"]) for f in flags] == [("C2", "high"), ("C3", "medium")]


async def test_a_chat_message_is_told_what_the_contracts_app_does() -> None:
    """A newcomer probe: "olá, o que você faz?" in a chat of the contracts app was told
    "Risk analysis done: no risky clause found" (nothing had been analysed)."""
    async with Harness(contracts.app, offline=True) as h:
        for text, words in (("olá, o que você faz?", "Eu reviso contratos"), ("hi", "I review")):
            thread = await h.thread(REVIEWER)
            await h.say(thread, text, REVIEWER)
            reply = await h.last_reply(thread)
            assert words in reply and "Risk analysis done" not in reply, reply


async def reviewed_to_sign_off(h: Harness) -> WorkflowRun:
    """Start a review, decide the agent's two flags (approve one, edit the other)."""
    run = await h.workflows.start("contract_review", CONTRACT, tenant=h.tenant, owner=REVIEWER)
    await until(h, run.id, "awaiting_human")
    gate = await open_gate(h, run.id)
    assert gate.step_name == "risk"
    cards = {c["summary"]: c["id"] for c in gate.detail["cards"]}
    assert sorted(cards) == [
        "Flag clause C2 as high risk for the legal team",
        "Flag clause C3 as medium risk for the legal team",
    ]
    decisions = {
        cards["Flag clause C2 as high risk for the legal team"]: True,
        cards["Flag clause C3 as medium risk for the legal team"]: Edit({"level": "low"}),
    }
    await h.workflows.resume(run.id, decisions, tenant=h.tenant, by=REVIEWER)
    while (gate := await open_gate_or_none(h, run.id)) is None or gate.step_name != "sign_off":
        await asyncio.sleep(0.05)
    return await until(h, run.id, "awaiting_human")


async def open_gate_or_none(h: Harness, run_id: str) -> Any:
    _, interrupts = await h.workflows.get(run_id, tenant=h.tenant, user=REVIEWER)
    return next((i for i in reversed(interrupts) if i.status == "open"), None)


async def test_contract_review_flags_signs_off_and_summarises() -> None:
    async with Harness(contracts.app, offline=True) as h:
        run = await reviewed_to_sign_off(h)
        assert run.state["risk"]["reply"] == "Risk analysis done: 2 clause(s) flagged."
        gate = await open_gate(h, run.id)
        assert gate.reason == "Sign off the contract"
        assert gate.schema["properties"]["approved"]["type"] == "boolean"
        assert gate.deadline is not None and gate.timeout_response is not None
        with pytest.raises(InvalidInput):  # the schema is checked: still parked
            await h.workflows.resume(run.id, {"note": "no verdict"}, tenant=h.tenant, by=REVIEWER)
        await h.workflows.resume(
            run.id, {"approved": True, "note": "fine"}, tenant=h.tenant, by=REVIEWER
        )
        done = await until(h, run.id, "completed")
        assert done.state["summary"] == "Supply deal: 4 clauses, 2 flagged; approved (fine)."
        register = h.app.services
        assert isinstance(register, Register)
        assert sorted((f["clause"], f["level"]) for f in register.flags.values()) == [
            ("C2", "high"),
            ("C3", "low"),
        ]


async def test_no_sign_off_within_three_days_goes_on_as_not_approved() -> None:
    async with Harness(contracts.app, offline=True) as h:
        run = await reviewed_to_sign_off(h)
        gate = await open_gate(h, run.id)
        assert gate.deadline is not None
        left = gate.deadline - gate.created_at
        assert 3 * 86400 - 5 < left.total_seconds() <= 3 * 86400 + 5
        # Three days pass (the database's clock decides: the deadline is moved instead).
        db = await asyncpg.connect(h.database_url)
        try:
            await db.execute(
                "UPDATE interrupts SET deadline = now() - interval '1 second' WHERE id = $1",
                gate.id,
            )
        finally:
            await db.close()
        done = await until(h, run.id, "completed", timeout=60)
        assert done.state["summary"] == (
            "Supply deal: 4 clauses, 2 flagged; not approved (no sign-off within 3 days)."
        )
        _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=REVIEWER)
        last = interrupts[-1]
        assert last.automatic and last.resolved_by == "system:timeout"


# -- order flow -------------------------------------------------------------------------


async def test_an_order_ships_once_the_payment_is_confirmed() -> None:
    async with Harness(orders.app, offline=True) as h:
        order = {"order_id": "A1", "amount_cents": 1200}
        run = await h.workflows.start("order", order, tenant=h.tenant, owner=REVIEWER)
        run = await until(h, run.id, "awaiting_event")
        assert run.state["held"] is True
        with pytest.raises(WrongEvent):
            await h.workflows.deliver_event(
                run.id, "payment.failed", {}, tenant=h.tenant, by=REVIEWER
            )
        await h.workflows.deliver_event(
            run.id,
            "payment.confirmed",
            {"reference": "pix-1", "paid_cents": 1200, "extra": "dropped"},
            tenant=h.tenant,
            by=REVIEWER,
        )
        done = await until(h, run.id, "completed")
        assert done.state["shipped"] is True and done.state["tracking"] == "TRK-A1"
        assert "extra" not in done.state
        warehouse = h.app.services
        assert isinstance(warehouse, Warehouse) and warehouse.shipped == {run.id: "TRK-A1"}


async def test_a_payment_confirmed_before_the_gate_is_kept_for_it() -> None:
    """The provider's webhook may beat the run to its gate (lookback of ten minutes)."""
    async with Harness(orders.app, offline=True) as h:
        order = {"order_id": "B2", "amount_cents": 500}
        run = await h.workflows.start("order", order, tenant=h.tenant, owner=REVIEWER)
        await h.workflows.deliver_event(
            run.id,
            "payment.confirmed",
            {"reference": "pix-2", "paid_cents": 400},
            tenant=h.tenant,
            by=REVIEWER,
        )
        done = await until(h, run.id, "completed")
        assert done.state["shipped"] is False
        assert done.state["problem"] == "paid amount differs from the order's"


# -- this file stays a user's suite ------------------------------------------------------


def test_this_suite_imports_only_the_public_api_and_the_examples() -> None:
    third_party = {
        root
        for root, dists in importlib.metadata.packages_distributions().items()
        if "signoff" not in dists
    }
    public = {"signoff": set(signoff.__all__), "signoff.testing": set(signoff.testing.__all__)}

    def allowed(module: str) -> bool:
        root = module.partition(".")[0]
        return (
            module in public
            or module == "examples"
            or module.startswith(("examples.contracts", "examples.orders"))
            or root in sys.stdlib_module_names
            or root in third_party
        )

    wrong: list[str] = []
    for node in ast.walk(ast.parse(Path(__file__).read_text())):
        if isinstance(node, ast.Import):
            wrong += [a.name for a in node.names if not allowed(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or not allowed(module):
                wrong.append("." * node.level + module)
            elif module in public:
                wrong += [f"{module}.{a.name}" for a in node.names if a.name not in public[module]]
    assert wrong == [], f"imports beyond the public API: {wrong}"
