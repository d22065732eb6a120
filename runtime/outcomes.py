"""What the model is told about a card, written by code (pure).

The model receives the true outcome as its ``tool_result``: the exact card
text the person saw, who decided, and what happened. It never writes these.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from signoff.runtime.cards import Card, Status
from signoff.runtime.errors import SignoffError, ToolRefused
from signoff.runtime.text import storable
from signoff.runtime.tools import label_text

# What a card says when its tool's ``revalidate`` itself raised (a ``Label``).
REVALIDATION_FAILED: dict[str, str] = {
    "en": "the check of the current situation failed, so it was not run",
    "pt-BR": "a verificação da situação atual falhou, então não foi executado",
}
# A card started by a worker held up past its lease before the provider was called.
NOT_SENT = (
    "not sent to the provider: this worker was held up (paused, or cut off from Postgres) "
    "past its lease after starting the execution; nothing ran, ask again"
)


def tool_result(
    tool_use_id: str, content: str | dict[str, Any], *, error: bool = False
) -> dict[str, Any]:
    if not isinstance(content, str):  # a read tool's answer may hold dates, decimals...
        content = json.dumps(plain(content), ensure_ascii=False)
    text = storable(content)  # a tool's own text: no NUL, no half surrogate pair
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
    if error:
        block["is_error"] = True
    return block


# Calls of one model reply that run (and may each become a card): a hostile probe's one
# message made the offline model ask for 300 charges, 300 cards in one run. The rest are
# told to the model as not run, to ask for once these are decided.
MAX_USES_PER_REPLY = 25


def beyond_the_limit(uses: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The results of the calls past :data:`MAX_USES_PER_REPLY` (not run)."""
    return {
        use["id"]: tool_result(
            use["id"],
            f"Not run: at most {MAX_USES_PER_REPLY} actions are taken from one reply. Tell "
            "the user which were left out, to ask for them once these are decided.",
            error=True,
        )
        for use in uses[MAX_USES_PER_REPLY:]
    }


def storable_result(result: Any) -> dict[str, Any]:
    """A write tool's answer as it can be stored whatever the tool returned: the provider
    has acted, and a value JSON or Postgres text cannot hold must not lose the outcome
    (dates, decimals and ids as text, anything else as its repr, under ``value`` when it
    is not an object; no NUL, no half surrogate pair)."""
    value = storable(plain(result))
    return value if isinstance(value, dict) else {"value": value}


def failed_result(exc: BaseException) -> dict[str, Any]:
    """A write's failure as its card shows it and the model is told: a
    :class:`ToolRefused`'s own words, a signoff error's public text, anything else by its
    kind (a hostile probe: a tool's exception text reached the person, where the audit
    view already kept it out)."""
    if isinstance(exc, ToolRefused):
        text = exc.message
    elif isinstance(exc, SignoffError):  # its message may carry a driver's words too
        text = f"the tool failed ({exc.code})"
    else:
        text = f"the tool failed ({type(exc).__name__})"
    return {"error": storable(text)}


def plain(value: Any) -> Any:
    """``value`` as JSON's types, whatever a tool returned; never raises. Dates, decimals
    and other objects become their repr; a value that cannot be walked (a key that is
    None or a tuple, a cycle, a ``__repr__`` that raises) becomes the repr of the whole,
    or its type's name: the answer of a provider that acted is never lost to its form."""
    try:
        return msgspec.to_builtins(value, enc_hook=repr, str_keys=True)
    except Exception:  # TypeError, RecursionError, whatever a __repr__ raises
        try:
            return repr(value)
        except Exception:
            return f"<{type(value).__name__} that cannot be shown>"


def _changes(card: Card) -> str:
    changes = (card.result or {}).get("changes") or []
    parts = [
        f"{c.get('field')}: approved {c.get('approved')!r}, now {c.get('current')!r}"
        for c in changes
    ]
    return "; ".join(parts)


