"""``signoff cards``: list (filters, a header, ``--json``), show and reconcile cards.

Ids are accepted by unique prefix (``signoff cards show 3f2a``); an ambiguous prefix is
a clear error (exit 2), as is a status that is not a card status.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from signoff.runtime.cards import Card, Status
from signoff.runtime.cli_ops import duration, operator_settings
from signoff.runtime.config import Settings
from signoff.runtime.text import one_line, terminal_safe

STATUSES = [s.value for s in Status]


def add_parser(
    sub: Any, common: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    cd: argparse.ArgumentParser = sub.add_parser(
        "cards",
        help="list, show or reconcile cards (finds a running `signoff dev`'s database)",
    )
    common(cd)
    cd.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=["list", "show", "reconcile"],
        help="list cards (the default); show one with its audit; reconcile one stuck in executing",
    )
    cd.add_argument(
        "card_id", nargs="?", help="show/reconcile: a card id or a unique prefix of one"
    )
    cd.add_argument(
        "--status", help="list: only cards in this status (" + ", ".join(STATUSES) + ")"
    )
    cd.add_argument("--thread", help="list: only cards of this thread (id or unique prefix)")
    cd.add_argument("--tool", help="list: only cards of this tool")
    cd.add_argument(
        "--older-than",
        type=duration,
        metavar="AGE",
        help="list: only cards created more than AGE ago (90s, 30m, 2h, 7d)",
    )
    cd.add_argument(
        "--newer-than",
        type=duration,
        metavar="AGE",
        help="list: only cards created less than AGE ago (90s, 30m, 2h, 7d)",
    )
    cd.add_argument(
        "--reconcile",
        action="store_true",
        help="list: only cards flagged for reconciliation (stuck, or left by a lost worker)",
    )
    cd.add_argument("--limit", type=int, default=50, help="list: at most this many (50)")
    cd.add_argument("--json", action="store_true", help="list/show: JSON instead of a table")
    cd.add_argument(
        "--note",
        default="checked with the provider",
        help="reconcile: the operator's note kept in the audit",
    )
    cd.add_argument(
        "--outcome",
        choices=["executed", "failed"],
        help="reconcile: what the provider says happened",
    )
    cd.add_argument(
        "--force",
        action="store_true",
        help="reconcile: a card not flagged that started executing less than a lease and "
        "a tool deadline ago (its worker may still be calling the provider)",
    )
    return cd


def _when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def _table(cards: list[Card]) -> str:
    head = ("ID", "STATUS", "CREATED", "DECIDED", "OWNER", "TOOL", "SUMMARY")
    lines = [head]
    for card in cards:
        flag = " [RECONCILE]" if card.needs_reconciliation else ""
        lines.append(
            (
                card.id[:8],
                str(card.status),
                _when(card.created_at),
                _when(card.decided_at),
                card.owner,
                card.tool,
                # Whole (a summary is one line of at most SUMMARY_LIMIT characters): cut at
                # 60, every demo card lost its amount.
                card.summary.replace("\n", " ") + flag,
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in lines
    )


def _shown(card: Any, events: list[Any]) -> str:
    """One card for a person: what it is, where it stands, its audit trail."""
    flag = "  [RECONCILE: check the provider, then `signoff cards reconcile`]"
    lines = [
        f"card {card.id}  {card.tool} ({card.risk})",
        f"  status:    {card.status}"
        + (flag if card.needs_reconciliation else "")
        + (f" ({one_line(card.reason, 500)})" if card.reason else ""),
        f"  summary:   {card.summary}",
        f"  thread:    {card.thread_id}   run: {card.run_id}",
        f"  owner:     {card.owner} ({card.tenant})   operation: {card.operation_id}",
        f"  created:   {card.created_at:%Y-%m-%d %H:%M:%S}   expires: "
        f"{card.expires_at:%Y-%m-%d %H:%M:%S}",
    ]
    if card.result is not None:
        lines.append(f"  result:    {json.dumps(card.result, ensure_ascii=False, default=str)}")
    lines.append("  audit:")
    for e in events:
        via = f" via {e.channel}" if e.channel else ""
        lines.append(
            f"    {e.at:%Y-%m-%d %H:%M:%S}  {e.from_status or '-'} -> {e.to_status}"
            f"  by {e.actor}{via}"
            + (f"  {json.dumps(e.detail, ensure_ascii=False, default=str)}" if e.detail else "")
        )
    return "\n".join(lines)


def _error(message: str) -> int:
    print(f"signoff cards: {message}", file=sys.stderr)
    return 2


async def run(args: argparse.Namespace, settings: Settings) -> int:
    from signoff.runtime.errors import Conflict, NotFound
    from signoff.store.operator import AmbiguousId
    from signoff.store.postgres import PostgresStore

    if args.action == "list" and args.status is not None and args.status not in STATUSES:
        return _error(f"unknown status {args.status!r}; one of: {', '.join(STATUSES)}")
    if args.action in ("show", "reconcile") and not args.card_id:
        return _error(f"{args.action} needs a card id (or a unique prefix of one)")
    if args.action == "reconcile" and args.outcome is None:
        return _error("--outcome executed|failed is required (check the provider first)")
    if args.limit < 1:
        return _error("--limit must be at least 1")
    settings = operator_settings(settings)
    assert settings.database_url is not None
    store = await PostgresStore.connect(
        settings.database_url, statement_cache_size=settings.db_statement_cache_size
    )
    try:
        try:
            if args.action == "list":
                thread = await store.operator.thread_id(args.thread) if args.thread else None
                cards = await store.operator.find_cards(
                    status=args.status,
                    thread_id=thread,
                    tool=args.tool,
                    older_than=args.older_than,
                    newer_than=args.newer_than,
                    limit=args.limit,
                    flagged=args.reconcile,
                )
                if args.json:
                    print(json.dumps([c.public() for c in cards], indent=2, default=str))
                elif cards:
                    print(terminal_safe(_table(cards)))
                else:
                    print("no cards match")
                return 0
            card_id = await store.operator.card_id(args.card_id)
        except (AmbiguousId, NotFound) as exc:
            return _error(exc.message)
        if args.action == "show":
            card = await store.get_card(card_id)
            events = await store.card_events(card_id)
            if args.json:
                out = {"card": card.public(), "events": msgspec.to_builtins(events)}
                print(json.dumps(out, indent=2, ensure_ascii=False, default=str))
            else:
                print(terminal_safe(_shown(card, events)))
            return 0
        # A card not flagged whose execution began within a lease and a tool deadline may
        # still have a provider call in flight: its answer would contradict the operator's.
        in_flight = settings.lease_seconds + settings.tool_timeout_seconds
        try:
            card = await store.reconcile(
                card_id,
                executed=args.outcome == "executed",
                actor="operator",
                note=args.note,
                in_flight_seconds=None if args.force else in_flight,
            )
        except Conflict as exc:
            return _error(exc.message)
        print(f"{card.id} reconciled as {card.status}: {args.note}")
        return 0
    finally:
        await store.close()
