"""Cards: proposals, decisions and every later move, each with its audit row and log entry.

A transition is one statement (design note 11: the ``*_logged`` statements of
``store/queries.sql``) with the card's thread locked first (note 16), conditional on the
card's status, so Postgres decides races between processes (I4, I8).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from signoff.runtime.canonical import operation_id
from signoff.runtime.cards import Card, Decision, Status, check_move
from signoff.runtime.errors import (
    AlreadyDecided,
    CardNotFound,
    Conflict,
    Expired,
    IllegalTransition,
    NotOwner,
    RunInactive,
    StaleCard,
    UnknownTool,
)
from signoff.runtime.records import CardEvent, Entry, Moved, NewCard, ToolUseOutcome
from signoff.store import rows
from signoff.store.connector import Conn, Connector, Row
from signoff.store.group import GroupCommit
from signoff.store.queries import SQL
from signoff.store.threads import append_in


async def move_in(
    conn: Conn,
    card_id: str,
    src: Status,
    dst: Status,
    *,
    actor: str,
    channel: str | None = None,
    result: dict[str, Any] | None = None,
    detail: dict[str, Any] | None = None,
) -> Moved | None:
    """``src -> dst`` with its audit row and log entry inside the caller's transaction."""
    check_move(src, dst)
    row = await conn.fetchrow(
        SQL.card_move_logged, card_id, str(src), str(dst), result, actor, channel, detail or {}
    )
    return None if row is None else rows.moved(row)


