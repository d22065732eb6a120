"""A webhook delivery's messages, as the channel acts on them. Statuses callbacks and
message types we do not handle are dropped here (acknowledged, nothing done)."""

from __future__ import annotations

from typing import Any

import msgspec

from signoff.runtime.cards import Decision
from signoff.runtime.errors import InvalidInput

BUTTON_PREFIX = "pa"


class Inbound(msgspec.Struct, frozen=True, kw_only=True):
    """One inbound message: a text, or a reply button's id."""

    message_id: str
    wa_id: str
    text: str | None = None
    button_id: str | None = None


def messages(payload: Any) -> list[Inbound]:
    """The text and button messages of a (verified, decoded) webhook payload."""
    if not isinstance(payload, dict) or payload.get("object") != "whatsapp_business_account":
        raise InvalidInput("not a WhatsApp Business Account webhook")
    found: list[Inbound] = []
    for entry in payload.get("entry") or []:
        for change in (entry or {}).get("changes") or []:
            value = (change or {}).get("value") or {}
            for msg in value.get("messages") or []:
                item = _one(msg)
                if item is not None:
                    found.append(item)
    return found


def _one(msg: Any) -> Inbound | None:
    if not isinstance(msg, dict):
        return None
    mid, sender = msg.get("id"), msg.get("from")
    if not isinstance(mid, str) or not isinstance(sender, str) or not mid or not sender:
        return None
    kind = msg.get("type")
    if kind == "text":
        body = (msg.get("text") or {}).get("body")
        if isinstance(body, str) and body.strip():
            return Inbound(message_id=mid, wa_id=sender, text=body)
    elif kind == "interactive":
        reply = (msg.get("interactive") or {}).get("button_reply") or {}
        bid = reply.get("id")
        if isinstance(bid, str):
            return Inbound(message_id=mid, wa_id=sender, button_id=bid)
    return None


def button_id(decision: Decision, card_id: str) -> str:
    return f"{BUTTON_PREFIX}:{decision}:{card_id}"


def parse_button(bid: str) -> tuple[Decision, str] | None:
    """``pa:<decision>:<card_id>`` -> (approve|reject, card id); anything else None."""
    parts = bid.split(":")
    if len(parts) != 3 or parts[0] != BUTTON_PREFIX:
        return None
    if parts[1] not in (Decision.APPROVE, Decision.REJECT) or not parts[2]:
        return None
    return Decision(parts[1]), parts[2]
