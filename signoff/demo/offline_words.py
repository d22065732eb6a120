"""What the offline demo model says, in Portuguese and in English (pure).

Every sentence is written here, per language, so a Portuguese reply never carries the
runtime's English internals (the tool_result text meant for a real model) and never
shows raw JSON: each tool result becomes one human sentence.
"""

from __future__ import annotations

import re
from typing import Any

PT = "pt"
EN = "en"

_PT_MARKS = re.compile(
    r"\b(?:cobr\w*|saldo|estorn\w*|reembols\w*|cancel[ae]\w*|consulta|venda|cliente|mude|"
    r"alter\w*|troqu\w*|busqu\w*|procur\w*|ger[ae]|d[oae]s?|para|pra|em|o|um|uma|meu|minha|"
    r"qual|quanto|obrigad\w*|oi|ol[aá]|é|não|você|por favor)(?!\w)",
    re.IGNORECASE,
)
_EN_MARKS = re.compile(
    r"\b(?:charge|balance|refund|sale|appointment|customer|change|find|search|look|"
    r"to|for|from|the|of|my|what|how|much|please|thanks|hi|hello|help|email|can|you|your|pay|send|via|"
    r"is|are|with|and|this|that|yes|no|not|never|don't)\b",
    re.IGNORECASE,
)
# A message that only says yes ("sim", "ok", "👍"): typed while a card waited, it replaced
# the card (a message never approves one) and the person is told how to approve.
YES = re.compile(
    r"^\W*(?:sim|s|ok|okay|yes|y|yep|confirm[oa]?|confirmar|confirm|aprov[oa]|aprovad[oa]|"
    r"approve|approved|pode|podes|claro|isso|beleza|go|do it|faça|faz)\W*$|^\s*👍\s*$",
    re.IGNORECASE,
)
# A request said in the negative ("não cobre o João", "don't refund V001"): nothing is
# proposed (the hostile probe: a card was made for "não cobre 150 do João").
# A "não" answered on its own ("Não, cobre 150 do João": a correction) or "não sei" (I
# do not know) starts no refusal: the request after it stands.
NEGATED = re.compile(
    r"^\W*(?:n[ãa]o|nunca|jamais|don'?t|do not|never|no need to)\b"
    r"(?!\s*[,.;:!?…-])(?!\s+(?:sei|know)\b)",
    re.IGNORECASE,
)
CANNOT_SEND = {
    PT: (
        "Eu não envio Pix nem pago ninguém: só gero cobranças Pix (pedir um valor a um "
        "cliente, por ex. “cobre 150 do João”) e faço estornos. Nada foi proposto."
    ),
    EN: (
        "I do not send Pix payments or pay anyone: I only create Pix charges (asking a "
        "customer for an amount, e.g. “charge João 150”) and refunds. Nothing was proposed."
    ),
}
NOT_ASKED = {
    PT: "Certo, não vou fazer isso; nada foi proposto.",
    EN: "OK, I will not do that; nothing was proposed.",
}
TYPED_YES = {
    PT: (
        "Uma mensagem não aprova um cartão: use o botão Confirmar no próprio cartão. "
        "Peça de novo para ver um novo cartão."
    ),
    EN: (
        "A message does not approve a card: use the Confirm button on the card itself. "
        "Ask again to get a new card."
    ),
}


# The chat page's "Propose again" message: its words are the page's language, the card's
# summary after them the desk's (Portuguese), which outweighed them on an English page.
_AGAIN = (("propose again:", EN), ("proponha novamente:", PT))


def detected(text: str) -> str | None:
    """The language a message is written in, or None when its words do not tell."""
    head = text.lstrip().lower()
    for prefix, lang in _AGAIN:
        if head.startswith(prefix):
            return lang
    pt = len(_PT_MARKS.findall(text))
    en = len(_EN_MARKS.findall(text))
    return EN if en > pt else PT if pt > en else None


def language(text: str) -> str:
    """The language a message is written in: ``"pt"`` or ``"en"`` (a tie: Portuguese,
    the demo desk's own language)."""
    return detected(text) or PT


def money(cents: int, lang: str) -> str:
    """15000 -> "R$ 150,00" (pt) or "R$ 150.00" (en)."""
    reais, cent = divmod(abs(cents), 100)
    sign = "-" if cents < 0 else ""
    grouped = f"{reais:,}"
    if lang == EN:
        return f"{sign}R$ {grouped}.{cent:02d}"
    return f"{sign}R$ {grouped.replace(',', '.')},{cent:02d}"


