"""Plain records the store reads and writes (threads, log entries, runs, new cards, audit rows)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import msgspec

from signoff.runtime.cards import Card


class Thread(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    tenant: str
    owner: str
    last_seq: int
    created_at: datetime


class ThreadSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A line of a person's thread list: when it last changed, how many cards wait for
    them, and its first message (cut short) to recognise it by."""

    id: str
    title: str
    pending: int
    last_seq: int
    created_at: datetime
    updated_at: datetime


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One row of a thread's log. ``kind`` is what a WebSocket client sees as the event kind."""

    thread_id: str
    seq: int
    run_id: str | None
    kind: str
    body: dict[str, Any]
    created_at: datetime


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    SUPERSEDED = "superseded"


ACTIVE_RUN = frozenset({RunStatus.RUNNING, RunStatus.WAITING})


class Run(msgspec.Struct, frozen=True, kw_only=True):
    """A run answers one user message, until the model ends its turn.

    ``state`` holds what a continuation needs beyond the conversation:
    ``results`` (tool_use_id -> finished tool_result block) and ``waiting``
    (tool_use_id -> card id) for the calls that wait on a person.
    """

    id: str
    thread_id: str
    tenant: str
    owner: str
    role: str
    status: RunStatus
    holder: str | None  # the worker holding the run (its lease), None when released
    state: dict[str, Any]
    error: str | None

    def call_position(self, card: Card) -> int:
        """Where the model put the card's call among the run's calls (a sort key: an
        edit's card takes its call's place; a card of no call of the run goes last)."""
        order: list[str] = self.state.get("order", [])
        return order.index(card.tool_use_id) if card.tool_use_id in order else len(order)


class NewCard(msgspec.Struct, frozen=True, kw_only=True):
    """What a proposal writes: everything but the status and the timestamps."""

    thread_id: str
    run_id: str
    tenant: str
    owner: str
    tool: str
    tool_use_id: str
    risk: str
    input: dict[str, Any]
    args_snapshot: dict[str, Any]
    summary: str
    impact: dict[str, Any]
    snapshot_hash: str
    request_key: str
    editable: list[str]
    ttl_seconds: float
    id: str = ""
    operation_id: str = ""


class CardEvent(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    card_id: str
    from_status: str | None
    to_status: str
    actor: str
    channel: str | None
    hash_seen: str | None
    at: datetime
    detail: dict[str, Any]


class Moved(msgspec.Struct, frozen=True):
    """A card as a committed change left it, with the thread-log entry written with it
    (what a thread hint carries to the gateways) and the worker holding its run then
    (where the decision's signal goes)."""

    card: Card
    entry: Entry
    holder: str | None = None


class ToolUseOutcome(msgspec.Struct, frozen=True):
    """What became of one tool call through its card: status, result, reason."""

    status: str
    result: Any = None
    reason: str | None = None


class PruneCounts(msgspec.Struct, frozen=True, kw_only=True):
    """What a prune deleted (or, dry, would delete) under one rule: threads and the rows
    that went with them; ``audited``: cards that reached the provider, whose audit was
    exported first; ``wa_outbound``: finished WhatsApp outbound rows of the rule's
    tenants."""

    threads: int = 0
    messages: int = 0
    runs: int = 0
    cards: int = 0
    audited: int = 0
    wa_outbound: int = 0

    def __add__(self, other: PruneCounts) -> PruneCounts:
        return PruneCounts(
            threads=self.threads + other.threads,
            messages=self.messages + other.messages,
            runs=self.runs + other.runs,
            cards=self.cards + other.cards,
            audited=self.audited + other.audited,
            wa_outbound=self.wa_outbound + other.wa_outbound,
        )


class PruneReport(msgspec.Struct, frozen=True, kw_only=True):
    """A whole prune: the counts of each rule (by tenant, ``*`` for the default rule), and
    the channel delivery ids deleted (they carry no tenant: pruned once for the policy,
    older than ``deliveries_days``; 0 days: not pruned by this run)."""

    rules: dict[str, PruneCounts] = {}
    deliveries: int = 0
    deliveries_days: float = 0.0
