"""The Postgres store (asyncpg): the truth of signoff.

Every card transition is one conditional ``UPDATE ... WHERE status = $expected``
plus its ``card_events`` row and its thread-log entry, in one transaction, so
Postgres decides races between processes (I4, I8). SQL lives in
``store/queries.py``; driver errors become :class:`runtime.errors.Unavailable`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar

import asyncpg
import msgspec

from signoff.runtime.canonical import operation_id
from signoff.runtime.cards import Card, Decision, Status, check_move
from signoff.runtime.errors import (
    AlreadyDecided,
    CardNotFound,
    Conflict,
    Expired,
    IllegalTransition,
    InvalidInput,
    NotFound,
    NotOwner,
    RunInactive,
    StaleCard,
    Unavailable,
)
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.records import CardEvent, Entry, Moved, NewCard, Run, Thread
from signoff.store import queries as q
from signoff.store.pool import Pool

T = TypeVar("T")

log = logging.getLogger("signoff.store")

Conn = asyncpg.Connection

_json_encode = msgspec.json.Encoder()
MIGRATION_TIMEOUT = 3600.0  # a migration may rewrite big tables: not bound by the store timeout


def _encode(value: Any) -> str:
    return _json_encode.encode(value).decode()


async def _init_connection(conn: Conn) -> None:
    for typ in ("jsonb", "json"):
        await conn.set_type_codec(
            typ, encoder=_encode, decoder=msgspec.json.decode, schema="pg_catalog"
        )


def _some(row: asyncpg.Record | None) -> asyncpg.Record:
    """A row the statement must return (RETURNING after a successful insert or update)."""
    if row is None:
        raise Conflict("the row changed concurrently; retry")
    return row


# The server went away or the session broke mid-statement: Unavailable (503), retryable.
# (TimeoutError is an OSError; asyncpg raises InternalClientError when a session is
# terminated by the server while a statement is in flight.)
_GONE = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InternalClientError,
)

# Postgres chose this statement or transaction as the victim of a race it could not order
# (a deadlock, a serialization failure): it was rolled back whole, so it is tried again,
# a bounded number of times, and then answered as a retriable Unavailable (503) — never
# as a raw driver error. (Every write path takes its locks in one order: the thread,
# then the run, then cards; these retries are the second line, not the first.)
_RACE = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError)
RACE_RETRIES = (0.01, 0.05, 0.2)

# Who moves a card when no person does (the audit's actor, and ``decided_by``).
SUPERSEDE_ACTOR = "system:supersede"
SUPERSEDED_REASON = "a new user message arrived"
APPROVED_SUPERSEDED_REASON = (
    "a new message arrived in the conversation before this approved action started; "
    "nothing was executed"
)

_EXTRA = ("is_expired", "body", "log_seq", "log_at", "holder", "run_active")


def _card(row: asyncpg.Record) -> Card:
    data = dict(row)
    for key in _EXTRA:
        data.pop(key, None)
    return msgspec.convert(data, Card, from_attributes=False)


def _moved(row: asyncpg.Record, kind: str = "card_update") -> Moved:
    """A row of a ``queries.logged`` statement: the card and the log entry written with it."""
    card = _card(row)
    entry = Entry(
        thread_id=card.thread_id,
        seq=row["log_seq"],
        run_id=card.run_id,
        kind=kind,
        body=row["body"],
        created_at=row["log_at"],
    )
    return Moved(card, entry, row["holder"])


def _entry(thread_id: str, row: asyncpg.Record) -> Entry:
    return Entry(
        thread_id=thread_id,
        seq=row["seq"],
        run_id=row["run_id"],
        kind=row["kind"],
        body=row["body"],
        created_at=row["created_at"],
    )


def _run(row: asyncpg.Record) -> Run:
    return msgspec.convert(dict(row), Run)


class PostgresStore:
    """Store backed by one pool of asyncpg connections (``store.pool``)."""

    def __init__(self, pool: Pool, timeout: float | None = None) -> None:
        self._pool = pool
        self._timeout = timeout

    @classmethod
    async def connect(
        cls, url: str, *, min_size: int = 1, max_size: int = 10, timeout: float | None = None
    ) -> PostgresStore:
        """``timeout`` bounds connecting, waiting for a pooled connection and each statement:
        a stalled or half-open Postgres then fails fast with :class:`Unavailable` (503)
        instead of hanging its callers; the transaction is rolled back by the server."""
        try:
            pool = await Pool.create(
                url,
                min_size=min_size,
                max_size=max_size,
                init=_init_connection,
                command_timeout=timeout,
                connect_timeout=timeout or 60.0,
            )
        except (OSError, asyncpg.PostgresError) as exc:
            raise Unavailable(f"cannot reach Postgres: {exc}") from exc
        return cls(pool, timeout)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[Conn]:
        """One transaction, not retried (``_transaction`` retries lost races)."""
        try:
            async with self._pool.connection(self._timeout) as conn, conn.transaction():
                yield conn
        except _GONE as exc:
            # (TimeoutError is an OSError: a statement or pool wait ran past the timeout.)
            raise Unavailable(f"Postgres unavailable: {exc}") from exc
        except asyncpg.DataError as exc:
            raise InvalidInput(f"invalid value: {exc}") from exc
        except _RACE as exc:
            raise Unavailable(f"lost a race in Postgres; retry: {exc}", retriable=True) from exc

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run ``attempt`` (one statement, or one whole transaction) again when Postgres
        rolled it back as a deadlock or serialization victim; then Unavailable (503)."""
        for wait in (*RACE_RETRIES, None):
            try:
                return await attempt()
            except Unavailable as exc:
                if wait is None or not isinstance(exc.__cause__, _RACE):
                    raise
                log.warning("store: %s; trying again", exc.__cause__.__class__.__name__)
                COUNTERS.inc("signoff_store_races_retried_total")
                await asyncio.sleep(wait * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")

    async def _transaction(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """``fn`` in one transaction, tried again whole if Postgres picked it as the victim
        of a deadlock or serialization failure."""

        async def once() -> T:
            async with self._tx() as conn:
                return await fn(conn)

        return await self._retrying(once)

    async def _read(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """One statement (its own implicit transaction) on a pooled connection; a lost race
        is tried again like a transaction's."""

        async def once() -> T:
            try:
                async with self._pool.connection(self._timeout) as conn:
                    return await fn(conn)
            except _GONE as exc:
                raise Unavailable(f"Postgres unavailable: {exc}") from exc
            except asyncpg.DataError as exc:
                raise InvalidInput(f"invalid value: {exc}") from exc
            except _RACE as exc:
                raise Unavailable(f"lost a race in Postgres; retry: {exc}", retriable=True) from exc

        return await self._retrying(once)

    # -- schema -------------------------------------------------------------

    async def migrate(self) -> list[str]:
        """Apply pending migrations in order; return the versions applied now."""
        files = sorted(
            (
                f
                for f in resources.files("signoff.store.migrations").iterdir()
                if f.name.endswith(".sql")
            ),
            key=lambda f: f.name,
        )
        applied_now: list[str] = []
        async with self._tx() as conn:
            await conn.execute(q.MIGRATIONS_LOCK)
            await conn.execute(q.MIGRATIONS_TABLE)
            done = {r["version"] for r in await conn.fetch(q.MIGRATIONS_APPLIED)}
            for f in files:
                version = f.name.removesuffix(".sql")
                if version in done:
                    continue
                await conn.execute(f.read_text(), timeout=MIGRATION_TIMEOUT)
                await conn.execute(q.MIGRATION_RECORD, version)
                applied_now.append(version)
        return applied_now

    async def ping(self) -> None:
        await self._read(lambda c: c.fetchval("SELECT 1"))

    # -- threads and the thread log -----------------------------------------

    async def create_thread(self, tenant: str, owner: str, thread_id: str | None = None) -> Thread:
        new_id = thread_id or str(uuid.uuid4())
        row = await self._read(lambda c: c.fetchrow(q.THREAD_INSERT, new_id, tenant, owner))
        return msgspec.convert(dict(_some(row)), Thread)

    async def delete_empty_thread(self, thread_id: str) -> bool:
        """Delete a thread nothing was written to yet; False when it is gone or not empty."""
        async with self._tx() as conn:
            status = await conn.execute(q.THREAD_DELETE_EMPTY, _uuid(thread_id))
        return bool(status == "DELETE 1")

    async def get_thread(self, thread_id: str) -> Thread:
        row = await self._read(lambda c: c.fetchrow(q.THREAD_GET, _uuid(thread_id)))
        if row is None:
            raise NotFound(f"thread {thread_id} not found", thread_id=thread_id)
        return msgspec.convert(dict(row), Thread)

    async def _append(
        self, conn: Conn, thread_id: str, kind: str, body: Any, run_id: str | None
    ) -> Entry:
        seq = await conn.fetchval(q.THREAD_NEXT_SEQ, thread_id)
        if seq is None:
            raise NotFound(f"thread {thread_id} not found", thread_id=thread_id)
        created = await conn.fetchval(q.MESSAGE_INSERT, thread_id, seq, run_id, kind, body)
        return Entry(
            thread_id=thread_id, seq=seq, run_id=run_id, kind=kind, body=body, created_at=created
        )

    async def append(
        self,
        thread_id: str,
        kind: str,
        body: dict[str, Any],
        run_id: str | None = None,
        *,
        holder: str | None = None,
    ) -> Entry:
        """Append to the thread log. With a ``run_id``, only while that run is active and,
        with ``holder``, held by that worker (:class:`RunInactive` otherwise)."""
        if run_id is None:
            return await self._transaction(
                lambda conn: self._append(conn, thread_id, kind, body, None)
            )
        row = await self._read(
            lambda c: c.fetchrow(q.RUN_APPEND, _uuid(thread_id), kind, _uuid(run_id), body, holder)
        )
        if row is None:
            raise RunInactive(f"run {run_id} is no longer active", run_id=run_id)
        return Entry(
            thread_id=thread_id,
            seq=row["seq"],
            run_id=run_id,
            kind=kind,
            body=body,
            created_at=row["created_at"],
        )

    async def entries_after(self, thread_id: str, after_seq: int, limit: int = 1000) -> list[Entry]:
        rows = await self._read(
            lambda c: c.fetch(q.MESSAGES_AFTER, _uuid(thread_id), after_seq, limit)
        )
        return [_entry(thread_id, r) for r in rows]

    async def conversation(self, thread_id: str) -> list[Entry]:
        rows = await self._read(lambda c: c.fetch(q.CONVERSATION, _uuid(thread_id)))
        return [_entry(thread_id, r) for r in rows]

    # -- runs -----------------------------------------------------------------

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
    ) -> tuple[Run, list[Card], list[Run], bool]:
        """Start a run for a new user message, in one transaction.

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
        tid = _uuid(thread_id)

        async def go(conn: Conn) -> tuple[Run, list[Card], list[Run], bool]:
            thread = await conn.fetchrow(q.THREAD_GET + " FOR NO KEY UPDATE", tid)
            if thread is None:
                raise NotFound(f"thread {thread_id} not found", thread_id=thread_id)
            if run_id is not None:
                existing = await conn.fetchrow(q.RUN_GET, run_id)
                if existing is not None:
                    return _run(existing), [], [], False
            old_runs = [_run(r) for r in await conn.fetch(q.RUN_SUPERSEDE_ACTIVE, tid)]
            moved_cards: list[Card] = []
            detail = {"reason": SUPERSEDED_REASON, "message_from": actor}
            for row in await conn.fetch(q.CARDS_PENDING_OF_THREAD, tid):
                moved = await self._move(
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
                rows = await conn.fetch(q.CARDS_APPROVED_OF_RUNS, [r.id for r in old_runs])
                for row in rows:
                    moved = await self._move(
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
            run_row = await conn.fetchrow(
                q.RUN_INSERT,
                run_id or str(uuid.uuid4()),
                tid,
                thread["tenant"],
                owner,
                role,
                holder,
                lease_seconds,
            )
            run = _run(_some(run_row))
            await self._append(conn, tid, "user", {"content": content}, run.id)
            return run, moved_cards, old_runs, True

        return await self._transaction(go)

    async def get_run(self, run_id: str) -> Run:
        row = await self._read(lambda c: c.fetchrow(q.RUN_GET, _uuid(run_id)))
        if row is None:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        return _run(row)

    async def active_run(self, thread_id: str) -> Run | None:
        row = await self._read(lambda c: c.fetchrow(q.RUN_ACTIVE_FOR_THREAD, _uuid(thread_id)))
        return None if row is None else _run(row)

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
        row = await self._read(
            lambda c: c.fetchrow(q.RUN_SET_STATE, run_id, status, state, error, holder)
        )
        if row is None:
            raise RunInactive(f"run {run_id} is no longer active", run_id=run_id)
        return _run(row)

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
        row = await self._read(
            lambda c: c.fetchrow(
                q.RUN_STEP,
                _uuid(run_id),
                _uuid(thread_id),
                kinds,
                bodies,
                status,
                state,
                error,
                holder,
            )
        )
        if row is None:
            raise RunInactive(f"run {run_id} is no longer active", run_id=run_id)
        data = dict(row)
        seqs, ats = data.pop("seqs"), data.pop("ats")
        entries = [
            Entry(thread_id=thread_id, seq=seq, run_id=run_id, kind=k, body=b, created_at=at)
            for seq, at, k, b in zip(seqs, ats, kinds, bodies, strict=True)
        ]
        return entries, msgspec.convert(data, Run)

    async def run_with_cards(self, run_id: str) -> tuple[Run, list[Card], list[Entry]]:
        """A run, its cards and its thread's conversation in one read (what continuing a
        parked run starts from)."""
        row = await self._read(lambda c: c.fetchrow(q.RUN_WITH_CARDS, _uuid(run_id)))
        if row is None:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        data = dict(row)
        cards = msgspec.convert(data.pop("cards"), list[Card])
        conversation = msgspec.convert(data.pop("conversation"), list[Entry])
        return msgspec.convert(data, Run), cards, conversation

    async def renew_leases(self, holder: str, lease_seconds: float) -> None:
        """Renew this worker's lease: every run it holds stays held (one row)."""
        await self._read(lambda c: c.execute(q.WORKER_RENEW, holder, lease_seconds))

    async def release_runs(self, holder: str) -> None:
        """Hand every run back at once and drop the worker's lease (graceful stop)."""
        await self._read(lambda c: c.execute(q.RUN_RELEASE, holder))

    async def forget_workers(self, idle_seconds: float = 3600.0) -> int:
        """Drop the lease rows of workers lapsed for ``idle_seconds`` that hold no run."""
        status = await self._read(lambda c: c.execute(q.WORKERS_FORGET, idle_seconds))
        return int(status.split()[-1])

    async def adopt_runs(
        self, holder: str, lease_seconds: float, limit: int = 1000, *, own: bool = False
    ) -> list[Run]:
        """Take over active runs nobody holds: released ones and those of workers whose
        lease lapsed (``own``: also those already ours). Renews our lease too."""
        rows = await self._read(lambda c: c.fetch(q.RUN_ADOPT, holder, lease_seconds, limit, own))
        return [_run(r) for r in rows]

    # -- cards ----------------------------------------------------------------

    async def propose(self, new: NewCard) -> tuple[Card, Entry | None]:
        """Insert a pending card with its audit row and ``card`` log entry (one statement),
        or return the card this request already has, with no entry (I5)."""
        card_id = new.id or str(uuid.uuid4())
        op_id = new.operation_id or operation_id(card_id)
        row = await self._read(
            lambda c: c.fetchrow(q.CARD_PROPOSE, *self._card_values(new, card_id, op_id))
        )
        if row is not None:
            moved = _moved(row, "card")
            return moved.card, moved.entry
        row = await self._read(lambda c: c.fetchrow(q.CARD_BY_REQUEST_KEY, new.request_key))
        return _card(_some(row)), None

    @staticmethod
    def _card_values(new: NewCard, card_id: str, op_id: str) -> tuple[Any, ...]:
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

    async def _insert_card(self, conn: Conn, new: NewCard, card_id: str, op_id: str) -> Card | None:
        row = await conn.fetchrow(q.CARD_PROPOSE, *self._card_values(new, card_id, op_id))
        return None if row is None else _card(row)

    async def get_card(self, card_id: str) -> Card:
        row = await self._read(lambda c: c.fetchrow(q.CARD_GET, _uuid(card_id)))
        if row is None:
            raise CardNotFound(f"card {card_id} not found", card_id=card_id)
        return _card(row)

    async def card_input(self, card_id: str) -> dict[str, Any]:
        """The model's original (parsed) input, which an edit starts from."""
        row = await self._read(
            lambda c: c.fetchrow("SELECT input FROM cards WHERE id = $1", _uuid(card_id))
        )
        if row is None:
            raise CardNotFound(f"card {card_id} not found", card_id=card_id)
        value: dict[str, Any] = row["input"]
        return value

    async def cards_of_run(self, run_id: str) -> list[Card]:
        rows = await self._read(lambda c: c.fetch(q.CARDS_OF_RUN, _uuid(run_id)))
        return [_card(r) for r in rows]

    async def pending_cards(self, thread_id: str) -> list[Card]:
        rows = await self._read(lambda c: c.fetch(q.CARDS_PENDING_OF_THREAD, _uuid(thread_id)))
        return [_card(r) for r in rows]

    async def list_cards(
        self, status: str | None = None, owner: str | None = None, limit: int = 100
    ) -> list[Card]:
        rows = await self._read(lambda c: c.fetch(q.CARDS_LIST, status, owner, limit))
        return [_card(r) for r in rows]

    async def card_events(self, card_id: str) -> list[CardEvent]:
        rows = await self._read(lambda c: c.fetch(q.EVENTS_OF_CARD, _uuid(card_id)))
        return [msgspec.convert(dict(r), CardEvent) for r in rows]

    async def _diagnose(
        self, conn: Conn, card_id: str, principal: str, snapshot_hash: str, tenant: str | None
    ) -> Exception:
        """Why a deciding update changed no row, checked in the order a caller should learn it."""
        row = await conn.fetchrow(q.CARD_DIAGNOSE, card_id)
        if row is None:
            return CardNotFound(f"card {card_id} not found", card_id=card_id)
        card = _card(row)
        if card.owner != principal or (tenant is not None and card.tenant != tenant):
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
    ) -> Moved:
        """The deciding update (I2, I3, I7) with its audit row and log entry (one statement),
        or a precise error.

        ``tenant``: the principal's tenant; a user of the same name elsewhere is not the owner."""
        if decision is Decision.EDIT:
            raise IllegalTransition("edits go through edit()")
        target = Status.APPROVED if decision is Decision.APPROVE else Status.REJECTED
        cid = _uuid(card_id)
        detail = {"reason": reason} if reason else {}
        row = await self._read(
            lambda c: c.fetchrow(
                q.CARD_DECIDE_LOGGED,
                cid,
                str(target),
                principal,
                channel,
                reason,
                snapshot_hash,
                tenant,
                detail,
            )
        )
        if row is None:
            async with self._tx() as conn:
                raise await self._diagnose(conn, cid, principal, snapshot_hash, tenant)
        return _moved(row)

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
        """Owner edits: the old card becomes ``modified`` and a new linked card is proposed."""
        cid = _uuid(card_id)
        new_id = str(uuid.uuid4())

        async def go(conn: Conn) -> tuple[Card, Card]:
            await conn.fetchrow(q.CARD_LOCK_THREAD, cid)  # lock order: the thread first
            row = await conn.fetchrow(
                q.CARD_DECIDE, cid, "modified", principal, channel, None, snapshot_hash, tenant
            )
            if row is None:
                raise await self._diagnose(conn, cid, principal, snapshot_hash, tenant)
            created = await self._insert_card(conn, new, new_id, operation_id(new_id))
            if created is None:
                raise Conflict("an identical card already exists in this run", card_id=card_id)
            old_row = await conn.fetchrow(
                f"UPDATE cards SET superseded_by = $2 WHERE id = $1 RETURNING {q.CARD_COLUMNS}",
                cid,
                new_id,
            )
            old = _card(_some(old_row))
            await conn.execute(
                q.EVENT_INSERT,
                old.id,
                "pending",
                "modified",
                principal,
                channel,
                snapshot_hash,
                {"edits": edits, "new_card": new_id},
            )
            await self._append(conn, old.thread_id, "card_update", old.public(), old.run_id)
            return old, created

        return await self._transaction(go)

    async def _move(
        self,
        conn: Conn,
        card_id: str,
        src: Status,
        dst: Status,
        *,
        actor: str,
        channel: str | None = None,
        result: dict[str, Any] | None = None,
        detail: dict[str, Any] | None = None,
        statement: str = q.CARD_MOVE_LOGGED,
        extra: tuple[Any, ...] = (),
    ) -> Moved | None:
        """``src -> dst`` with its audit row and log entry: one statement."""
        check_move(src, dst)
        row = await conn.fetchrow(
            statement, card_id, str(src), str(dst), result, actor, channel, detail or {}, *extra
        )
        return None if row is None else _moved(row)

    async def _move_one(
        self,
        card_id: str,
        src: Status,
        dst: Status,
        *,
        actor: str,
        result: dict[str, Any] | None = None,
        detail: dict[str, Any] | None = None,
        statement: str = q.CARD_MOVE_LOGGED,
        extra: tuple[Any, ...] = (),
    ) -> Moved | None:
        cid = _uuid(card_id)
        return await self._read(
            lambda c: self._move(
                c,
                cid,
                src,
                dst,
                actor=actor,
                result=result,
                detail=detail,
                statement=statement,
                extra=extra,
            )
        )

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
        return await self._move_one(card_id, src, dst, actor=actor, result=result, detail=detail)

    async def begin_execution(self, card_id: str, actor: str) -> Moved | None:
        """``approved -> executing`` and the operation row, atomically; ``None`` if we lost (I4)."""
        return await self._move_one(
            card_id,
            Status.APPROVED,
            Status.EXECUTING,
            actor=actor,
            statement=q.CARD_BEGIN_EXECUTION,
        )

    async def finish_execution(
        self, card_id: str, *, ok: bool, result: dict[str, Any], actor: str
    ) -> Moved | None:
        """``executing -> executed|failed`` and the operation's outcome, atomically."""
        return await self._move_one(
            card_id,
            Status.EXECUTING,
            Status.EXECUTED if ok else Status.FAILED,
            actor=actor,
            result=result,
            statement=q.CARD_FINISH_EXECUTION,
            extra=("succeeded" if ok else "failed",),
        )

    async def expire(self, card_id: str) -> Moved | None:
        """``pending -> expired`` if the database clock says the deadline passed."""
        cid = _uuid(card_id)
        row = await self._read(lambda c: c.fetchrow(q.CARD_EXPIRE_LOGGED, cid))
        return None if row is None else _moved(row)

    async def decided_among(self, card_ids: list[str]) -> dict[str, str]:
        """Which of these cards left ``pending`` (card id -> status)."""
        if not card_ids:
            return {}
        rows = await self._read(lambda c: c.fetch(q.CARDS_DECIDED_AMONG, card_ids))
        return {r["id"]: r["status"] for r in rows}

    async def overdue_card_ids(self, limit: int = 500) -> list[str]:
        rows = await self._read(lambda c: c.fetch(q.CARDS_OVERDUE, limit))
        return [r["id"] for r in rows]

    async def approved_stale(
        self, older_than_seconds: float, limit: int = 500
    ) -> list[tuple[Card, bool]]:
        """Approved cards not started for ``older_than_seconds``, each with whether its run
        is still active."""
        rows = await self._read(
            lambda c: c.fetch(q.CARDS_APPROVED_STALE, older_than_seconds, limit)
        )
        return [(_card(r), bool(r["run_active"])) for r in rows]

    async def flag_stuck(self, threshold_seconds: float) -> list[Card]:
        async def go(conn: Conn) -> list[Card]:
            rows = await conn.fetch(q.CARDS_STUCK_EXECUTING, threshold_seconds)
            cards = [_card(r) for r in rows]
            for card in cards:
                await conn.execute(
                    q.EVENT_INSERT,
                    card.id,
                    "executing",
                    "executing",
                    "sweeper",
                    None,
                    None,
                    {"needs_reconciliation": True},
                )
            return cards

        return await self._transaction(go)

    async def reconcile(self, card_id: str, *, executed: bool, actor: str, note: str) -> Card:
        """An operator settles a card stuck in ``executing`` after checking the provider.

        ``executing -> executed|failed`` with the operator and their note in the audit;
        the flag is cleared. Never re-executes anything.
        """
        dst = Status.EXECUTED if executed else Status.FAILED
        result = {"reconciled_by": actor, "note": note}

        async def go(conn: Conn) -> Card:
            moved = await self._move(
                conn,
                _uuid(card_id),
                Status.EXECUTING,
                dst,
                actor=actor,
                channel="cli",
                result=result,
                detail={"reconciled": note},
            )
            if moved is None:
                current = await conn.fetchrow(q.CARD_GET, _uuid(card_id))
                if current is None:
                    raise CardNotFound(f"card {card_id} not found", card_id=card_id)
                raise IllegalTransition(
                    f"only a card in executing can be reconciled; this one is {current['status']}"
                )
            card = moved.card
            await conn.execute(q.CARD_RECONCILE_FLAG, card.id, False)
            await conn.execute(
                q.OPERATION_FINISH, card.operation_id, "succeeded" if executed else "failed", result
            )
            row = await conn.fetchrow(q.CARD_GET, card.id)
            return _card(_some(row))

        return await self._transaction(go)

    async def record_delivery(self, channel: str, message_id: str) -> bool:
        """True the first time a channel message id is seen (webhook dedup)."""
        value = await self._read(lambda c: c.fetchval(q.DELIVERY_INSERT, channel, message_id))
        return value is not None

    async def now(self) -> datetime:
        value: datetime = await self._read(lambda c: c.fetchval("SELECT now()"))
        return value

    # -- per-user quotas (gateway/quotas.py) ----------------------------------------

    async def create_thread_within_quota(
        self, tenant: str, owner: str, *, limit: int, window_seconds: float
    ) -> tuple[Thread | None, float]:
        """A new thread, unless ``owner`` created ``limit`` or more in the last
        ``window_seconds``: then ``(None, seconds until one leaves the window)``.

        One transaction under a per-user advisory lock, so concurrent requests on any
        gateway cannot all see room for one more.
        """
        async with self._tx() as conn:
            await conn.execute(q.QUOTA_USER_LOCK, tenant, owner)
            row = _some(
                await conn.fetchrow(
                    q.THREAD_INSERT_WITHIN_QUOTA,
                    str(uuid.uuid4()),
                    tenant,
                    owner,
                    limit,
                    float(window_seconds),
                )
            )
        if row["id"] is None:
            return None, max(float(row["retry_after"] or 0.0), 0.0)
        thread = {k: row[k] for k in ("id", "tenant", "owner", "last_seq", "created_at")}
        return msgspec.convert(thread, Thread), 0.0

    async def turns_in_flight(
        self, tenant: str, owner: str, accepted_run_ids: list[str]
    ) -> tuple[int, list[str]]:
        """The owner's model turns in flight: runs ``running`` now plus accepted messages
        (by the run id each will get) that no worker has started. Also returns the run ids
        among ``accepted_run_ids`` that have started (counted by their runs from now on)."""
        row = await self._read(
            lambda c: c.fetchrow(q.TURNS_IN_FLIGHT, tenant, owner, accepted_run_ids)
        )
        row = _some(row)
        return int(row["running"]) + int(row["queued"]), list(row["started"])


def _uuid(value: str) -> str:
    """Validate an id before it reaches SQL: a malformed id is simply not found."""
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError) as exc:
        raise NotFound(f"{value!r} is not a valid id") from exc
