"""The offline demo model through the real agent loop (issue 17): the reply's language
follows the message, a read makes no card and promises none, and an approved charge is
summed up in one sentence of the person's language. Real Postgres and Redis."""

from __future__ import annotations

import pytest

from signoff.demo.offline_model import LABEL, OfflineDemoModel
from signoff.runtime.cards import Decision, Status
from tests.harness import harness

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("read", "answer"),
    [
        ("saldo", "Seu saldo é R$ 5.000,00."),
        ("what is my balance?", "Your balance is R$ 5,000.00."),
    ],
)
async def test_a_read_makes_no_card_and_says_none(
    database_url: str, read: str, answer: str
) -> None:
    async with harness(database_url, model=OfflineDemoModel()) as h:
        thread = await h.thread("alice")
        await h.say(thread, read, "alice")
        await h.settle()
        assert [c for c in await h.store.list_cards(owner="alice") if c.tenant == h.tenant] == []
        assert await h.last_reply(thread) == LABEL + answer
        said = [e.body for e in await h.store.entries_after(thread, 0) if e.kind == "assistant"]
        assert "cart" not in str(said).lower() and "card" not in str(said).lower()


@pytest.mark.parametrize(
    ("ask", "done"),
    [
        ("cobra o João em 150", "Cobrança Pix de R$ 150,00 criada para João;"),
        ("charge 150 to João", "Pix charge of R$ 150.00 created for João;"),
    ],
)
async def test_an_approved_charge_is_one_sentence_in_the_persons_language(
    database_url: str, ask: str, done: str
) -> None:
    async with harness(database_url, model=OfflineDemoModel()) as h:
        thread = await h.thread("alice")
        await h.say(thread, ask, "alice")
        [card] = await h.store.pending_cards(thread)
        assert card.args_snapshot["amount_cents"] == 15000
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.EXECUTED
        reply = await h.last_reply(thread)
        assert reply.startswith(LABEL + done), reply
        for internal in ("Confirmation card", "Decided by", "{", "copy_paste", "15000"):
            assert internal not in reply


@pytest.mark.parametrize(
    ("ask", "yes", "replaced", "how"),
    [
        ("cobre 150 do João", "sim", "substituído", "Uma mensagem não aprova um cartão"),
        ("charge João 150", "yes!", "replaced", "A message does not approve a card"),
    ],
)
async def test_typing_yes_under_a_card_is_told_it_replaced_the_card_and_how_to_approve(
    database_url: str, ask: str, yes: str, replaced: str, how: str
) -> None:
    """The newcomer typed "sim" under a waiting card: the card was replaced (by design: a
    message never approves) and the assistant answered its generic help, never saying
    the card was gone nor how to approve. It says both now, in the person's language."""
    async with harness(database_url, model=OfflineDemoModel()) as h:
        thread = await h.thread("alice")
        await h.say(thread, ask, "alice")
        [card] = await h.store.pending_cards(thread)
        await h.say(thread, yes, "alice")
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.SUPERSEDED
        reply = await h.last_reply(thread)
        assert replaced in reply and how in reply, reply
        assert await h.charges() == 0


async def test_a_read_under_a_waiting_card_says_the_card_was_replaced(database_url: str) -> None:
    # A newcomer probe: "saldo" under a waiting charge answered the balance alone while the
    # card above turned "replaced".
    async with harness(database_url, model=OfflineDemoModel()) as h:
        thread = await h.thread("alice")
        await h.say(thread, "cobre 30 da Maria", "alice")
        [card] = await h.store.pending_cards(thread)
        await h.say(thread, "saldo", "alice")
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.SUPERSEDED
        said = [
            block.get("text", "")
            for e in await h.store.entries_after(thread, 0)
            if e.kind == "assistant"
            for block in e.body.get("content", [])
            if block.get("type") == "text"
        ]
        assert LABEL + "Esse cartão foi substituído pela sua nova mensagem; nada foi feito." in said
        assert said[-1] == LABEL + "Seu saldo é R$ 5.000,00."
