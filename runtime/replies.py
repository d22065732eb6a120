"""A model reply: made fit to keep and to run (no NUL, one id per call), then answered.

The Messages API names each call of a reply by an id its ``tool_result`` must answer, and
refuses a conversation in which two calls share one. A reply that repeats an id (within
itself, or one of an earlier reply of the thread), or gives a call no usable id, came
from a model or a proxy that misbehaves (a hostile probe: the second of two calls with
one id overwrote the first's card in the run's waiting set, and the thread's next model
call was refused for good). Such a call gets an id of its own before anything is stored,
and is not run: its result tells the model so. A call with a fresh, well-formed id is
left as it came.

:func:`answer` runs the rest through the agent's handler, one by one.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from signoff.runtime.cards import Card
from signoff.runtime.outcomes import of_call, tool_result
from signoff.runtime.text import storable

# What the Messages API accepts as a tool_use id.
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
# The ids given here to calls that are not run (a model's own id with it is renamed too),
# so a run recovered from its stored reply knows them again.
RENAMED = "toolu_signoff_"


def used_ids(contents: Iterable[list[dict[str, Any]]]) -> set[str]:
    """The call ids of earlier replies (their stored ``content`` lists)."""
    return {
        b["id"]
        for content in contents
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)
    }


def refusal(use_id: str) -> dict[str, Any]:
    """The result of a renamed call: not run."""
    return tool_result(
        use_id,
        "Not run: this call's id repeated another call's or was not a valid id; nothing was "
        "done for it. Ask for it again if it is still wanted.",
        error=True,
    )


def refused_in(uses: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The results of the renamed calls among a stored reply's ``uses``."""
    return {u["id"]: refusal(u["id"]) for u in uses if u["id"].startswith(RENAMED)}


def checked(
    content: list[dict[str, Any]], used: set[str]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """``content`` fit to store (:func:`~signoff.runtime.text.storable`), with every call's id distinct from the others
    and from ``used``; and the results (by the new id) of the calls that had to be
    renamed: not run."""
    seen = set(used)
    out: list[dict[str, Any]] = []
    for block in storable(content):
        if block.get("type") == "tool_use":
            given = block.get("id")
            fine = isinstance(given, str) and _ID.fullmatch(given) is not None
            if not fine or given in seen or str(given).startswith(RENAMED):
                block = {**block, "id": f"{RENAMED}{uuid.uuid4().hex}"}
            seen.add(block["id"])
        out.append(block)
    return out, refused_in([b for b in out if b.get("type") == "tool_use"])


async def answer(
    uses: list[dict[str, Any]],
    results: dict[str, dict[str, Any]],
    handle: Callable[[dict[str, Any]], Awaitable[Card | dict[str, Any]]],
) -> dict[str, Card]:
    """Each call not answered in ``results`` yet (past the limit, renamed) handled in
    order: its result put in ``results``, or the card it waits on returned (by call id).
    A call whose card another call of the reply already waits on (the same tool and
    arguments: one card) is answered, naming that call."""
    proposed: dict[str, Card] = {}
    for use in uses:
        if use["id"] in results:
            continue
        outcome = await handle(use)
        waiting = {use_id: card.id for use_id, card in proposed.items()}
        if isinstance(outcome, Card) and outcome.id not in waiting.values():
            proposed[use["id"]] = outcome
        else:
            results[use["id"]] = of_call(outcome, use["id"], waiting)
    return proposed
