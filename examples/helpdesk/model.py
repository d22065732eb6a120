"""An offline stand-in for Claude, so the helpdesk runs with no API key.

A few rules turn plain English into the same ``tool_use`` blocks Claude would send:

- "where is order A101?" / "look up A100"            -> look_up_order
- "refund $10 of order A100, it arrived broken"      -> refund_order
- "change the address of A101 to 12 Oak St, Leeds"   -> change_delivery_address
- "close my account, I'm moving away"                -> close_account

Its replies say they come from the offline model. signoff uses it only when no
``ANTHROPIC_API_KEY`` is set (``App(offline_model=...)``).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from signoff import Message, ModelReply, TextSink, ToolSpec

LABEL = "[offline helpdesk model] "
HELP = (
    LABEL + "I can look up an order, refund one, change a delivery address or close your "
    'account. Try: "where is order A101?", "refund order A100, it arrived broken", '
    '"change the address of A101 to 12 Oak Street, Leeds" or "close my account".'
)
_ids = itertools.count(1)
ORDER = re.compile(r"\b([A-Za-z]\d{3})\b")
DOLLARS = re.compile(r"\$\s?(\d+(?:[.,]\d{1,2})?)|(\d+(?:\.\d{1,2})?)\s?(?:dollars|usd)\b", re.I)


def _use(name: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_help_{next(_ids):06d}", "name": name, "input": data}


def _reason(text: str) -> str:
    """What follows "because", "it", "as", a comma or a dash: the customer's own words."""
    m = re.search(r"(?:because|since|as|,|-|:)\s*(.+)$", text, re.I)
    return m.group(1).strip(" .") if m else "requested by the customer"


def understand(text: str) -> dict[str, Any] | None:
    low = text.lower()
    if "close" in low and "account" in low:
        m = re.search(r"account\W*(?:because|since|as|,|-|:)\s*(.+)$", text, re.I)
        return _use("close_account", {"reason": m.group(1).strip(" .") if m else ""})
    order = ORDER.search(text)
    if order is None:
        return None
    order_id, rest = order.group(1).upper(), text[order.end() :]
    if re.search(r"\baddress\b|\bship\b|\bsend\b|\bdeliver\b", low):
        m = re.search(r"\bto\s+(.+)$", rest, re.I)
        if m:
            return _use(
                "change_delivery_address",
                {"order_id": order_id, "address": m.group(1).strip(" .")},
            )
    if re.search(r"refund|money back", low):
        data: dict[str, Any] = {"order_id": order_id, "reason": _reason(rest)}
        amount = DOLLARS.search(text)
        if amount:
            data["amount"] = (amount.group(1) or amount.group(2)).replace(",", ".")
        return _use("refund_order", data)
    return _use("look_up_order", {"order_id": order_id})


# The runtime's words for a card that did not run (runtime/outcomes.py, conversation.py),
# said as a person would; anything else (a tool's refusal) is said as the tool said it.
NOT_DONE = [
    (re.compile(r"REJECTED"), "OK, nothing was done: you rejected it."),
    (re.compile(r"expired without a decision"), "It expired without a decision; nothing was done."),
    (
        re.compile(r"Superseded|sent a new message before this was decided"),
        "That was replaced by your newer message; nothing was done.",
    ),
    (re.compile(r"NOT executed: ([^.]*)"), "It was approved but not done: {0}."),
    (re.compile(r"outcome is unknown"), "The outcome is unclear; someone will check it."),
]
SUMMARY = re.compile(r"«(.*?)»")


def describe(result: dict[str, Any]) -> str:
    """Say what a tool result means, in a sentence (never the runtime's own words, which
    are written for the model: "Confirmation card shown to the user ... via ws")."""
    text = str(result.get("content", ""))
    if result.get("is_error"):
        for pattern, said in NOT_DONE:
            if found := pattern.search(text):
                return said.format(*found.groups())
        return text
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, dict) and data.get("status") == "executed":
        shown = SUMMARY.search(str(data.get("card", "")))
        return f"Done: {shown.group(1)}." if shown else "Done."
    if isinstance(data, dict) and "item" in data:
        return (
            f"Order {data['order_id']} ({data['item']}, {data['total']}) is {data['status']}; "
            f"it goes to {data['delivery_address']}."
        )
    return text


class HelpdeskModel:
    name = "offline-helpdesk"

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
        if results and not texts:
            return await self._say(LABEL + " ".join(describe(r) for r in results), on_text)
        use = understand(" ".join(texts))
        if use is None:
            return await self._say(HELP, on_text)
        if use["name"] != "look_up_order":
            # No words before a write: its card is the runtime's to show, once it exists
            # ("Please confirm on the card" came before "Nothing was proposed").
            return ModelReply(content=[use], stop_reason="tool_use")
        intro = LABEL + "Looking it up."
        if on_text is not None:
            await on_text(intro)
        return ModelReply(content=[{"type": "text", "text": intro}, use], stop_reason="tool_use")

    @staticmethod
    async def _say(text: str, on_text: TextSink | None) -> ModelReply:
        if on_text is not None:
            await on_text(text)
        return ModelReply(content=[{"type": "text", "text": text}], stop_reason="end_turn")
