"""What the channel sends, built by code from the stored card (never model text for cards
and notices): the card as an interactive message with Confirm / Cancel reply buttons, and
fixed notices for results, rejections, expiry and decisions taken on another channel.
Outside the 24-hour window the same text goes as the configured template."""

from __future__ import annotations

from typing import Any

from signoff.gateway.channels.whatsapp.inbound import button_id
from signoff.runtime.cards import Decision
from signoff.runtime.text import one_line
from signoff.runtime.tools import label_text

CONFIRM, CANCEL = "Confirmar", "Cancelar"  # reply-button titles: at most 20 characters
MAX_BODY = 1024  # an interactive body's limit
MAX_TEXT = 4096

CHANNEL_NAMES = {"whatsapp": "no WhatsApp", "ws": "no chat", "http": "pela API"}


TOO_LONG = (
    "Há uma confirmação pendente longa demais para mostrar aqui; nada foi feito. "
    "Decida no chat web."
)


def card_text(card: dict[str, Any], sep: str = "\n") -> str:
    """What a person reads of a card: its summary, then each labelled value the tool
    keeps apart from it (``impact.fields``: a new e-mail address, a description), one per
    line. The values are what will run: a button under the summary alone approved an
    e-mail change whose new address the person never saw."""
    lines = [str(card.get("summary", ""))]
    impact = card.get("impact")
    fields = impact.get("fields") if isinstance(impact, dict) else None
    for field in fields if isinstance(fields, list) else ():
        if isinstance(field, dict):
            lines.append(f"{field.get('label', '')}: {field.get('value', '')}")
    return sep.join(lines)


def interactive_card(to: str, card: dict[str, Any]) -> dict[str, Any]:
    """The card with Confirm / Cancel buttons, its body the summary and labelled values,
    whole (:func:`card_text`). A body over the interactive limit is never cut (a button
    must not approve what the person could not read): a fixed notice without buttons says
    to decide on the web."""
    body = card_text(card)
    if len(body) > MAX_BODY:
        return text(to, TOO_LONG)
    buttons = [
        {
            "type": "reply",
            "reply": {"id": button_id(Decision.APPROVE, card["id"]), "title": CONFIRM},
        },
        {"type": "reply", "reply": {"id": button_id(Decision.REJECT, card["id"]), "title": CANCEL}},
    ]
    return {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "interactive",
        "interactive": {
            "type": "button",
            "body": {"text": body},
            "action": {"buttons": buttons},
        },
    }


def text(to: str, body: str) -> dict[str, Any]:
    return {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "text",
        "text": {"preview_url": False, "body": body[:MAX_TEXT]},
    }


def template(to: str, name: str, language: str, body: str) -> dict[str, Any]:
    """An approved template with one body parameter: the card's summary or the notice."""
    return {
        "messaging_product": "whatsapp",
        "to": to,
        "type": "template",
        "template": {
            "name": name,
            "language": {"code": language},
            "components": [{"type": "body", "parameters": [{"type": "text", "text": body[:1024]}]}],
        },
    }


def notice(card: dict[str, Any]) -> str | None:
    """The fixed notice for a card's new status; None when nothing is worth sending
    (``approved`` on WhatsApp itself, ``executing``, ``superseded``, ``modified``)."""
    status, summary = card.get("status"), card.get("summary", "")
    where = CHANNEL_NAMES.get(str(card.get("channel") or ""), "em outro canal")
    if status == "executed":
        return f"Feito: {summary}"
    if status == "failed":
        return f"Não foi possível concluir: {summary}"
    if status == "invalidated":
        reason = (card.get("result") or {}).get("reason")
        why = one_line(label_text(reason, "pt-BR"), 200) if reason else ""
        return f"Não executado (a situação mudou{': ' + why if why else ''}): {summary}"
    if status == "expired":
        return f"Expirou sem decisão: {summary}"
    if status == "rejected":
        return f"Cancelado {where}: {summary}"
    if status == "approved" and card.get("channel") != "whatsapp":
        return f"Aprovado {where}: {summary}"
    return None


REACTION_DECIDES_NOTHING = (
    "Uma reação não decide o pedido: use o botão Confirmar ou Cancelar dele. Nada foi feito."
)

SEVERAL_WAITING = (
    'Quando você escreveu, havia mais de um pedido aguardando sua decisão, e um "sim" '
    "escrito não diz qual. Use o botão Confirmar ou Cancelar do pedido (ou responda à "
    "mensagem do próprio pedido, citando-a). Nada foi feito."
)

USE_THE_BUTTONS = (
    'Um "sim" que responde a outra mensagem não diz qual pedido confirmar. Use o botão '
    "Confirmar ou Cancelar do pedido (ou responda à mensagem do próprio pedido, citando-a). "
    "Nada foi feito."
)


def needs_button(card: dict[str, Any]) -> str:
    """The answer to a written "sim" under a card whose risk text confirmation may not
    approve."""
    return (
        "Este pedido só pode ser confirmado pelo botão Confirmar; nada foi feito: "
        f"{card.get('summary', '')}"
    )


def decided_notice(card: dict[str, Any]) -> str:
    """The answer to a late button on a card that is no longer pending."""
    where = CHANNEL_NAMES.get(str(card.get("channel") or ""), "")
    said = {
        "approved": "aprovado",
        "executing": "aprovado",
        "executed": "aprovado e executado",
        "rejected": "cancelado",
        "expired": "expirado",
        "superseded": "substituído por um pedido mais novo",
        "modified": "alterado (a versão nova é a que aguarda)",
        "invalidated": "aprovado, mas não executado (a situação mudou)",
        "failed": "aprovado, mas não foi possível concluir",
    }.get(str(card.get("status")), str(card.get("status")))
    return f"Este pedido já foi {said}{(' ' + where) if where else ''}: {card.get('summary', '')}"


def assistant_text(body: dict[str, Any]) -> str:
    """The model's reply text (plain chat, outside cards and notices)."""
    parts = [
        b.get("text", "")
        for b in body.get("content") or []
        if isinstance(b, dict) and b.get("type") == "text"
    ]
    return "\n".join(p for p in parts if p).strip()
