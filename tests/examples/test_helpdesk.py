"""The helpdesk example (examples/helpdesk), tested as its author would: with
``signoff.testing`` and the public API only.

Its tools, policy and offline model run in a :class:`~signoff.testing.Harness` on a fresh
database of a real Postgres, driven by the helpdesk's own offline model
(``Harness(app, offline=True)``) in plain English, or by a scripted model. This file
imports nothing but ``signoff``, ``signoff.testing``, ``examples.helpdesk``, the standard
library and third-party packages (the last test checks it). The HTTP path through
``signoff dev --app examples.helpdesk:app`` is in tests/e2e/test_apps.py.
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import pytest

import signoff
import signoff.testing
from examples.helpdesk import app as helpdesk_app
from examples.helpdesk.data import Shop
from examples.helpdesk.model import understand
from examples.helpdesk.tools import parse_dollars
from signoff import Risk, ToolValidationError, Verdict
from signoff.testing import Harness

pytestmark = pytest.mark.anyio


def shop(h: Harness) -> Shop:
    """The helpdesk's own service, as its tools get it (``ctx.services``)."""
    assert isinstance(h.app.services, Shop)
    return h.app.services


async def ask(h: Harness, user: str, message: str) -> str:
    """``user`` says ``message`` in a new thread; the turn runs to its end or its card."""
    thread = await h.thread(user)
    await h.say(thread, message, user)
    return thread


async def order(h: Harness, user: str, order_id: str) -> dict[str, Any]:
    found = await shop(h).order(h.tenant, user, order_id)
    assert found is not None
    return found


# -- without a database ----------------------------------------------------------------


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
    # as a Portuguese page prefills it: twenty dollars (it read 2,000); "1,200" stays 1,200
    assert parse_dollars("20,00") == 2000 and parse_dollars("1,200") == 120_000
    for bad in ("0", "-1", "ten", "1.234", "nan"):
        with pytest.raises(ToolValidationError):
            parse_dollars(bad)
    app = helpdesk_app()
    refund = app.tools.get("refund_order")
    assert refund is not None and refund.risk is Risk.CRITICAL
    big = app.policy.evaluate(refund, {"amount_cents": 60_000}, tenant="t")
    assert big.verdict is Verdict.DENY and "human agent" in big.reason
    assert app.policy.unruled_writes(app.tools) == []


# -- the app, driven by its own offline model -------------------------------------------


async def test_a_refund_is_confirmed_on_a_card_then_executed_once() -> None:
    async with Harness(helpdesk_app, offline=True) as h:
        thread = await ask(h, "ana", "refund order A100, it arrived broken")
        (card,) = await h.pending(thread)
        assert card.tool == "refund_order" and card.risk is Risk.CRITICAL
        assert card.summary == (
            "Refund $25.00 for order A100 (Wireless mouse) to the original payment method"
        )
        assert card.impact["fields"] == [{"label": "Reason", "value": "it arrived broken"}]
        # dollars, said so: the chat page showed "R$25.00" under "Refund $25.00"
        assert (card.impact["amount_cents"], card.impact["currency"]) == (2500, "USD")
        # critical cards wait five minutes at most (the helpdesk's policy)
        assert (card.expires_at - card.created_at).total_seconds() == pytest.approx(300, abs=2)
        assert (await order(h, "ana", "A100"))["refunded_cents"] == 0

        done = await h.approve(card)
        assert done.status == "executed"
        assert done.result == {
            "refunded": "$25.00",
            "order_id": "A100",
            "operation_id": card.operation_id,
        }
        assert await h.trail(card) == ["pending", "approved", "executing", "executed"]
        assert (await order(h, "ana", "A100"))["refunded_cents"] == 2500
        assert await shop(h).operations(h.tenant, "ana") == 1
        said = await h.last_reply(thread)
        assert said.endswith(
            "Done: Refund $25.00 for order A100 (Wireless mouse) to the original payment method."
        ), said
        for jargon in ("Confirmation card", "Decided by", "via ws", "via test"):
            assert jargon not in said  # written for the model, not the person

        # nothing left to refund: prepare refuses, no card, the model is told why
        again = await ask(h, "ana", "refund order A100 please")
        assert await h.pending(again) == []
        assert "already refunded in full" in await h.last_reply(again)
        said_all = [e.body for e in await h.store.entries_after(again, 0) if e.kind == "assistant"]
        assert "Please confirm" not in str(said_all)  # it came before "Nothing was proposed"
        assert await shop(h).operations(h.tenant, "ana") == 1


