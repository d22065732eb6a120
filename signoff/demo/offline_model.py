"""An offline demo model: rule-based, clearly labelled, no API key needed.

It understands a few payments-desk requests in Portuguese and English, in the usual
word orders ("cobre 150 do João", "cobra o João em 150", "charge João 150",
"charge 150 to João", "refund sale V001", "saldo") and turns them into the same
``tool_use`` blocks Claude would send, so ``signoff dev`` shows the whole card flow on
a fresh machine. It answers in the language of the person's last message, says
nothing about a card before one exists (a write's card is the runtime's to show), and
sums each result up in one sentence (``offline_words``). With ``ANTHROPIC_API_KEY``
set, Claude is used.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from signoff import Message, ModelReply, TextSink, ToolSpec
from signoff.demo.offline_words import (
    CANNOT_SEND,
    HELP,
    NEGATED,
    NOT_ASKED,
    PLURAL,
    PT,
    TYPED_YES,
    YES,
    detected,
    done,
    language,
    not_done,
)

LABEL = "[offline demo model] "

# Words that start with a capital letter but are not a customer's name.
_NOT_NAMES = frozenset(
    """pix r cobre cobra cobrar cobrança cobranca charge gere gera gerar crie cria create
    make send envie refund estorne estorna estornar reembolse saldo balance cliente customer
    change mude muda mudar altere altera alterar troque find busque busca buscar procure
    search look cancel cancele cancela cancelar please por favor o a os as um uma the of to
    for from do da de dos das para em e and then depois i me my meu minha email e-mail new
    novo nova what qual quanto how show mostre propose proponha again novamente valor
    oi olá ola bom boa dia tarde noite hi hey hello hola obrigado obrigada thanks
    sim não nao no yes ok okay agora então entao now so well bem ah don know sei""".split()
)
_CAPITAL = re.compile(r"(?<![\w@.])([A-ZÀ-Ý][a-zà-ÿ]+)(?:'s)?\b")
_AFTER = re.compile(
    r"\b(?:d[oae]s?|para|pra|for|to|from|cliente|customer|o|a|charge|cobr[ae]r?)\s+"
    r"(?:o\s+|a\s+)?([a-zà-ÿ][a-zà-ÿ]+)\b",
    re.IGNORECASE,
)
# A minus sign written before a number is kept (the tool then refuses the amount, and the
# person is told), never dropped: "-5" is not a charge of 5.
AMOUNT = re.compile(
    r"(?:R\$\s*)?((?:(?<![\w-])[-\u2212])?(?:\d{1,3}(?:([.,])\d{3})(?:\2\d{3})*(?:[.,]\d{1,2})?"
    r"|\d+(?:[.,]\d{1,2})?))"
)
_UNIT = re.compile(r"(?:reais|real|brl)\b", re.IGNORECASE)  # "150reais" is 150
_DATES = re.compile(r"\b\d{1,4}[/-]\d{1,2}(?:[/-]\d{2,4})?\b")
_IDS = re.compile(r"\b[VvAa]\d{3}\b|\(CPF[^)]*\)")
EMAIL = re.compile(r"(?<![^@\s])[^@\s]+@[^@\s]+\.\w+")
_SPLIT = re.compile(
    r"[,;]?\s+(?:e|and|depois|then|e depois|and then)\s+(?=\S*\s*(?:cobr|charge|estorn|reembols|"
    r"refund|cancel|saldo|balance|alter|mude|change|busc|find|procur))",
    re.IGNORECASE,
)


# "cobre 150 do João e 30 da Maria", "charge Maria 20 and João 30": a second charge said
# without its verb (the newcomer probe: only the first got a card, the second was dropped).
_MORE = re.compile(
    r"(?:,\s+|;\s*|\.\s+(?:e\s+|and\s+)?|\s+(?:e|and)\s+(?:depois\s+|then\s+)?)"
    r"(?=(?:R\$\s*)?\d[\d.,]*\s+(?!centavos?\b)\S"
    r"|(?:d[aoe]s?\s+|o\s+|a\s+)?[A-ZÀ-Ý][\w\u00C0-\u017F]*\s+(?:em\s+)?(?:R\$\s*)?\d)"
)
_CHARGE = re.compile(r"cobr|charge", re.IGNORECASE)
_CENTS = re.compile(r"^\s*(?:reais|real)\s+e\s+(\d{1,2})\s+centavos?\b", re.IGNORECASE)
# Sending money is not what the demo does: "manda um pix de 150 pro João" asked for a
# charge card (money asked *from* João) in the newcomer probe.
SEND = re.compile(
    r"\b(?:mand|envi|fa[zç]|pag|transf|send|pay|transfer|wire)\w*\b.*\bpix\b", re.IGNORECASE
)


_DESCRIPTION = re.compile(r"(?:descrição|description)\s*:\s*([^·]+)", re.IGNORECASE)


def requests(text: str) -> list[str]:
    """The requests of a message: split before each verb (``_SPLIT``), and a charge's
    verb carried over to the charges listed after it without one."""
    out: list[str] = []
    for part in _SPLIT.split(text):
        pieces = _MORE.split(part) if _CHARGE.search(part) and not SEND.search(part) else [part]
        verb = _CHARGE.search(pieces[0])
        out.append(pieces[0])
        for piece in pieces[1:]:
            lead = "cobre " if verb is not None and verb.group(0).lower() == "cobr" else "charge "
            out.append(piece if _CHARGE.search(piece) else lead + piece)
    return out


def customer_name(part: str) -> str | None:
    """The customer a request names: a capitalised word that is not a command word, or
    the word after "do/para/to/for/o" ("cobra o joão em 150")."""
    for found in _CAPITAL.finditer(EMAIL.sub(" ", part)):
        if found.group(1).lower() not in _NOT_NAMES:
            return found.group(1)
    for found in _AFTER.finditer(EMAIL.sub(" ", part)):
        if found.group(1).lower() not in _NOT_NAMES:
            return found.group(1)
    return None


def amount_of(part: str) -> str | None:
    """The amount in reais: the one after "R$" if there is one, else the first number.

    A number run into letters other than a currency word ("1e309", "150k", "2x") is
    passed on whole, so the tool refuses it and the person is told, rather than read as
    its leading digits (R$ 1,00, R$ 150,00)."""
    text = _DATES.sub(" ", _IDS.sub(" ", EMAIL.sub(" ", part)))  # "de 12/03" is no amount
    marked = re.search(r"R\$\s*", text)
    found = AMOUNT.search(text, marked.end() if marked else 0) or AMOUNT.search(text)
    if found is None:
        return None
    rest = text[found.end(1) :]
    if rest[:1].isalnum() and not _UNIT.match(rest):
        return text[found.start(1) :].split(None, 1)[0]
    cents = _CENTS.match(rest)  # "150 reais e 50 centavos" is 150,50 (it was 150,00)
    if cents is not None and not re.search(r"[.,]\d{1,2}$", found.group(1)):
        return f"{found.group(1)},{int(cents.group(1)):02d}"
    return found.group(1)


def _use(name: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool_use",
        # Random, not a count: a count started again with every process, and a thread's
        # next call after a worker restart (or on another worker) repeated an id already
        # in the thread, which the runtime refuses (runtime/replies.py): "I could not do
        # that" to a plain request (a hostile probe).
        "id": f"toolu_offline_{uuid.uuid4().hex[:24]}",
        "name": name,
        "input": data,
    }


def intent(part: str) -> dict[str, Any] | None:
    """The tool call one request asks for, or None (also for one said in the negative)."""
    if NEGATED.match(part) or (SEND.search(part) and not _CHARGE.search(part)):
        return None
    low = part.lower()
    if re.search(r"\bsaldo\b|\bbalance\b", low):
        return _use("get_balance", {})
    sale = re.search(r"\b(v\d{3})\b", low)
    if sale and re.search(r"estorn|reembols|refund|devolv", low):
        data: dict[str, Any] = {"sale_id": sale.group(1).upper()}
        amount = amount_of(part)  # "estorne 50 da venda V001": a partial refund
        if amount is not None:
            data["amount"] = amount
        return _use("refund_sale", data)
    appt = re.search(r"\b(a\d{3})\b", low)
    if appt and re.search(r"cancel", low):
        return _use("cancel_appointment", {"appointment_id": appt.group(1).upper()})
    name = customer_name(part)
    email = EMAIL.search(part)
    if email and name:
        return _use("update_email", {"customer": name, "email": email.group(0).rstrip(".,;")})
    if re.search(r"cobr|\bpix\b|charge", low):
        amount = amount_of(part)
        if name and amount:
            data = {"customer": name, "amount": amount}
            # "Propose again" of a card that had one ("· Descrição: aluguel de março")
            if (said := _DESCRIPTION.search(part)) is not None:
                data["description"] = said.group(1).strip()
            return _use("create_pix_charge", data)
        return None
    if re.search(r"busc|find|procur|search|look up|cliente|customer", low) and name:
        return _use("find_customer", {"query": name})
    return None


def missing(request: str, lang: str) -> str | None:
    """A charge asked for without who or how much: the question to ask back (the
    newcomer probe: "cobre 100" got the whole help text)."""
    if not re.search(r"cobr|\bpix\b|charge", request.lower()):
        return None
    name, amount = customer_name(request), amount_of(request)
    if name and not amount:
        if lang == PT:
            return f"Falta o valor: escreva o pedido inteiro, por ex. “cobre 150 do {name}”."
        return f"The amount is missing: write the whole request, e.g. “charge {name} 150”."
    if amount and not name:
        if lang == PT:
            return f"Falta o cliente: escreva o pedido inteiro, por ex. “cobre {amount} do João”."
        return f"The customer is missing: write the whole request, e.g. “charge João {amount}”."
    return None


def _user_texts(messages: list[Message]) -> list[str]:
    """The person's written messages, the last first (tool results are not theirs)."""
    out = []
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        texts = [b.get("text", "") for b in message.get("content", []) if b.get("type") == "text"]
        if texts:
            out.append(" ".join(texts))
    return out


