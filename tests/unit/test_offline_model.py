"""The offline demo model (issue 17): each phrase form in both languages, the reply's
language, no card promised where none is proposed, one human sentence per result."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from typing import Any

import pytest

from signoff.demo.money import parse_amount
from signoff.demo.offline_model import LABEL, OfflineDemoModel, intent, language
from signoff.demo.offline_words import HELP, money, not_done
from signoff.runtime.conversation import dangling_result
from signoff.runtime.errors import ToolValidationError
from signoff.runtime.records import ToolUseOutcome

CHARGES = {
    "en": [
        "charge João 150",
        "charge 150 to João",
        "Charge João R$ 150",
        "charge João 150 reais",
        "create a pix charge of 150 for João",
        "please charge joão 150",
    ],
    "pt": [
        "cobre 150 do João",
        "cobra o João em 150",
        "cobre o João 150",
        "cobrar R$ 150,00 de João",
        "gere um pix de 150 para o João",
        "cobre 150 do joão",
    ],
}


@pytest.mark.parametrize(("lang", "text"), [(k, t) for k, v in CHARGES.items() for t in v])
def test_every_charge_word_order_becomes_the_same_call(lang: str, text: str) -> None:
    use = intent(text)
    assert use is not None and use["name"] == "create_pix_charge", text
    assert use["input"]["customer"].lower() == "joão"
    assert use["input"]["amount"] in ("150", "150,00")
    assert language(text) == lang


@pytest.mark.parametrize(
    ("text", "name", "data", "lang"),
    [
        ("saldo", "get_balance", {}, "pt"),
        ("qual é o meu saldo?", "get_balance", {}, "pt"),
        ("balance", "get_balance", {}, "en"),
        ("what is my balance?", "get_balance", {}, "en"),
        ("estorne a venda V001", "refund_sale", {"sale_id": "V001"}, "pt"),
        ("refund sale V001", "refund_sale", {"sale_id": "V001"}, "en"),
        ("cancele a consulta A001", "cancel_appointment", {"appointment_id": "A001"}, "pt"),
        ("cancel appointment A001", "cancel_appointment", {"appointment_id": "A001"}, "en"),
        (
            "mude o e-mail do João para novo@example.com",
            "update_email",
            {"customer": "João", "email": "novo@example.com"},
            "pt",
        ),
        (
            "change João's email to new@example.com",
            "update_email",
            {"customer": "João", "email": "new@example.com"},
            "en",
        ),
        ("busque o cliente Maria", "find_customer", {"query": "Maria"}, "pt"),
        ("find customer Maria", "find_customer", {"query": "Maria"}, "en"),
    ],
)
def test_the_other_requests_in_both_languages(
    text: str, name: str, data: dict[str, Any], lang: str
) -> None:
    use = intent(text)
    assert use is not None and use["name"] == name and use["input"] == data
    assert language(text) == lang


def test_propose_again_text_is_the_card_not_the_cpf() -> None:
    summary = "Gerar cobrança Pix · Cliente: João Silva (CPF ***.123.456-**) · Valor: R$ 150,00"
    for prefix in ("Proponha novamente: ", "Propose again: "):
        use = intent(prefix + summary)
        assert use is not None and use["input"] == {"customer": "João", "amount": "150,00"}


def ask(messages: list[dict[str, Any]]) -> Any:
    return asyncio.run(OfflineDemoModel().respond(system="", messages=messages, tools=[]))


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def turn(text: str, result: Any, *, error: bool = False) -> tuple[dict[str, Any], str]:
    """The person's message, the model's calls and one tool_result for the first call:
    the model's reply to that result."""
    first = ask([user(text)])
    [use] = first.tool_uses()
    content = result if isinstance(result, str) else json.dumps(result)
    block = {"type": "tool_result", "tool_use_id": use["id"], "content": content}
    if error:
        block["is_error"] = True
    messages = [
        user(text),
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [block]},
    ]
    reply = ask(messages)
    return use, reply.text()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("saldo", "Seu saldo é R$ 5.000,00."), ("balance", "Your balance is R$ 5,000.00.")],
)
def test_a_read_promises_no_card_and_answers_in_one_sentence(text: str, expected: str) -> None:
    first = ask([user(text)])
    # No words before the call: nothing about a card that will never come.
    assert first.text() == "" and [u["name"] for u in first.tool_uses()] == ["get_balance"]
    _, said = turn(text, {"balance_cents": 500000, "balance": "R$ 5.000,00"})
    assert said == LABEL + expected
    for word in ("cartão", "card", "confirm", "{"):
        assert word not in said.lower()


