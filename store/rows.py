"""Rows of ``store/queries.sql`` statements as the runtime's records."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from signoff.runtime.cards import Card
from signoff.runtime.errors import Conflict, NotFound
from signoff.runtime.metrics import CLICK_TO_EXECUTED, card_moved
from signoff.runtime.records import Entry, Moved, Run, Thread
from signoff.store.connector import Row

# Columns some card statements return besides the card's own.
_EXTRA = (
    "is_expired",
    "body",
    "log_seq",
    "log_at",
    "holder",
    "run_active",
    "ord",
    "attempt",
    "fenced_attempts",
)


def uuid_of(value: str) -> str:
    """Validate an id before it reaches SQL: a malformed id is simply not found."""
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError) as exc:
        shown = repr(value)  # a hostile probe's 5,000-character id was echoed whole
        raise NotFound(
            f"{shown if len(shown) <= 80 else shown[:79] + '…'} is not a valid id"
        ) from exc


def some(row: Row | None) -> Row:
    """A row the statement must return (RETURNING after a successful insert or update)."""
    if row is None:
        raise Conflict("the row changed concurrently; retry")
    return row


def card(row: Row) -> Card:
    data = dict(row)
    for key in _EXTRA:
        data.pop(key, None)
    return msgspec.convert(data, Card, from_attributes=False)


def moved(row: Row, kind: str = "card_update") -> Moved:
    """A row of a logged card transition: the card, the log entry written with it and the
    worker holding the card's run (``holder``)."""
    moved_card = card(row)
    entry = Entry(
        thread_id=moved_card.thread_id,
        seq=row["log_seq"],
        run_id=moved_card.run_id,
        kind=kind,
        body=row["body"],
        created_at=row["log_at"],
    )
    # Every committed card transition is read back here: the one place to count them.
    card_moved(moved_card.status, moved_card.tool)
    if moved_card.status == "executed" and moved_card.decided_at is not None:
        CLICK_TO_EXECUTED.observe((entry.created_at - moved_card.decided_at).total_seconds())
    return Moved(moved_card, entry, row["holder"])


def entry(thread_id: str, row: Row) -> Entry:
    return Entry(
        thread_id=thread_id,
        seq=row["seq"],
        run_id=row["run_id"],
        kind=row["kind"],
        body=row["body"],
        created_at=row["created_at"],
    )


def run(row: Row | dict[str, Any]) -> Run:
    return msgspec.convert(dict(row), Run)


def thread(row: Row | dict[str, Any]) -> Thread:
    return msgspec.convert(dict(row), Thread)