def card_outcome(tool_use_id: str, card: Card) -> dict[str, Any]:
    """The tool_result for a call that went through a confirmation card."""
    shown = f"Confirmation card shown to the user: «{card.summary}»."
    who = f" Decided by {card.decided_by} via {card.channel}." if card.decided_by else ""
    status = card.status
    if status is Status.EXECUTED:
        return tool_result(
            tool_use_id,
            {"status": "executed", "card": shown + who, "result": card.result or {}},
        )
    if status is Status.REJECTED:
        reason = f" Reason: {card.reason}" if card.reason else " No reason given."
        return tool_result(
            tool_use_id,
            f"{shown}{who} The user REJECTED it; nothing was executed.{reason} "
            "Do not propose the same action again in this turn.",
            error=True,
        )
    if status is Status.EXPIRED:
        return tool_result(
            tool_use_id, f"{shown} It expired without a decision; nothing was executed.", error=True
        )
    if status is Status.SUPERSEDED:
        return tool_result(
            tool_use_id,
            f"{shown} Superseded before a decision (a newer message arrived); nothing was executed.",
            error=True,
        )
    if status is Status.INVALIDATED:
        reason = label_text((card.result or {}).get("reason") or "the world changed")
        changed = _changes(card)
        return tool_result(
            tool_use_id,
            f"{shown}{who} Approved, but NOT executed: {reason}."
            + (f" Approved vs current: {changed}." if changed else "")
            + " Propose a fresh action with current values if it is still wanted.",
            error=True,
        )
    if status is Status.FAILED:
        result = card.result or {}
        if "reconciled_by" in result and "error" not in result:  # `signoff cards reconcile`
            why = f"an operator ({result['reconciled_by']}) settled it as not done"
            why += f": {result['note']}" if result.get("note") else ""
        else:
            why = str(result.get("error", "unknown error"))
        return tool_result(tool_use_id, f"{shown}{who} Execution failed: {why}.", error=True)
    if status is Status.EXECUTING:
        flagged = (
            "it is flagged for an operator to reconcile"
            if card.needs_reconciliation
            else "it is left for an operator to reconcile (flagged if it stays so)"
        )
        return tool_result(
            tool_use_id,
            f"{shown}{who} Execution started but its outcome is unknown; {flagged}. "
            "Do not retry it.",
            error=True,
        )
    return tool_result(tool_use_id, f"{shown} Status: {status}.", error=True)


def refused_again(tool_use_id: str, card: Card) -> dict[str, Any]:
    """The same call, proposed again in a run after the person said no: no new card."""
    reason = f" (reason: {card.reason})" if card.reason else ""
    return tool_result(
        tool_use_id,
        f"Refused without asking again: the user already rejected this exact action in this turn"
        f"{reason}. Nothing was executed.",
        error=True,
    )


def repeated_call(tool_use_id: str, first_use_id: str) -> dict[str, Any]:
    """A write call repeating an earlier call of the same turn (same tool, same arguments):
    one card covers both, and its outcome is reported on the first call alone (the model
    was told twice that a single charge had been made)."""
    return tool_result(
        tool_use_id,
        f"Not proposed: this call repeats {first_use_id} of this turn (same tool, same "
        f"arguments), and one confirmation card covers both; its outcome is reported on "
        f"{first_use_id}. Nothing was or will be executed for this call. If the user wants "
        "the action done twice, say so and propose it again in a later turn.",
        error=True,
    )


def of_call(outcome: Card | dict[str, Any], use_id: str, waiting: dict[str, str]) -> dict[str, Any]:
    """A call's tool_result: as it came, or, for a card another call of the turn already
    waits on (the same tool and arguments: one card), a note naming that call."""
    if not isinstance(outcome, Card):
        return outcome
    first = next(u for u, card_id in waiting.items() if card_id == outcome.id)
    return repeated_call(use_id, first)