async def test_an_address_change_can_be_edited_and_a_shipped_order_refuses_it() -> None:
    async with Harness(helpdesk_app, offline=True) as h:
        thread = await ask(h, "bo", "change the address of A101 to 12 Oak Street, Leeds")
        (card,) = await h.pending(thread)
        assert card.summary == "Change the delivery address of order A101 (Mechanical keyboard)"
        assert [f["label"] for f in card.impact["fields"]] == ["From", "To"]
        assert card.editable == ["address"]
        edited = await h.edit(card, {"address": "14 Oak Street, Leeds"})
        assert (await h.card(card)).status == "modified"
        assert edited.args_snapshot["address"] == "14 Oak Street, Leeds"
        assert (await h.approve(edited)).status == "executed"
        assert (await order(h, "bo", "A101"))["address"] == "14 Oak Street, Leeds"

        shipped = await ask(h, "bo", "ship A102 to 1 Elm Road, York")
        assert await h.pending(shipped) == []
        assert "already shipped" in await h.last_reply(shipped)


async def test_an_approved_refund_is_checked_again_before_it_runs() -> None:
    async with Harness(helpdesk_app, offline=True) as h:
        thread = await ask(h, "cy", "refund $20 of order A102, wrong colour")
        (card,) = await h.pending(thread)
        assert card.args_snapshot == {
            "order_id": "A102",
            "amount_cents": 2000,
            "reason": "wrong colour",
        }
        # meanwhile, a colleague refunded most of the order
        await shop(h).pool.execute(
            "UPDATE helpdesk_orders SET refunded_cents = 14000"
            " WHERE tenant = $1 AND customer = 'cy' AND id = 'A102'",
            h.tenant,
        )
        done = await h.approve(card)
        assert done.status == "invalidated"
        assert (
            done.result is not None and done.result["reason"] == "the order was refunded meanwhile"
        )
        assert await h.trail(card) == ["pending", "approved", "invalidated"]
        told = await h.tool_result(card)
        assert told.is_error and "refunded meanwhile" in told.content
        assert await shop(h).operations(h.tenant, "cy") == 0


async def test_closing_the_account_rejected_then_approved() -> None:
    async with Harness(helpdesk_app, offline=True) as h:
        thread = await ask(h, "di", "close my account, I'm moving away")
        (card,) = await h.pending(thread)
        assert card.summary == "Close the account of di (di@example.com) for good"
        assert (await h.reject(card, reason="changed my mind")).status == "rejected"
        assert "changed my mind" in (await h.tool_result(card)).content
        assert (await shop(h).account(h.tenant, "di"))["status"] == "open"

        thread = await ask(h, "di", "close my account")
        (card,) = await h.pending(thread)
        assert (await h.approve(card)).status == "executed"
        assert (await shop(h).account(h.tenant, "di"))["status"] == "closed"


async def test_a_look_up_runs_at_once_and_shows_only_the_users_own_orders() -> None:
    async with Harness(helpdesk_app, offline=True) as h:
        thread = await ask(h, "ed", "where is order A101?")
        assert await h.pending(thread) == []
        reply = await h.last_reply(thread)
        assert "A101 (Mechanical keyboard, $89.00) is processing" in reply
        missing = await ask(h, "ed", "where is order Z999?")
        assert "there is no order Z999 for ed" in await h.last_reply(missing)


# -- the app, driven by a scripted model (as Claude would call its tools) ---------------


async def test_scripted_calls_reach_the_same_tools() -> None:
    async with Harness(helpdesk_app) as h:
        found = await h.call("look_up_order", {"order_id": "a102"}, user="fay")
        assert found.json()["status"] == "shipped"
        assert found.json()["delivery_address"] == "221B Baker Street, London"
        early = await h.call("refund_order", {"order_id": "A101", "reason": "x"}, user="fay")
        assert early.is_error and "has not shipped yet" in early.content
        card = await h.propose(
            "refund_order", {"order_id": "A102", "reason": "late", "amount": "5"}, user="fay"
        )
        assert card.args_snapshot["amount_cents"] == 500
        assert (await h.approve(card)).status == "executed"
        assert (await order(h, "fay", "A102"))["refunded_cents"] == 500


# -- this file stays a user's suite ------------------------------------------------------


def test_this_suite_imports_only_the_public_api_and_the_app() -> None:
    """Only ``signoff`` and ``signoff.testing`` (names from their ``__all__``), the
    helpdesk, the standard library and third-party packages: no signoff internals, no
    helpers of this repository's own test suite."""
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
            or module == "examples.helpdesk"
            or module.startswith("examples.helpdesk.")
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
