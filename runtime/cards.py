"""The confirmation card state machine (DESIGN.md §4), as pure code.

The store enforces the same moves again with conditional ``UPDATE``s so that
Postgres decides races between instances; this module is the single source
of which moves exist.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from signoff.runtime.errors import IllegalTransition


class Status(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    MODIFIED = "modified"
    INVALIDATED = "invalidated"
    EXECUTING = "executing"
    EXECUTED = "executed"
    FAILED = "failed"


class Risk(enum.StrEnum):
    READ = "read"
    REVERSIBLE = "reversible"
    CRITICAL = "critical"


class Decision(enum.StrEnum):
    """What a person may say about a pending card."""

    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"


MOVES: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset(
        {Status.APPROVED, Status.REJECTED, Status.EXPIRED, Status.SUPERSEDED, Status.MODIFIED}
    ),
    Status.APPROVED: frozenset({Status.INVALIDATED, Status.EXECUTING}),
    Status.EXECUTING: frozenset({Status.EXECUTED, Status.FAILED}),
}

TERMINAL: frozenset[Status] = frozenset(
    {
        Status.REJECTED,
        Status.EXPIRED,
        Status.SUPERSEDED,
        Status.MODIFIED,
        Status.INVALIDATED,
        Status.EXECUTED,
        Status.FAILED,
    }
)

# A run waiting on a card may continue once the card left `pending`.
DECIDED: frozenset[Status] = frozenset(set(Status) - {Status.PENDING})


def can_move(src: Status, dst: Status) -> bool:
    return dst in MOVES.get(src, frozenset())


def check_move(src: Status, dst: Status) -> None:
    """Raise :class:`IllegalTransition` unless ``src -> dst`` is an allowed move."""
    if not can_move(src, dst):
        raise IllegalTransition(f"a card cannot move from {src} to {dst}", src=src, dst=dst)


class Card(msgspec.Struct, frozen=True, kw_only=True):
    """A confirmation card as stored. ``summary`` is the exact text the person saw."""

    id: str
    thread_id: str
    run_id: str
    tenant: str
    owner: str
    tool: str
    risk: Risk
    args_snapshot: dict[str, Any]
    summary: str
    impact: dict[str, Any]
    snapshot_hash: str
    request_key: str
    operation_id: str
    status: Status
    expires_at: datetime
    created_at: datetime
    tool_use_id: str = ""
    input: dict[str, Any] = msgspec.field(default_factory=dict)  # the model's input, for edits
    editable: list[str] = msgspec.field(default_factory=list)
    decided_at: datetime | None = None
    decided_by: str | None = None
    channel: str | None = None
    reason: str | None = None
    superseded_by: str | None = None
    result: dict[str, Any] | None = None
    needs_reconciliation: bool = False

    def public(self) -> dict[str, Any]:
        """The JSON a client is shown (everything, dates as ISO strings)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def latest(waiting: Mapping[str, str], cards: Mapping[str, Card]) -> dict[str, str]:
    """A run's waiting calls (call id -> card id) with each card followed to the card its
    edits made (a ``modified`` card's ``superseded_by``, as far as ``cards`` holds)."""
    out = {}
    for use_id, card_id in waiting.items():
        card = cards[card_id]
        while card.status is Status.MODIFIED and (nxt := card.superseded_by) in cards:
            card = cards[nxt or ""]
        out[use_id] = card.id
    return out
