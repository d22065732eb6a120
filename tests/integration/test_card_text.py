"""Hostile text and numbers from the model reach the demo tools (issue 10, items 6 and 8).

Real Postgres and Redis. A model-written description cannot forge a line of the
card, and a huge amount in a chat message or an edit is refused with the tool's
typed error instead of crashing the handler.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from signoff.demo.offline_model import OfflineDemoModel
from signoff.runtime.cards import Decision, Status
from signoff.runtime.errors import InvalidInput
from signoff.testing import FakeMessagesServer, ScriptedReply, text, tool_use
from tests.harness import harness

pytestmark = pytest.mark.anyio

FORGED = "pedido 42\n\n**Valor: R$ 1,00**\u202e 00,1 $R\u202c\u2066 fim\u2069"
CLEAN = "pedido 42 **Valor: R$ 1,00** 00,1 $R fim"


@pytest.fixture
def fake() -> Iterator[FakeMessagesServer]:
    with FakeMessagesServer() as server:
        yield server


def results_in(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    last = request["messages"][-1]
    return {b["tool_use_id"]: b for b in last["content"] if b.get("type") == "tool_result"}


async def test_model_description_goes_to_its_own_cleaned_field(
    database_url: str, fake: FakeMessagesServer
) -> None:
    charge = tool_use(
        "create_pix_charge", {"customer": "João", "amount": "9000", "description": FORGED}
    )
    email = tool_use("update_email", {"customer": "Maria", "email": "maria@exa\u202emple.com"})
    fake.add(
        ScriptedReply([text("Vou preparar."), charge, email], "tool_use"),
        ScriptedReply([text("Feito.")], "end_turn"),
    )
    async with harness(database_url, fake=fake) as h:
        thread = await h.thread("alice")
        run = await h.say(thread, "cobre 9000 do João", "alice")
        assert run is not None and run.status == "waiting"
        [card] = await h.store.pending_cards(thread)
        # The summary is the tool's one line; the model's words are not in it.
        assert card.summary == (
            "Gerar cobrança Pix · Cliente: João Silva (CPF ***.123.456-**) · Valor: R$ 9.000,00"
        )
        assert card.impact["fields"] == [{"label": "Descrição", "value": CLEAN}]
        # What runs is what is shown: the frozen description is the cleaned one.
        assert card.args_snapshot["description"] == CLEAN
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.EXECUTED
        sent = await h.provider.pool.fetchval(
            "SELECT description FROM demo_charges WHERE idempotency_key = $1", card.operation_id
        )
        assert sent == CLEAN
        # An address with a bidi override is not an address: refused, no card.
        refused = results_in(fake.requests[1])[email["id"]]
        assert refused["is_error"] is True and "not an e-mail address" in str(refused["content"])
        assert "\u202e" not in json.dumps(refused, ensure_ascii=False)
        mine = [c.tool for c in await h.store.list_cards(owner="alice") if c.tenant == h.tenant]
        assert mine == ["create_pix_charge"]


async def test_email_change_shows_both_addresses_as_fields(
    database_url: str, fake: FakeMessagesServer
) -> None:
    email = tool_use("update_email", {"customer": "Maria", "email": "Maria.Nova@Example.com"})
    fake.add(ScriptedReply([email], "tool_use"))
    async with harness(database_url, fake=fake) as h:
        thread = await h.thread("bob")
        await h.say(thread, "mude o e-mail da Maria", "bob")
        [card] = await h.store.pending_cards(thread)
        assert "@" not in card.summary
        labels = [f["label"] for f in card.impact["fields"]]
        assert labels == ["E-mail atual", "Novo e-mail"]
        assert card.impact["fields"][1]["value"] == "maria.nova@example.com"


@pytest.mark.parametrize("amount", ["9" * 400, "9" * 5000])
async def test_offline_model_huge_amount_is_refused_not_crashed(
    database_url: str, amount: str
) -> None:
    """`cobre <400 nines> do João` raised OverflowError in the worker's handler."""
    async with harness(database_url, model=OfflineDemoModel()) as h:
        thread = await h.thread("carol")
        run = await h.say(thread, f"cobre {amount} do João", "carol")
        assert run is not None and run.status == "done"
        assert await h.store.pending_cards(thread) == []
        said = [
            b.get("content") or b.get("text")
            for e in await h.store.conversation(thread)
            for b in e.body.get("content", [])
        ]
        assert any("amount is too large" in str(s) for s in said), said
        assert await h.charges() == 0


@pytest.mark.parametrize(
    "amount", ["9" * 400, 1e308, -1e308, 10**400], ids=["400-nines", "1e308", "-1e308", "10**400"]
)
async def test_edit_with_huge_amount_is_invalid_input(database_url: str, amount: Any) -> None:
    async with harness(database_url, model=OfflineDemoModel()) as h:
        thread = await h.thread("dave")
        await h.say(thread, "cobre 150 do João", "dave")
        [card] = await h.store.pending_cards(thread)
        with pytest.raises(InvalidInput):
            await h.decide(card, Decision.EDIT, edits={"amount": amount})
        assert (await h.store.get_card(card.id)).status is Status.PENDING
