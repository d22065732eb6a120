"""Cards the clock and operators look after: overdue, approved but not started, stuck in
``executing``, and an operator's reconciliation of a stuck one (never a re-execution)."""

from __future__ import annotations

from typing import Any

from signoff.runtime.cards import Card, Status
from signoff.runtime.errors import CardNotFound, Conflict, IllegalTransition
from signoff.store import rows
from signoff.store.cards import move_in
from signoff.store.connector import Conn, Connector
from signoff.store.queries import SQL

ELSEWHERE = (
    "started before this continuation (by the run's previous holder, or a reply that was "
    "lost); outcome unknown"
)


class Sweeps:
    def __init__(self, db: Connector) -> None:
        self._db = db

    async def overdue_card_ids(self, limit: int = 500) -> list[str]:
        return [r["id"] for r in await self._db.fetch(SQL.cards_overdue, limit)]

    async def approved_stale(
        self, older_than_seconds: float, limit: int = 500
    ) -> list[tuple[Card, bool, str | None]]:
        """Approved cards not started for ``older_than_seconds``, each with whether its run
        is still active and the worker holding it."""
        found = await self._db.fetch(SQL.cards_approved_stale, older_than_seconds, limit)
        return [(rows.card(r), bool(r["run_active"]), r["holder"]) for r in found]

    async def flag_stuck(self, threshold_seconds: float) -> list[Card]:
        """Flag cards in ``executing`` for longer than ``threshold_seconds`` for
        reconciliation (audited); returns the cards flagged now."""

        async def go(conn: Conn) -> list[Card]:
            cards = [
                rows.card(r) for r in await conn.fetch(SQL.cards_stuck_executing, threshold_seconds)
            ]
            for card in cards:
                await conn.execute(
                    SQL.event_insert,
                    card.id,
                    "executing",
                    "executing",
                    "sweeper",
                    None,
                    None,
                    {"needs_reconciliation": True},
                )
            return cards

        return await self._db.transaction(go)

    async def flag_elsewhere(
        self, run_id: str, holder: str, card_ids: list[str], reason: str = ELSEWHERE
    ) -> list[str]:
        """Flag the run's cards still ``executing`` (started by its previous holder, or by
        ``holder`` with a call left unanswered) for reconciliation, audited with
        ``reason``, while ``holder`` holds the run; the ids flagged."""
        ids = [rows.uuid_of(c) for c in card_ids]
        found = await self._db.fetch(SQL.cards_flag_elsewhere, ids, run_id, holder, reason)
        return [r["id"] for r in found]

    async def late_outcome(
        self, card_id: str, outcome: str, result: dict[str, Any], actor: str
    ) -> Status | None:
        """Write a provider's answer that came after the card was settled to its audit
        (the card unchanged); the card's status, None while it is still ``executing``."""
        found = await self._db.fetchval(
            SQL.card_late_outcome, rows.uuid_of(card_id), outcome, result, actor
        )
        return None if found is None else Status(found)

    async def reconcile(
        self,
        card_id: str,
        *,
        executed: bool,
        actor: str,
        note: str,
        in_flight_seconds: float | None = None,
    ) -> Card:
        """An operator settles a card stuck in ``executing`` after checking the provider.

        ``executing -> executed|failed`` with the operator and their note in the audit;
        the flag is cleared. Never re-executes anything.
        """
        dst = Status.EXECUTED if executed else Status.FAILED
        result = {"reconciled_by": actor, "note": note}
        cid = rows.uuid_of(card_id)

        async def go(conn: Conn) -> Card:
            if in_flight_seconds is not None:
                # Under the thread's lock, as a fence restarting `executing_since` is.
                await conn.fetchval(SQL.card_lock_thread, cid)
                row = await conn.fetchrow(SQL.card_in_flight, cid, in_flight_seconds)
                if row is not None:
                    raise Conflict(
                        f"card {card_id} started executing {row['since']:.0f} s ago and is "
                        "not flagged: its worker may still be calling the provider (for up "
                        f"to {row['secs']:g} s: the worker's SIGNOFF_LEASE_SECONDS + "
                        "SIGNOFF_TOOL_TIMEOUT_SECONDS), and its answer would contradict "
                        "yours. Wait, or reconcile with --force",
                        card_id=card_id,
                    )
            moved = await move_in(
                conn,
                cid,
                Status.EXECUTING,
                dst,
                actor=actor,
                channel="cli",
                result=result,
                detail={"reconciled": note},
            )
            if moved is None:
                current = await conn.fetchrow(SQL.card_get, cid)
                if current is None:
                    raise CardNotFound(f"card {card_id} not found", card_id=card_id)
                raise IllegalTransition(
                    f"only a card in executing can be reconciled; this one is {current['status']}"
                )
            card = moved.card
            await conn.execute(SQL.card_reconcile_flag, card.id, False)
            await conn.execute(
                SQL.operation_finish,
                card.operation_id,
                "succeeded" if executed else "failed",
                result,
            )
            return rows.card(rows.some(await conn.fetchrow(SQL.card_get, card.id)))

        return await self._db.transaction(go)