def _language(messages: list[Message]) -> str:
    """The language of the person's last message that tells ("what can you do?", then
    "💸": English, as the conversation was); Portuguese when none does."""
    for text in _user_texts(messages):
        if (found := detected(text)) is not None:
            return found
    return PT


def _calls(messages: list[Message]) -> dict[str, dict[str, Any]]:
    """Tool calls made so far, by tool_use id."""
    out: dict[str, dict[str, Any]] = {}
    for message in messages:
        if message.get("role") == "assistant":
            for block in message.get("content", []):
                if block.get("type") == "tool_use":
                    out[str(block.get("id"))] = block
    return out


def describe(result: dict[str, Any], call: dict[str, Any] | None, lang: str) -> str:
    """One sentence for one tool_result block."""
    text = str(result.get("content", ""))
    if result.get("is_error"):
        return not_done(text, lang)
    # A call of an earlier run that ran after all: "Executed: ... Result: {...}"
    # (runtime/conversation.py); else the result is the JSON itself.
    _, said, after = text.partition(" Result: ")
    try:
        data = json.loads(after if said and text.startswith("Executed") else text)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("status") == "executed":
        data = data.get("result")
    if call is None or not isinstance(data, dict):
        return not_done("", lang) if call is None else done("", {}, {}, lang)
    return done(str(call.get("name")), dict(call.get("input") or {}), data, lang)