HELP = {
    PT: (
        "Posso consultar o saldo, buscar clientes, gerar cobranças Pix, estornar vendas, "
        'cancelar consultas e alterar e-mails. Ex.: "cobre 150 do João", "saldo" ou '
        '"cancele a consulta A001".'
    ),
    EN: (
        "I can show the balance, find customers, create Pix charges, refund sales, cancel "
        'appointments and change e-mails. E.g. "charge João 150", "balance" or "cancel '
        'appointment A001".'
    ),
}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def done(tool: str, data: dict[str, Any], result: dict[str, Any], lang: str) -> str:
    """One sentence for a tool that ran: ``data`` is the call's input, ``result`` its output."""
    pt = lang == PT
    if tool == "get_balance":
        cents = _int(result.get("balance_cents"))
        shown = money(cents, lang) if cents is not None else str(result.get("balance", "?"))
        return f"Seu saldo é {shown}." if pt else f"Your balance is {shown}."
    if tool == "find_customer":
        names = [str(c.get("name")) for c in result.get("customers", []) if isinstance(c, dict)]
        if not names:
            q = data.get("query", "")
            return (
                f"Não encontrei nenhum cliente com {q!s}." if pt else f"No customer matches {q!s}."
            )
        listed = ", ".join(names)
        if pt:
            return f"Encontrei {len(names)} cliente{'s' if len(names) > 1 else ''}: {listed}."
        return f"Found {len(names)} customer{'s' if len(names) > 1 else ''}: {listed}."
    cents = _int(result.get("amount"))
    amount = money(cents, lang) if cents is not None else ""
    if tool == "create_pix_charge":
        who = str(data.get("customer", "")).strip()
        if pt:
            return (
                f"Cobrança Pix de {amount} criada para {who}; o código copia-e-cola está no cartão."
            )
        return f"Pix charge of {amount} created for {who}; the copy-and-paste code is on the card."
    if tool == "refund_sale":
        sale = str(data.get("sale_id", "")).upper()
        return (
            f"Estorno de {amount} feito na venda {sale}."
            if pt
            else f"Refunded {amount} on sale {sale}."
        )
    if tool == "cancel_appointment":
        appt = str(result.get("appointment_id", data.get("appointment_id", "")))
        return f"Consulta {appt} cancelada." if pt else f"Appointment {appt} cancelled."
    if tool == "update_email":
        email = str(result.get("email", data.get("email", "")))
        who = str(data.get("customer", "")).strip()
        return (
            f"E-mail de {who} alterado para {email}." if pt else f"{who}'s e-mail is now {email}."
        )
    return "Feito." if pt else "Done."