EXECUTED = {
    "status": "executed",
    "card": "Confirmation card shown to the user: «…». Decided by demo via http.",
    "result": {"charge_id": "pix-1", "amount": 15000, "copy_paste": "00020126PIX00000001"},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "cobre 150 do João",
            "Cobrança Pix de R$ 150,00 criada para João; o código copia-e-cola está no cartão.",
        ),
        (
            "charge João 150",
            "Pix charge of R$ 150.00 created for João; the copy-and-paste code is on the card.",
        ),
    ],
)
def test_an_executed_charge_is_one_sentence_in_the_persons_language(
    text: str, expected: str
) -> None:
    _, said = turn(text, EXECUTED)
    assert said == LABEL + expected
    for internal in ("Confirmation card", "Decided by", "via http", "pix-1", "{", "15000"):
        assert internal not in said


@pytest.mark.parametrize(
    ("runtime_text", "pt", "en"),
    [
        (
            "Confirmation card shown to the user: «x». Decided by a via ws. The user REJECTED it; "
            "nothing was executed. No reason given.",
            "Certo, não fiz nada: você recusou o cartão.",
            "OK, nothing was done: you rejected the card.",
        ),
        (
            "no customer matches 'Zé'",
            "Não encontrei nenhum cliente chamado Zé.",
            "I found no customer called Zé.",
        ),
        (
            "Confirmation card shown to the user: «x». It expired without a decision; nothing was executed.",
            "O cartão expirou sem decisão; nada foi feito.",
            "The card expired without a decision; nothing was done.",
        ),
        (
            "something nobody wrote a sentence for",
            "Não consegui fazer isso.",
            "I could not do that.",
        ),
    ],
)
def test_what_did_not_run_is_said_without_english_internals(
    runtime_text: str, pt: str, en: str
) -> None:
    assert not_done(runtime_text, "pt") == pt
    assert not_done(runtime_text, "en") == en
    _, said = turn("cobre 150 do João", runtime_text, error=True)
    assert said == LABEL + pt
    _, said = turn("charge João 150", runtime_text, error=True)
    assert said == LABEL + en


@pytest.mark.parametrize(
    ("text", "lang"), [("oi", "pt"), ("hello", "en"), ("qual é a capital da França?", "pt")]
)
def test_what_it_cannot_do_is_help_in_the_persons_language(text: str, lang: str) -> None:
    reply = ask([user(text)])
    assert reply.tool_uses() == []
    said = reply.text()
    assert said.startswith(LABEL)
    assert ("Posso consultar" in said) is (lang == "pt")
    assert ("I can show" in said) is (lang == "en")
    assert "cartão" not in said.replace("cobre 150 do João", "")


def test_two_requests_in_one_message_are_two_calls() -> None:
    reply = ask([user("cobre 150 do João e depois saldo")])
    assert [u["name"] for u in reply.tool_uses()] == ["create_pix_charge", "get_balance"]
    reply = ask([user("charge João 150 and then balance")])
    assert [u["name"] for u in reply.tool_uses()] == ["create_pix_charge", "get_balance"]


def test_money_in_each_language() -> None:
    assert money(123456789, "pt") == "R$ 1.234.567,89"
    assert money(123456789, "en") == "R$ 1,234,567.89"
    assert money(5, "pt") == "R$ 0,05"


@pytest.mark.parametrize("text", ["charge João -5", "cobre −5 do João", "cobre R$ -5 do João"])
def test_a_minus_sign_is_kept_so_the_tool_refuses_it(text: str) -> None:
    """It was dropped: "charge João -5" proposed a charge of R$ 5,00."""
    (use,) = ask([user(text)]).tool_uses()
    assert use["name"] == "create_pix_charge"
    assert use["input"]["amount"] in ("-5", "−5")
    with pytest.raises(ToolValidationError):
        parse_amount(use["input"]["amount"])


