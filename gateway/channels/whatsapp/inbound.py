"""A webhook delivery's messages, as the channel acts on them. Statuses callbacks and
message types we do not handle are dropped here (acknowledged, nothing done)."""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

import msgspec

from signoff.runtime.cards import Decision
from signoff.runtime.errors import InvalidInput

log = logging.getLogger("signoff.whatsapp")

BUTTON_PREFIX = "pa"


class Inbound(msgspec.Struct, frozen=True, kw_only=True):
    """One inbound message: a text, a reply button's id, or a nudge."""

    message_id: str
    wa_id: str
    text: str | None = None
    button_id: str | None = None
    # When the person sent it (Meta's `timestamp`, unix seconds), None if it came without
    # one: a text "ok" approves only a card shown to them before then.
    sent: int | None = None
    # The WhatsApp message it answers (a swipe reply quotes it: Meta's `context.id`), if
    # any: a "sim" quoting a card is about that card only.
    quoted: str | None = None
    # A touch on the message ``quoted`` that decides nothing: a "reaction" (👍 on a card)
    # or a "template" quick-reply button (a card sent as the template, outside the
    # window). Dropped without a word, the person took their 👍 for an approval.
    nudge: str | None = None


def messages(payload: Any, phone_number_id: str) -> list[Inbound]:
    """The text and button messages of a (verified, decoded) webhook payload sent to this
    channel's number, ``phone_number_id``.

    Signed by Meta, yet its shape is checked at every level: an entry, change or message
    of another shape, or a sender that is not a phone number's digits, is dropped like a
    message type we do not handle (the delivery is acknowledged). An exception here would
    answer 500, and Meta redelivers such a delivery for days.

    One Meta app's webhook receives the messages of every number of its business
    accounts, signed with the same app secret: a change whose ``metadata.phone_number_id``
    is not this channel's (or that names none) was written to another number, whose
    replies this channel cannot send, and is dropped too (a hostile probe: a button sent
    to another number approved a card here)."""
    if not isinstance(payload, dict) or payload.get("object") != "whatsapp_business_account":
        raise InvalidInput("not a WhatsApp Business Account webhook")
    found: list[Inbound] = []
    for entry in _list(payload.get("entry")):
        for change in _list(_dict(entry).get("changes")):
            value = _dict(_dict(change).get("value"))
            to = _dict(value.get("metadata")).get("phone_number_id")
            if to != phone_number_id:
                if value.get("messages"):
                    log.info(
                        "WhatsApp messages to phone number id %.40r ignored: this channel "
                        "serves %s (SIGNOFF_WHATSAPP_PHONE_NUMBER_ID)",
                        to,
                        phone_number_id,
                    )
                continue
            for msg in _list(value.get("messages")):
                item = _one(msg)
                if item is not None:
                    found.append(item)
    return found


# A WhatsApp id is the sender's phone number in international form, digits only (E.164
# has at most 15; a little room kept). It names the person as a signoff user in the
# channel's tenant, so anything else (a name, control characters) is not taken.
_WA_ID = re.compile(r"[0-9]{5,20}")
MAX_MESSAGE_ID = 256
_STAMP = re.compile(r"[0-9]{1,11}")  # unix seconds, as Meta writes them (a string)
MAX_BUTTON_ID = 128


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _one(msg: Any) -> Inbound | None:
    msg = _dict(msg)
    mid, sender = msg.get("id"), msg.get("from")
    if not isinstance(sender, str) or not _WA_ID.fullmatch(sender):
        return None
    if not isinstance(mid, str) or not 0 < len(mid) <= MAX_MESSAGE_ID or not mid.isprintable():
        return None
    kind = msg.get("type")
    stamp = msg.get("timestamp")
    sent = int(stamp) if isinstance(stamp, str) and _STAMP.fullmatch(stamp) else None
    quoted = _dict(msg.get("context")).get("id")
    if kind == "text":
        body = _dict(msg.get("text")).get("body")
        if isinstance(body, str):
            body = clean_text(body)
            if body:
                # A quote this channel cannot read (not a short printable id) is kept as
                # one no card matches: the "sim" then confirms nothing.
                ok = isinstance(quoted, str) and 0 < len(quoted) <= MAX_MESSAGE_ID
                quote = (quoted if ok and quoted.isprintable() else "?") if quoted else None
                return Inbound(message_id=mid, wa_id=sender, text=body, sent=sent, quoted=quote)
    elif kind == "interactive":
        bid = _dict(_dict(msg.get("interactive")).get("button_reply")).get("id")
        if isinstance(bid, str) and len(bid) <= MAX_BUTTON_ID:
            return Inbound(message_id=mid, wa_id=sender, button_id=bid, sent=sent)
    elif kind in ("reaction", "button"):
        reaction = _dict(msg.get("reaction"))
        if kind == "reaction":
            # an emptied emoji takes a reaction back: nothing to answer
            quoted = reaction.get("message_id") if reaction.get("emoji") else None
        if isinstance(quoted, str) and 0 < len(quoted) <= MAX_MESSAGE_ID and quoted.isprintable():
            nudge = "reaction" if kind == "reaction" else "template"
            return Inbound(message_id=mid, wa_id=sender, sent=sent, quoted=quoted, nudge=nudge)
    return None


def clean_text(body: str) -> str:
    """A person's text as it can be stored: NUL characters (which Postgres text cannot
    hold) dropped, a lone surrogate (no UTF-8 for it) replaced, outer blanks trimmed.
    The web refuses such text with a 422; here nobody would see a refusal, and the
    message would be lost."""
    body = body.replace("\x00", "")
    return body.encode("utf-8", "replace").decode("utf-8").strip()


def button_id(decision: Decision, card_id: str) -> str:
    return f"{BUTTON_PREFIX}:{decision}:{card_id}"


def parse_button(bid: str) -> tuple[Decision, str] | None:
    """``pa:<decision>:<card_id>`` -> (approve|reject, card id); anything else None."""
    parts = bid.split(":")
    if len(parts) != 3 or parts[0] != BUTTON_PREFIX:
        return None
    if parts[1] not in (Decision.APPROVE, Decision.REJECT):
        return None
    try:
        card_id = str(uuid.UUID(parts[2]))
    except ValueError:
        return None
    return Decision(parts[1]), card_id
