"""Runs: one per user message, held by one worker (its *holder*) while it is active.

A run's writes are fenced by its status and, given ``holder``, by who holds it (design
note 14): a worker whose runs were adopted while it stalled cannot write them any more.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from signoff.runtime import levers
from signoff.runtime.cards import Card, Status
from signoff.runtime.errors import NotFound, RunInactive
from signoff.runtime.records import Entry, Run
from signoff.store import rows
from signoff.store.cards import move_in
from signoff.store.connector import Conn, Connector
from signoff.store.queries import SQL
from signoff.store.threads import append_in

# Who moves a card when a new message supersedes its run (the audit's actor, ``decided_by``).
SUPERSEDE_ACTOR = "system:supersede"
SUPERSEDED_REASON = "a new user message arrived"
APPROVED_SUPERSEDED_REASON = {  # per language, as a tool's ``Label``: the page picks one
    "en": "a new message arrived in the conversation before this approved action started; "
    "nothing was executed",
    "pt-BR": "chegou uma nova mensagem na conversa antes de esta ação aprovada começar; "
    "nada foi executado",
}


class Runs:
    def __init__(self, db: Connector) -> None:
        self._db = db

    async def start_run(
        self,
        thread_id: str,
        *,
        owner: str,
        role: str,
        holder: str,
        lease_seconds: float,
        content: list[dict[str, Any]],
        actor: str,
        channel: str | None,
        run_id: str | None = None,
        logged: list[Entry] | None = None,
    ) -> tuple[Run, list[Card], list[Run], bool]:
        """Start a run held by ``holder`` for a new user message: on a quiet thread in one
        statement (:meth:`start_quiet_run`, lever ``quiet-start``; the user message's log
        entry is appended to ``logged``, for the thread's hint), otherwise in one
        transaction.

        Active runs of the thread become ``superseded``; their cards still ``pending``
        become ``superseded`` and those ``approved`` but not yet started become
        ``invalidated`` (nobody would execute them any more: their run is over), both by
        ``system:supersede``; the user message is appended. Returns the new run, every
        card moved, the superseded runs and whether the run is new. ``run_id`` is derived
        from the inbox message: a redelivered message finds its run (returned with
        ``created=False``) instead of starting a second one (I5).

        Locks in the one order (thread, runs, cards): an approve racing this message
        waits for it, or it for the approve, and never deadlocks. ``actor`` (the person
        who sent the message) is kept for the audit's detail.
        """
        if levers.on("quiet-start"):
            quiet = await self.start_quiet_run(
                thread_id,
                run_id or str(uuid.uuid4()),
                owner=owner,
                role=role,
                holder=holder,
                lease_seconds=lease_seconds,
                content=content,
            )
            if quiet is not None:
                if logged is not None:
                    logged.append(quiet[1])
                return quiet[0], [], [], True
        tid = rows.uuid_of(thread_id)

        async def go(conn: Conn) -> tuple[Run, list[Card], list[Run], bool]:
            thread = await conn.fetchrow(SQL.thread_get_locked, tid)
            if thread is None:
                raise NotFound(f"thread {thread_id} not found", thread_id=thread_id)
            if run_id is not None:
                existing = await conn.fetchrow(SQL.run_get, run_id)
                if existing is not None:
                    return rows.run(existing), [], [], False
            old_runs = [rows.run(r) for r in await conn.fetch(SQL.run_supersede_active, tid)]
            moved_cards = await _supersede_cards(conn, tid, old_runs, actor, channel)
            run_row = await conn.fetchrow(
                SQL.run_insert,
                run_id or str(uuid.uuid4()),
                tid,
                thread["tenant"],
                owner,
                role,
                holder,
                lease_seconds,
            )
            run = rows.run(rows.some(run_row))
            await append_in(conn, tid, "user", {"content": content}, run.id)
            return run, moved_cards, old_runs, True

        return await self._db.transaction(go)

    async def start_quiet_run(
        self,
        thread_id: str,
        run_id: str,
        *,
        owner: str,
        role: str,
        holder: str,
        lease_seconds: float,
        content: list[dict[str, Any]],
    ) -> tuple[Run, Entry] | None:
        """:meth:`start_run` for a quiet thread in one statement: the new run and the user
        message's log entry, or None (nothing written) unless the thread exists, has no
        active run, no pending card and no run ``run_id`` yet, and took no other write
        while this one waited for its lock: then :meth:`start_run` decides (supersedes,
        finds the run of a message delivered again, or raises ``NotFound``)."""
        tid = rows.uuid_of(thread_id)
        body = {"content": content}
        row = await self._db.fetchrow(
            SQL.run_start_quiet, rows.uuid_of(run_id), tid, owner, role, holder, lease_seconds, body
        )
        if row is None:
            return None
        data = dict(row)
        seq, created = data.pop("log_seq"), data.pop("log_at")
        run = rows.run(data)
        entry = Entry(
            thread_id=run.thread_id, seq=seq, run_id=run.id, kind="user", body=body,
            created_at=created,
        )  # fmt: skip
        return run, entry

    async def get_run(self, run_id: str) -> Run:
        row = await self._db.fetchrow(SQL.run_get, rows.uuid_of(run_id))
        if row is None:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        return rows.run(row)

    async def run_age(self, run_id: str) -> float | None:
        """Seconds since run ``run_id`` was created, or None when there is no such run."""
        age = await self._db.fetchval(SQL.run_age, rows.uuid_of(run_id))
        return None if age is None else float(age)

    async def runs_held_among(self, holder: str, run_ids: list[str]) -> set[str]:
        """Which of ``run_ids`` ``holder`` still holds (active and its own)."""
        if not run_ids:
            return set()
        found = await self._db.fetch(SQL.runs_held_among, holder, run_ids)
        return {r["id"] for r in found}

    async def active_run(self, thread_id: str) -> Run | None:
        row = await self._db.fetchrow(SQL.run_active_for_thread, rows.uuid_of(thread_id))
        return None if row is None else rows.run(row)

    async def set_run(
        self,
        run_id: str,
        status: str,
        state: dict[str, Any],
        error: str | None = None,
        *,
        holder: str | None = None,
    ) -> Run:
        """Update an active run's status and state; :class:`RunInactive` if it is no longer
        active or, with ``holder``, no longer held by that worker."""
        row = await self._db.fetchrow(SQL.run_set_state, run_id, status, state, error, holder)
        if row is None:
            raise RunInactive(f"run {run_id} is no longer active", run_id=run_id)
        return rows.run(row)

    async def run_step(
        self,
        run_id: str,
        thread_id: str,
        items: list[tuple[str, dict[str, Any]]],
        status: str,
        state: dict[str, Any],
        error: str | None = None,
        *,
        holder: str | None = None,
    ) -> tuple[list[Entry], Run]:
        """Append entries (kind, body), in order, and set an active run's status, state and
        error: one statement. :class:`RunInactive` (and nothing written) if the run is no
        longer active or, with ``holder``, no longer held by that worker (a fence: a worker
        whose runs were adopted while it stalled cannot write them any more)."""
        kinds = [k for k, _ in items]
        bodies = [b for _, b in items]
        row = await self._db.fetchrow(
            SQL.run_step,
            rows.uuid_of(run_id),
            rows.uuid_of(thread_id),
            kinds,
            bodies,
            status,
            state,
            error,
            holder,
        )
        if row is None:
            raise RunInactive(f"run {run_id} is no longer active", run_id=run_id)
        data = dict(row)
        seqs, ats = data.pop("seqs"), data.pop("ats")
        entries = [
            Entry(thread_id=thread_id, seq=seq, run_id=run_id, kind=k, body=b, created_at=at)
            for seq, at, k, b in zip(seqs, ats, kinds, bodies, strict=True)
        ]
        return entries, rows.run(data)

    async def run_with_cards(self, run_id: str) -> tuple[Run, list[Card], list[Entry]]:
        """A run, its cards and its thread's conversation in one read (what continuing a
        parked run starts from)."""
        row = await self._db.fetchrow(SQL.run_with_cards, rows.uuid_of(run_id))
        if row is None:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        data = dict(row)
        cards = msgspec.convert(data.pop("cards"), list[Card])
        conversation = msgspec.convert(data.pop("conversation"), list[Entry])
        return rows.run(data), cards, conversation

    async def turns_in_flight(
        self, tenant: str, owner: str, accepted_run_ids: list[str]
    ) -> tuple[int, list[str]]:
        """The owner's model turns in flight: runs ``running`` now plus accepted messages
        (by the run id each will get) that no worker has started. Also returns the run ids
        among ``accepted_run_ids`` that have started (counted by their runs from now on)."""
        row = rows.some(
            await self._db.fetchrow(SQL.turns_in_flight, tenant, owner, accepted_run_ids)
        )
        return int(row["running"]) + int(row["queued"]), list(row["started"])


async def _supersede_cards(
    conn: Conn, thread_id: str, old_runs: list[Run], actor: str, channel: str | None
) -> list[Card]:
    """The cards a new message leaves behind (design note 17): ``pending`` ones of the
    thread become ``superseded``, ``approved`` ones of its superseded runs ``invalidated``."""
    moved_cards: list[Card] = []
    detail = {"reason": SUPERSEDED_REASON, "message_from": actor}
    for row in await conn.fetch(SQL.cards_pending_of_thread, thread_id):
        moved = await move_in(
            conn,
            row["id"],
            Status.PENDING,
            Status.SUPERSEDED,
            actor=SUPERSEDE_ACTOR,
            channel=channel,
            detail=detail,
        )
        if moved is not None:
            moved_cards.append(moved.card)
    if old_runs:
        for row in await conn.fetch(SQL.cards_approved_of_runs, [r.id for r in old_runs]):
            moved = await move_in(
                conn,
                row["id"],
                Status.APPROVED,
                Status.INVALIDATED,
                actor=SUPERSEDE_ACTOR,
                channel=channel,
                result={"reason": APPROVED_SUPERSEDED_REASON, "changes": []},
                detail={"reason": APPROVED_SUPERSEDED_REASON, "message_from": actor},
            )
            if moved is not None:
                moved_cards.append(moved.card)
    return moved_cards