@pytest.mark.parametrize(
    "text", ["cobre 1e309 do João", "charge João 150k", "cobre 2x3 do João", "charge João 1E2"]
)
def test_a_number_run_into_letters_is_passed_whole_so_the_tool_refuses_it(text: str) -> None:
    """ "cobre 1e309 do João" proposed a card of R$ 1,00 (its leading digit), "150k" one of
    R$ 150,00."""
    (use,) = ask([user(text)]).tool_uses()
    assert use["name"] == "create_pix_charge"
    assert use["input"]["amount"] in ("1e309", "150k", "2x3", "1E2")
    with pytest.raises(ToolValidationError):
        parse_amount(use["input"]["amount"])


def test_a_currency_word_run_into_the_number_is_still_the_amount() -> None:
    (use,) = ask([user("charge João 150reais")]).tool_uses()
    assert parse_amount(use["input"]["amount"]) == 15000


@pytest.mark.parametrize(
    ("text", "cents"),
    [
        ("charge João 1,000.00", 100000),
        ("charge João 1,234,567.89", None),
        ("cobre 1.000,00 do João", 100000),
        ("cobre 1.234.567,89 do João", None),
        ("charge João 1,000", None),
        ("cobre 150,50 do João", 15050),
    ],
)
def test_thousands_in_either_language_are_the_amount(text: str, cents: int | None) -> None:
    """ "charge João 1,000.00" proposed R$ 1,00 (only the Brazilian grouping was known).
    (None: read whole, and above the demo's limit, so the tool refuses it.)"""
    (use,) = ask([user(text)]).tool_uses()
    if cents is None:
        assert use["input"]["amount"] in ("1,234,567.89", "1.234.567,89", "1,000")
        with pytest.raises(ToolValidationError, match=r"too large|ambiguous"):
            parse_amount(use["input"]["amount"])
    else:
        assert parse_amount(use["input"]["amount"]) == cents


@pytest.mark.parametrize(
    "text",
    [
        "Oi, cobre 150 do João",
        "Bom dia! Cobre 150 do João",
        "Hi, please charge João 150",
        "Hey can you charge João 150?",
        "Olá, cobre 150 do João",
    ],
)
def test_a_greeting_is_not_the_customer(text: str) -> None:
    """ "Oi, cobre 150 do João" looked for a customer named "Oi"."""
    (use,) = ask([user(text)]).tool_uses()
    assert use["input"] == {"customer": "João", "amount": "150"}


def test_a_refund_with_an_amount_is_a_partial_refund() -> None:
    """ "estorne 50 da venda V001" proposed the whole sale's refund."""
    (use,) = ask([user("estorne 50 da venda V001")]).tool_uses()
    assert use["input"] == {"sale_id": "V001", "amount": "50"}
    (use,) = ask([user("refund sale V001")]).tool_uses()
    assert use["input"] == {"sale_id": "V001"}
    # a date is no amount (the review: "de 12/03" proposed refunding R$ 12,00)
    for dated in ("estorne a venda V001 de 12/03", "refund sale V001 from 2026-12-03"):
        (use,) = ask([user(dated)]).tool_uses()
        assert use["input"] == {"sale_id": "V001"}, dated


