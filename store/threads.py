"""Threads and their log: one per-thread ``seq`` over the conversation and the events
clients see (design note 1)."""

from __future__ import annotations

import uuid
from typing import Any

from signoff.runtime.errors import Conflict, NotFound, RunInactive
from signoff.runtime.records import Entry, Thread, ThreadSummary
from signoff.store import rows
from signoff.store.connector import Conn, Connector
from signoff.store.queries import SQL


async def append_in(conn: Conn, thread_id: str, kind: str, body: Any, run_id: str | None) -> Entry:
    """Append to the thread log inside the caller's transaction (which holds the thread)."""
    seq = await conn.fetchval(SQL.thread_next_seq, thread_id)
    if seq is None:
        raise NotFound(f"thread {thread_id} not found", thread_id=thread_id)
    created = await conn.fetchval(SQL.message_insert, thread_id, seq, run_id, kind, body)
    return Entry(
        thread_id=thread_id, seq=seq, run_id=run_id, kind=kind, body=body, created_at=created
    )


TITLE_CHARS = 80


def _title(body: Any) -> str:
    """A message's text on one line, cut to ``TITLE_CHARS``."""
    content = body.get("content", body.get("text", "")) if isinstance(body, dict) else ""
    if isinstance(content, list):
        content = " ".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    text = " ".join(str(content).split())
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"


class Threads:
    def __init__(self, db: Connector) -> None:
        self._db = db

    async def create_thread(self, tenant: str, owner: str, thread_id: str | None = None) -> Thread:
        """A new thread (``thread_id``: of that id, or :class:`Conflict` if it exists)."""
        new_id = thread_id or str(uuid.uuid4())
        row = await self._db.fetchrow(SQL.thread_insert, new_id, tenant, owner)
        if row is None:
            raise Conflict(f"thread {new_id} exists", thread_id=new_id)
        return rows.thread(row)

    async def delete_empty_thread(self, thread_id: str) -> bool:
        """Delete a thread nothing was written to yet; False when it is gone or not empty."""
        status = await self._db.execute(SQL.thread_delete_empty, rows.uuid_of(thread_id))
        return status == "DELETE 1"

    async def thread_age(self, thread_id: str) -> float | None:
        """Seconds since the thread was created, or None when there is no such thread."""
        age = await self._db.fetchval(SQL.thread_age, rows.uuid_of(thread_id))
        return None if age is None else float(age)

    async def get_thread(self, thread_id: str) -> Thread:
        row = await self._db.fetchrow(SQL.thread_get, rows.uuid_of(thread_id))
        if row is None:
            raise NotFound(f"thread {thread_id} not found", thread_id=thread_id)
        return rows.thread(row)

    async def list_threads(self, tenant: str, owner: str, limit: int = 50) -> list[ThreadSummary]:
        """The owner's threads, the most recently active first."""
        found = await self._db.fetch(SQL.threads_of_owner, tenant, owner, limit)
        return [
            ThreadSummary(
                id=r["id"],
                title=_title(r["first_message"]),
                pending=r["pending"],
                last_seq=r["last_seq"],
                created_at=r["created_at"],
                updated_at=r["updated_at"],
            )
            for r in found
        ]

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
            return await self._db.transaction(
                lambda conn: append_in(conn, thread_id, kind, body, None)
            )
        row = await self._db.fetchrow(
            SQL.run_append, rows.uuid_of(thread_id), kind, rows.uuid_of(run_id), body, holder
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
        found = await self._db.fetch(SQL.messages_after, rows.uuid_of(thread_id), after_seq, limit)
        return [rows.entry(thread_id, r) for r in found]

    async def conversation(self, thread_id: str) -> list[Entry]:
        found = await self._db.fetch(SQL.conversation, rows.uuid_of(thread_id))
        return [rows.entry(thread_id, r) for r in found]

    # -- per-user quotas (gateway/quotas.py) -------------------------------------------

    async def create_thread_within_quota(
        self,
        tenant: str,
        owner: str,
        *,
        limit: int,
        window_seconds: float,
        thread_id: str | None = None,
    ) -> tuple[Thread | None, float]:
        """A new thread, unless ``owner`` created ``limit`` or more in the last
        ``window_seconds``: then ``(None, seconds until one leaves the window)``.
        ``thread_id``: of that id, or :class:`Conflict` if it exists.

        One transaction under a per-user advisory lock, so concurrent requests on any
        gateway cannot all see room for one more.
        """
        async with self._db.tx() as conn:
            await conn.execute(SQL.quota_user_lock, tenant, owner)
            row = rows.some(
                await conn.fetchrow(
                    SQL.thread_insert_within_quota,
                    thread_id or str(uuid.uuid4()),
                    tenant,
                    owner,
                    limit,
                    float(window_seconds),
                )
            )
        if row["id"] is None:
            if row["recent"] < limit:  # room in the quota: the id was taken
                raise Conflict(f"thread {thread_id} exists", thread_id=thread_id)
            return None, max(float(row["retry_after"] or 0.0), 0.0)
        return rows.thread(
            {k: row[k] for k in ("id", "tenant", "owner", "last_seq", "created_at")}
        ), 0.0