class OfflineDemoModel:
    name = "offline-demo"

    async def respond(
        self,
        *,
        system: str,
        messages: list[Message],
        tools: list[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        last = messages[-1] if messages else {"content": []}
        blocks = last.get("content", [])
        results = [b for b in blocks if b.get("type") == "tool_result"]
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        lang = _language(messages)
        calls = _calls(messages)
        # One sentence per outcome, each said once ("Reject all" of two cards said "you
        # rejected the card" twice).
        each = [describe(r, calls.get(str(r.get("tool_use_id"))), lang) for r in results]
        said = [PLURAL.get(s, s) if each.count(s) > 1 else s for s in dict.fromkeys(each)]
        if results and not texts:
            return await self._text(LABEL + " ".join(said), on_text)
        request = " ".join(texts)
        uses = [u for u in (intent(p) for p in requests(request)) if u is not None]
        if not uses:
            # What became of the calls the message replaced, then how to go on: typing
            # "sim" under a card replaced it, and the person is told why nothing ran.
            if said and YES.match(request):
                after = TYPED_YES[lang]
            elif any(NEGATED.match(p) for p in _SPLIT.split(request)):
                after = NOT_ASKED[lang]
            elif any(SEND.search(p) and not _CHARGE.search(p) for p in _SPLIT.split(request)):
                after = CANNOT_SEND[lang]
            else:
                after = missing(request, lang) or HELP[lang]
            return await self._text(LABEL + " ".join([*said, after]), on_text)
        # No words before the calls: a write's card is shown by the runtime once it
        # exists (a refused call has none), a read's answer comes with its result. But
        # what became of the cards the message replaced is said first ("saldo" under a
        # waiting card replaced it, and the balance alone said nothing of it).
        if said:
            first = LABEL + " ".join(said)
            if on_text is not None:
                await on_text(first)
            return ModelReply(
                content=[{"type": "text", "text": first}, *uses], stop_reason="tool_use"
            )
        return ModelReply(content=list(uses), stop_reason="tool_use")

    @staticmethod
    async def _text(text: str, on_text: TextSink | None) -> ModelReply:
        if on_text is not None:
            await on_text(text)
        return ModelReply(content=[{"type": "text", "text": text}], stop_reason="end_turn")


__all__ = ["LABEL", "PT", "OfflineDemoModel", "customer_name", "describe", "intent", "language"]