def test_parsing_a_long_message_grows_linearly() -> None:
    """The hostile prober's repro: the e-mail pattern tried every start inside a long
    word, so parsing took quadratic time (8,000 characters: ~1 s of CPU per message, the
    event loop of `signoff dev` blocked meanwhile). Checked by growth, not by a deadline:
    16x the text must cost far less than 256x the time."""
    import time

    from signoff.demo import offline_model

    def cost(n: int) -> float:
        text = "cobre 150 do Joao " + "z" * (n // 2) + "@" + "." * (n // 2)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            offline_model.intent(text)
            offline_model.amount_of(text)
            best = min(best, time.perf_counter() - t0)
        return best

    small, large = cost(1_000), cost(16_000)
    assert large < 80 * max(small, 1e-4), (small, large)


def test_a_message_whose_words_do_not_tell_is_answered_in_the_conversations_language() -> None:
    """On an English page "what can you do?" and "💸💸💸" were answered in Portuguese
    ("do" counted as Portuguese; an emoji has no words, and a tie was Portuguese)."""
    reply = ask([user("what can you do?")])
    assert "I can show the balance" in reply.content[0]["text"]
    earlier = [
        user("charge João 150"),
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    ]
    reply = ask([*earlier, user("💸💸💸")])
    assert "I can show the balance" in reply.content[0]["text"]
    assert "Posso consultar" in ask([user("💸💸💸")]).content[0]["text"]  # nothing tells


def test_the_same_outcome_of_several_calls_is_said_once() -> None:
    """ "Reject all" of two cards: "OK, nothing was done: you rejected the card." twice."""
    calls = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "a", "name": "create_pix_charge", "input": {}},
            {"type": "tool_use", "id": "b", "name": "refund_sale", "input": {}},
        ],
    }
    rejected = "Card … The user REJECTED it; nothing was executed. No reason given."
    results = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": i, "content": rejected, "is_error": True}
            for i in ("a", "b")
        ],
    }
    text = ask([user("charge João 150 and refund sale V002"), calls, results]).content[0]["text"]
    assert text.count("you rejected the card") == 1, text


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        ("não cobre 150 do João", "pt"),
        ("Nao estorne a venda V001", "pt"),
        ("nunca cancele a consulta A001", "pt"),
        ("don't charge João 150", "en"),
        ("do not refund V001", "en"),
    ],
)
def test_a_request_in_the_negative_proposes_nothing(text: str, lang: str) -> None:
    """The hostile probe: "não cobre 150 do João" made an R$ 150,00 card."""
    from signoff.demo.offline_model import OfflineDemoModel, intent

    assert intent(text) is None
    messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    reply = asyncio.run(OfflineDemoModel().respond(system="", messages=messages, tools=[]))
    assert reply.tool_uses() == []
    said = reply.text()
    assert ("nada foi proposto" if lang == "pt" else "nothing was proposed") in said, said
    assert intent("cobre 150 do João, não do Zé") is not None  # a "não" later is not one


@pytest.mark.parametrize(
    "text",
    [
        "Não, cobre 150 do João",
        "não sei, cobre 150 do João",
        "Nao. Cobre 150 do João",
        "no, charge João 150",
        "Don't know, charge João 150",
    ],
)
def test_a_no_on_its_own_before_a_request_is_no_refusal(text: str) -> None:
    """A review: "Não, cobre 150 do João" (a correction) was told "Certo, não vou fazer
    isso", which was false: the request after the "não" stands."""
    from signoff.demo.offline_model import intent

    use = intent(text)
    assert use is not None and use["name"] == "create_pix_charge", text
    assert use["input"]["customer"] == "João", use  # not "Não" (a review)
    assert use["input"]["customer"] == "João", use  # not "Não" (a review)


def test_refusals_name_the_limit_and_the_sign_in_the_persons_language() -> None:
    """The newcomer probe: "cobre -5" was told "use reais, up to R$ 1.000.000,00" and a
    charge over the policy's limit "policy does not allow that", with no limit named."""
    from signoff.demo.offline_words import not_done

    policy = "Denied by policy: Pix charges above R$ 10.000,00 are not allowed from chat"
    assert "acima de R$ 10.000,00" in not_done(policy, "pt")
    assert "above R$ 10.000,00" in not_done(policy, "en")
    assert not_done("amount must be positive", "pt") == "O valor precisa ser maior que zero."
    assert not_done("amount is too large", "pt") == "Esse valor é grande demais."
    assert not_done("amount is too large", "en") == "That amount is too large."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cobre 100", "Falta o cliente: escreva o pedido inteiro, por ex. “cobre 100 do João”."),
        ("cobre do João", "Falta o valor: escreva o pedido inteiro, por ex. “cobre 150 do João”."),
        ("charge João", "The amount is missing: write the whole request, e.g. “charge João 150”."),
    ],
)
def test_a_charge_missing_who_or_how_much_says_what_is_missing(text: str, expected: str) -> None:
    """The newcomer probe: "cobre 100" got the whole help text."""
    from signoff.demo.offline_model import OfflineDemoModel

    messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    reply = asyncio.run(OfflineDemoModel().respond(system="", messages=messages, tools=[]))
    assert reply.tool_uses() == [] and reply.text().endswith(expected), reply.text()