class Cards:
    def __init__(self, db: Connector) -> None:
        self._db = db
        # Decisions that arrive together share a statement (group commit, store/group.py).
        self._decide = GroupCommit(db, single=self._decide_one, batch=SQL.card_decide_batch)

    async def _decide_one(self, args: tuple[Any, ...]) -> Row | None:
        """``card_decide_logged`` for ``card_decide_batch``'s values (the event's detail
        derived from the reason, as the batch does)."""
        card, status, principal, channel, reason, snapshot_hash, tenant, tools = args
        detail = {"reason": reason} if reason else {}
        return await self._db.fetchrow(
            SQL.card_decide_logged,
            card, status, principal, channel, reason, snapshot_hash, tenant, detail, tools,
        )  # fmt: skip

    # -- proposals and reads ----------------------------------------------------------

    async def propose(self, new: NewCard) -> tuple[Card, Entry | None]:
        """Insert a pending card with its audit row and ``card`` log entry (one statement),
        or return the card this request already has, with no entry (I5)."""
        card_id = new.id or str(uuid.uuid4())
        op_id = new.operation_id or operation_id(card_id)
        row = await self._db.fetchrow(SQL.card_propose, *_values(new, card_id, op_id))
        if row is not None:
            moved = rows.moved(row, "card")
            return moved.card, moved.entry
        row = await self._db.fetchrow(SQL.card_by_request_key, new.request_key)
        if row is None:  # no card, and none inserted: the run is no longer active
            raise RunInactive(
                f"run {new.run_id} is no longer active; no card proposed", run_id=new.run_id
            )
        return rows.card(row), None

    async def get_card(self, card_id: str) -> Card:
        row = await self._db.fetchrow(SQL.card_get, rows.uuid_of(card_id))
        if row is None:
            raise CardNotFound(f"card {card_id} not found", card_id=card_id)
        return rows.card(row)

    async def read_back_begin(self, card_id: str, attempt: str) -> tuple[Card, str | None]:
        """The card, and the ``attempt`` token of the begin that last moved it to
        ``executing`` (``None``: none, or one written without a token), read under its
        thread's lock. Found still approved, ``attempt`` is fenced in the same transaction:
        the begin carrying it changes nothing if it runs later, so "not committed" is final
        (design note 53). A begin holding the lock is waited for, until its commit shows."""
        cid = rows.uuid_of(card_id)

        async def go(conn: Conn) -> tuple[Card, str | None]:
            await conn.fetchrow(SQL.card_lock_thread, cid)  # lock order: the thread first
            row = await conn.fetchrow(SQL.card_execution_attempt, cid)
            if row is None:
                raise CardNotFound(f"card {card_id} not found", card_id=card_id)
            if row["status"] == Status.APPROVED:
                await conn.execute(SQL.card_fence_begin, cid, attempt)
            return rows.card(row), row["attempt"]

        return await self._db.transaction(go)

    async def card_input(self, card_id: str) -> dict[str, Any]:
        """The model's original (parsed) input, which an edit starts from."""
        row = await self._db.fetchrow(SQL.card_input, rows.uuid_of(card_id))
        if row is None:
            raise CardNotFound(f"card {card_id} not found", card_id=card_id)
        value: dict[str, Any] = row["input"]
        return value

    async def cards_of_run(self, run_id: str) -> list[Card]:
        return [rows.card(r) for r in await self._db.fetch(SQL.cards_of_run, rows.uuid_of(run_id))]

    async def tool_use_outcomes(
        self, thread_id: str, tool_use_ids: list[str]
    ) -> dict[str, ToolUseOutcome]:
        found = await self._db.fetch(SQL.cards_of_tool_uses, rows.uuid_of(thread_id), tool_use_ids)
        # An edit makes a newer card for the same call: the newest says what became of it.
        return {
            r["tool_use_id"]: ToolUseOutcome(r["status"], r["result"], r["reason"]) for r in found
        }

    async def pending_cards(self, thread_id: str) -> list[Card]:
        found = await self._db.fetch(SQL.cards_pending_of_thread, rows.uuid_of(thread_id))
        return [rows.card(r) for r in found]

    async def list_cards(
        self, status: str | None = None, owner: str | None = None, limit: int = 100
    ) -> list[Card]:
        return [rows.card(r) for r in await self._db.fetch(SQL.cards_list, status, owner, limit)]

    async def card_events(self, card_id: str) -> list[CardEvent]:
        found = await self._db.fetch(SQL.events_of_card, rows.uuid_of(card_id))
        return [msgspec.convert(dict(r), CardEvent) for r in found]

    async def decided_among(self, card_ids: list[str]) -> dict[str, str]:
        """Which of these cards left ``pending`` (card id -> status)."""
        if not card_ids:
            return {}
        found = await self._db.fetch(SQL.cards_decided_among, card_ids)
        return {r["id"]: r["status"] for r in found}

    async def approved_held(
        self, worker_id: str, limit: int = 1000, tools: Sequence[str] | None = None
    ) -> dict[str, str]:
        """Approved cards not started whose run ``worker_id`` holds (card id -> run id),
        of these ``tools`` only when given."""
        names = None if tools is None else list(tools)
        found = await self._db.fetch(SQL.cards_approved_held, worker_id, limit, names)
        return {r["id"]: r["run_id"] for r in found}

    # -- a person's decision ------------------------------------------------------------

    async def decide(
        self,
        card_id: str,
        *,
        principal: str,
        decision: Decision,
        snapshot_hash: str,
        channel: str,
        reason: str | None = None,
        tenant: str | None = None,
        tools: list[str] | None = None,
    ) -> Moved:
        """The deciding update (I2, I3, I7) with its audit row and log entry (one statement),
        or a precise error.

        ``tenant``: the principal's tenant; a user of the same name elsewhere is not the owner.
        ``tools``: only a card of one of these tools (None: any); another is refused with
        :class:`UnknownTool` — after the owner, deadline, status and hash checks, so only
        the card's owner learns its tool is not served (design note 21)."""
        if decision is Decision.EDIT:
            raise IllegalTransition("edits go through edit()")
        target = Status.APPROVED if decision is Decision.APPROVE else Status.REJECTED
        cid = rows.uuid_of(card_id)
        row = await self._decide.run(
            (
                cid,
                str(target),
                principal,
                channel,
                reason,
                snapshot_hash,
                tenant,
                None if tools is None else ",".join(tools),  # tool names have no commas
            )
        )
        if row is None:
            now = await self._db.fetchrow(SQL.card_diagnose, cid)
            error = _why_not_decided(now, cid, principal, snapshot_hash, tenant)
            if (
                tools is not None
                and now is not None
                and type(error) is Conflict
                and (now["tool"] not in tools)
            ):
                error = UnknownTool(
                    f"this server does not serve the tool {now['tool']!r} of card {card_id} "
                    "(another version of the app proposed it); nothing was decided",
                    tool=now["tool"],
                    card_id=card_id,
                )
            raise error
        return rows.moved(row)

    async def edit(
        self,
        card_id: str,
        *,
        principal: str,
        snapshot_hash: str,
        channel: str,
        edits: dict[str, Any],
        new: NewCard,
        tenant: str | None = None,
    ) -> tuple[Card, Card]:
        """Owner edits: the old card becomes ``modified`` and a new linked card is proposed
        (design note 6), in one transaction that locks the card's thread first."""
        cid = rows.uuid_of(card_id)
        new_id = str(uuid.uuid4())

        async def go(conn: Conn) -> tuple[Card, Card]:
            await conn.fetchrow(SQL.card_lock_thread, cid)  # lock order: the thread first
            row = await conn.fetchrow(
                SQL.card_decide, cid, "modified", principal, channel, None, snapshot_hash, tenant
            )
            if row is None:
                now = await conn.fetchrow(SQL.card_diagnose, cid)
                raise _why_not_decided(now, cid, principal, snapshot_hash, tenant)
            created_row = await conn.fetchrow(
                SQL.card_propose, *_values(new, new_id, operation_id(new_id))
            )
            if created_row is None:  # nothing of this transaction is kept
                if await conn.fetchrow(SQL.card_by_request_key, new.request_key) is None:
                    raise RunInactive(f"run {new.run_id} is no longer active", card_id=card_id)
                raise Conflict("an identical card already exists in this run", card_id=card_id)
            created = rows.card(created_row)
            old = rows.card(rows.some(await conn.fetchrow(SQL.card_set_superseded_by, cid, new_id)))
            await conn.execute(
                SQL.event_insert,
                old.id,
                "pending",
                "modified",
                principal,
                channel,
                snapshot_hash,
                {"edits": edits, "new_card": new_id},
            )
            await append_in(conn, old.thread_id, "card_update", old.public(), old.run_id)
            return old, created

        return await self._db.transaction(go)

    # -- the run's moves ------------------------------------------------------------------

    async def move(
        self,
        card_id: str,
        src: Status,
        dst: Status,
        *,
        actor: str,
        result: dict[str, Any] | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Moved | None:
        """A conditional move ``src -> dst``; ``None`` when the card was not in ``src``."""
        return await self._move(SQL.card_move_logged, card_id, src, dst, actor, result, detail)

    async def begin_execution(
        self,
        card_id: str,
        actor: str,
        holder: str | None = None,
        in_flight_seconds: float | None = None,
        attempt: str | None = None,
    ) -> Moved | None:
        """``approved -> executing`` and the operation row, atomically; ``None`` if we lost
        (I4), or (``holder`` given) if the card's run is not held by ``holder``.
        ``in_flight_seconds`` (how long after ``executing_since`` the worker's call may
        still be in flight) goes in the audit row, for a reconcile to wait out; so does
        ``attempt``, a token of this very call (:meth:`read_back_begin` reads it back
        when the answer was lost)."""
        detail: dict[str, Any] = {}
        if in_flight_seconds is not None:
            detail["in_flight_seconds"] = in_flight_seconds
        if attempt is not None:
            detail["attempt"] = attempt
        return await self._move(
            SQL.card_begin_execution,
            card_id,
            Status.APPROVED,
            Status.EXECUTING,
            actor,
            None,
            detail,
            holder,
        )

    async def finish_execution(
        self, card_id: str, *, ok: bool, result: dict[str, Any], actor: str
    ) -> Moved | None:
        """``executing -> executed|failed`` and the operation's outcome, atomically."""
        dst = Status.EXECUTED if ok else Status.FAILED
        outcome = "succeeded" if ok else "failed"
        return await self._move(
            SQL.card_finish_execution, card_id, Status.EXECUTING, dst, actor, result, None, outcome
        )

    async def expire(self, card_id: str) -> Moved | None:
        """``pending -> expired`` if the database clock says the deadline passed."""
        row = await self._db.fetchrow(SQL.card_expire_logged, rows.uuid_of(card_id))
        return None if row is None else rows.moved(row)

    async def _move(
        self,
        statement: str,
        card_id: str,
        src: Status,
        dst: Status,
        actor: str,
        result: dict[str, Any] | None = None,
        detail: dict[str, Any] | None = None,
        *extra: Any,
    ) -> Moved | None:
        """One logged transition statement (``card_move_logged``'s parameters + ``extra``)."""
        check_move(src, dst)
        cid = rows.uuid_of(card_id)
        row = await self._db.fetchrow(
            statement, cid, str(src), str(dst), result, actor, None, detail or {}, *extra
        )
        return None if row is None else rows.moved(row)


def _values(new: NewCard, card_id: str, op_id: str) -> tuple[Any, ...]:
    """``card_propose``'s parameters."""
    return (
        card_id,
        new.thread_id,
        new.run_id,
        new.tenant,
        new.owner,
        new.tool,
        new.tool_use_id,
        new.risk,
        new.input,
        new.args_snapshot,
        new.summary,
        new.impact,
        new.snapshot_hash,
        new.request_key,
        op_id,
        new.editable,
        new.ttl_seconds,
    )


def _why_not_decided(
    row: Any, card_id: str, principal: str, snapshot_hash: str, tenant: str | None
) -> Exception:
    """Why a deciding update changed no row (``row``: ``card_diagnose``), checked in the
    order a caller should learn it."""
    if row is None:
        return CardNotFound(f"card {card_id} not found", card_id=card_id)
    card = rows.card(row)
    if tenant is not None and card.tenant != tenant:  # another tenant's: not there for us
        return CardNotFound(f"card {card_id} not found", card_id=card_id)
    if card.owner != principal:
        return NotOwner("only the card's owner can decide it", card_id=card_id)
    if card.status is Status.EXPIRED:
        # 410 whether or not the sweeper has tidied it yet
        return Expired("the card expired before the decision", card_id=card_id)
    if card.status is not Status.PENDING:
        return AlreadyDecided(
            f"card already {card.status}",
            card_id=card_id,
            status=str(card.status),
            decided_by=card.decided_by,
            card=card.public(),
        )
    if card.snapshot_hash != snapshot_hash:
        return StaleCard(
            "the card changed since it was shown; reload it",
            card_id=card_id,
            snapshot_hash=card.snapshot_hash,
        )
    if row["is_expired"]:
        return Expired("the card expired before the decision", card_id=card_id)
    return Conflict("the card could not be decided", card_id=card_id)