# The runtime's tool_result texts for a card that did not run (runtime/outcomes.py), and
# the demo tools' refusals (signoff/demo/tools.py, money.py), each as a sentence per language.
_NOT_DONE: list[tuple[re.Pattern[str], str, str]] = [
    (
        re.compile(r"REJECTED"),
        "Certo, não fiz nada: você recusou o cartão.",
        "OK, nothing was done: you rejected the card.",
    ),
    (
        re.compile(r"expired without a decision"),
        "O cartão expirou sem decisão; nada foi feito.",
        "The card expired without a decision; nothing was done.",
    ),
    (
        re.compile(r"the user approved this, but it did not run"),
        "Foi aprovado, mas não chegou a ser executado (a conversa seguiu antes); nada foi feito.",
        "It was approved but did not run (the conversation moved on first); nothing was done.",
    ),
    (
        re.compile(r"the user rejected this"),
        "Certo, não fiz nada: você recusou o cartão.",
        "OK, nothing was done: you rejected the card.",
    ),
    (
        re.compile(r"Superseded|sent a new message before this was decided"),
        "Esse cartão foi substituído pela sua nova mensagem; nada foi feito.",
        "That card was replaced by your newer message; nothing was done.",
    ),
    (
        re.compile(r"NOT executed"),
        "Foi aprovado, mas não executado: algo mudou desde o cartão. Peça de novo se ainda quiser.",
        "It was approved but not executed: something changed since the card. Ask again if you "
        "still want it.",
    ),
    (
        re.compile(r"Execution failed"),
        "A execução falhou; nada foi confirmado.",
        "The execution failed; nothing was confirmed.",
    ),
    (
        re.compile(r"the user approved this, but it failed"),
        "Foi aprovado, mas a execução falhou; nada foi confirmado.",
        "It was approved, but it failed; nothing was confirmed.",
    ),
    (
        re.compile(r"Outcome unknown: this was approved and already executing"),
        "Foi aprovado e já estava em execução quando você escreveu: pode ter sido feito. "
        "Confira antes de pedir de novo.",
        "It was approved and already running when you wrote: it may have been done. Check "
        "before asking again.",
    ),
    (
        re.compile(r"outcome is unknown"),
        "O resultado é incerto; um operador vai verificar. Não repita o pedido.",
        "The outcome is unknown; an operator will check it. Do not repeat the request.",
    ),
    (
        re.compile(r"already rejected this exact action"),
        "Você já recusou exatamente isso agora há pouco; não vou propor de novo.",
        "You already rejected exactly this a moment ago; I will not propose it again.",
    ),
    (
        re.compile(r"Denied by policy: Pix charges above (R\$ [\d.,]+)"),
        "A política desta conta não permite cobranças Pix acima de {0} pelo chat.",
        "This account's policy does not allow Pix charges above {0} from chat.",
    ),
    (
        re.compile(r"Denied by policy"),
        "A política desta conta não permite isso.",
        "This account's policy does not allow that.",
    ),
    (
        re.compile(r"no customer matches '([^']*)'"),
        "Não encontrei nenhum cliente chamado {0}.",
        "I found no customer called {0}.",
    ),
    (
        re.compile(r"'([^']*)' is ambiguous: ([^;]*);"),
        "Há mais de um cliente chamado {0} ({1}); qual deles?",
        "More than one customer is called {0} ({1}); which one?",
    ),
    (
        re.compile(r"no sale '([^']*)'"),
        "Não encontrei a venda {0}.",
        "I found no sale {0}.",
    ),
    (
        re.compile(r"no appointment '([^']*)'"),
        "Não encontrei a consulta {0}.",
        "I found no appointment {0}.",
    ),
    (
        re.compile(r"appointment (\S+) is (\w+)"),
        "A consulta {0} não está agendada.",
        "Appointment {0} is not scheduled.",
    ),
    (
        re.compile(r"Not run: at most (\d+) actions"),
        "Faço no máximo {0} pedidos de uma vez; peça o resto depois de decidir estes.",
        "I take at most {0} requests at a time; ask for the rest once these are decided.",
    ),
    (
        re.compile(r"sale (\S+) is already refunded in full"),
        "A venda {0} já foi estornada por inteiro; não há o que estornar.",
        "Sale {0} is already refunded in full; there is nothing left to refund.",
    ),
    (
        re.compile(r"only (R\$ [\d.,]+) of sale (\S+) can be refunded"),
        "Só {0} da venda {1} ainda pode ser estornado.",
        "Only {0} of sale {1} can still be refunded.",
    ),
    (
        re.compile(r"does not cover"),
        "O saldo não cobre esse estorno.",
        "The balance does not cover that refund.",
    ),
    (
        re.compile(r"is not an e-mail address"),
        "Esse endereço de e-mail não é válido.",
        "That is not a valid e-mail address.",
    ),
    (
        re.compile(r"amount must be positive"),
        "O valor precisa ser maior que zero.",
        "The amount must be more than zero.",
    ),
    (
        re.compile(r"amount ('.*') is ambiguous"),
        "O valor {0} é ambíguo: escreva 1234 (ou 1.234) para milhares, ou 1,23 para centavos.",
        "The amount {0} is ambiguous: write 1234 (or 1.234) for a thousand and more, or 1.23 "
        "for cents.",
    ),
    (
        re.compile(r"amount is too large"),
        "Esse valor é grande demais.",
        "That amount is too large.",
    ),
    (
        re.compile(r"amount"),
        "Esse valor não é um número de reais (ex.: 150 ou 150,00).",
        "That amount is not a number of reais (e.g. 150 or 150.00).",
    ),
]


# A sentence said once for several calls, as it reads for more than one.
PLURAL = {
    "Esse cartão foi substituído pela sua nova mensagem; nada foi feito.": (
        "Esses cartões foram substituídos pela sua nova mensagem; nada foi feito."
    ),
    "That card was replaced by your newer message; nothing was done.": (
        "Those cards were replaced by your newer message; nothing was done."
    ),
}


def not_done(text: str, lang: str) -> str:
    """One sentence for a call that did not run (a refusal or a card that was not executed)."""
    for pattern, pt, en in _NOT_DONE:
        found = pattern.search(text)
        if found:
            return (pt if lang == PT else en).format(*found.groups())
    return "Não consegui fazer isso." if lang == PT else "I could not do that."