@pytest.mark.parametrize(
    ("text", "charges"),
    [
        ("cobre 150 do João e 30 da Maria", [("João", "150"), ("Maria", "30")]),
        ("cobre 150 do João, 30 da Maria", [("João", "150"), ("Maria", "30")]),
        ("Charge Maria 20 and João 30", [("Maria", "20"), ("João", "30")]),
        ("cobre R$ 1.500,00 do João e 30 da Maria", [("João", "1.500,00"), ("Maria", "30")]),
        ("cobre 150 reais e 50 centavos do João", [("João", "150,50")]),
        ("cobre 150 do João e R$ 1.500,00 da Maria", [("João", "150"), ("Maria", "1.500,00")]),
        ("cobre 1.500 do João e 2.000,50 da Maria", [("João", "1.500"), ("Maria", "2.000,50")]),
        ("cobre 150 do João e depois 30 da Maria", [("João", "150"), ("Maria", "30")]),
        ("cobre do João 150 e da Maria 30", [("João", "150"), ("Maria", "30")]),
        ("cobre o João em 150 e a Maria em 30", [("João", "150"), ("Maria", "30")]),
        ("cobre 150 do João; 30 da Maria", [("João", "150"), ("Maria", "30")]),
        ("cobre 150 do João. E 30 da Maria", [("João", "150"), ("Maria", "30")]),
        ("cobre 150 do João, referente ao aluguel", [("João", "150")]),
    ],
)
def test_every_charge_of_a_list_is_a_call_and_cents_count(
    text: str, charges: list[tuple[str, str]]
) -> None:
    """The newcomer probe: "cobre 150 do João e 30 da Maria" made one card and dropped
    the second charge without a word; "150 reais e 50 centavos" was R$ 150,00."""
    reply = ask([user(text)])
    assert [(u["input"]["customer"], u["input"]["amount"]) for u in reply.tool_uses()] == charges


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        ("manda um pix de 150 pro João", "pt"),
        ("faz um pix de 150 pro João", "pt"),
        ("pay João 150 via pix", "en"),
    ],
)
def test_sending_a_pix_is_not_a_charge(text: str, lang: str) -> None:
    """The newcomer probe: "manda um pix de 150 pro João" (send João money) made a card
    charging João R$ 150,00."""
    reply = ask([user(text)])
    assert reply.tool_uses() == []
    said = reply.text()
    assert ("não envio Pix" if lang == "pt" else "do not send Pix") in said, said
    assert ask([user("gere um pix de 150 para o João")]).tool_uses() != []  # a charge


def test_a_sale_refunded_in_full_is_said_in_the_persons_language() -> None:
    assert not_done("sale V002 is already refunded in full", "pt") == (
        "A venda V002 já foi estornada por inteiro; não há o que estornar."
    )


def _waiting(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": i, "name": "create_pix_charge", "input": {}} for i in ids
        ],
    }


def _replaced(text: str, *ids: str) -> dict[str, Any]:
    """The person's new message under waiting cards, with the results the runtime gives
    the calls it left without one (runtime/conversation.py: DANGLING)."""
    dangling = "Not completed: the user sent a new message before this was decided."
    return {
        "role": "user",
        "content": [
            *(
                {"type": "tool_result", "tool_use_id": i, "content": dangling, "is_error": True}
                for i in ids
            ),
            {"type": "text", "text": text},
        ],
    }


def test_a_request_under_a_waiting_card_says_the_card_was_replaced() -> None:
    # A newcomer probe: "saldo" under a waiting charge answered the balance alone, and the
    # card turned "replaced" with no word about it ("sim" under it was explained).
    reply = ask([user("cobre 30 da Maria"), _waiting("a"), _replaced("saldo", "a")])
    assert reply.stop_reason == "tool_use"
    first, call = reply.content
    assert first["type"] == "text" and first["text"].startswith(LABEL)
    assert "Esse cartão foi substituído pela sua nova mensagem" in first["text"]
    assert call["type"] == "tool_use"
    both = ask(
        [user("charge Maria 30 and João 10"), _waiting("a", "b"), _replaced("balance", "a", "b")]
    )
    assert "Those cards were replaced by your newer message" in both.content[0]["text"]
    assert ask([user("saldo")]).content[0]["type"] == "tool_use"  # nothing replaced: no words


def _told(text: str, outcomes: dict[str, ToolUseOutcome]) -> dict[str, Any]:
    """The person's new message under cards, each call given the result the runtime gives
    a call its run left without one (conversation.dangling_result), from its card."""
    blocks = []
    for use_id, outcome in outcomes.items():
        content, is_error = dangling_result(outcome)
        blocks.append(
            {"type": "tool_result", "tool_use_id": use_id, "content": content, "is_error": is_error}
        )
    return {"role": "user", "content": [*blocks, {"type": "text", "text": text}]}


def test_a_card_that_ran_or_may_have_run_before_the_new_message_is_not_said_undone() -> None:
    """A hostile probe: a charge approved beside a waiting card ran (design note 60), or
    was still running, when the person wrote again; the demo said "nothing was done" (or
    "I could not do that") of it."""
    charge = {"type": "tool_use", "id": "a", "name": "create_pix_charge"}
    asked = {
        "role": "assistant",
        "content": [
            {**charge, "input": {"customer": "João", "amount": "30"}},
            {**charge, "id": "b", "input": {"customer": "Maria", "amount": "20"}},
        ],
    }
    ran = ToolUseOutcome(
        status="executed", result={"charge_id": "pix-1", "amount": 3000, "copy_paste": "000201"}
    )
    left = ToolUseOutcome(status="superseded")
    said = ask(
        [user("cobre 30 do João e 20 da Maria"), asked, _told("obrigado", {"a": ran, "b": left})]
    )
    text = said.content[0]["text"]
    assert "R$ 30,00 criada para João" in text
    assert "Esse cartão foi substituído" in text and "Não consegui" not in text
    running = ToolUseOutcome(status="executing")
    said = ask(
        [user("charge João 30 and Maria 20"), asked, _told("thanks", {"a": running, "b": left})]
    )
    text = said.content[0]["text"]
    assert "it may have been done" in text and "could not" not in text


def test_call_ids_do_not_repeat_across_processes() -> None:
    """A hostile probe: the ids were a count from 1 in every process, so after a worker
    restart (or on the other worker) a thread's next call repeated an id already in it,
    and the runtime refused the call: "I could not do that" to a plain request."""
    script = (
        "from signoff.demo.offline_model import intent; print(intent('cobra 150 do João')['id'])"
    )
    ids = [
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    assert all(ids) and ids[0] != ids[1], ids


def test_propose_again_answers_in_the_pages_language() -> None:
    """A first-hour probe: the page's "Propose again: <the card's Portuguese summary>"
    switched an English conversation to Portuguese (the summary's words outweighed)."""
    summary = "Gerar cobrança Pix · Cliente: João Silva · Valor: R$ 5,00"
    assert language(f"Propose again: {summary}") == "en"
    assert language(f"Proponha novamente: {summary}") == "pt"


@pytest.mark.parametrize("lang", ["pt", "en"])
def test_every_example_the_help_gives_is_understood(lang: str) -> None:
    """A first-hour probe: appointments could only be cancelled by an id that nothing
    said how to give; the help now shows it, and each of its examples is a request."""
    examples = re.findall(r'"([^"]+)"', HELP[lang])
    assert len(examples) == 3
    assert all(intent(example) is not None for example in examples), examples


def test_propose_again_keeps_the_cards_description() -> None:
    """A first-hour walkthrough: "Propose again" of an edited charge (with a description)
    made a card without it: the page sent the summary alone, and the model read no
    description. The page sends the card's fields too; the model reads them."""
    text = (
        "Proponha novamente: Gerar cobrança Pix · Cliente: João Silva (CPF ***.123.456-**)"
        " · Valor: R$ 1.234,56 · Descrição: aluguel de março"
    )
    (use,) = ask([user(text)]).tool_uses()
    assert use["input"] == {
        "customer": "João",
        "amount": "1.234,56",
        "description": "aluguel de março",
    }
    (plain,) = ask([user("cobre 150 do João")]).tool_uses()
    assert "description" not in plain["input"]
