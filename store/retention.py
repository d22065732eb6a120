"""Retention's rows: prunable threads picked, locked, exported and deleted in batches.

A batch is one transaction (:meth:`Retention.prune_batch`): up to ``limit`` prunable
threads are locked ``FOR UPDATE SKIP LOCKED`` (oldest first), re-checked by a fresh
statement, the audit of their executed and failed cards is handed to ``archive``
(written and synced before anything is deleted), then the threads are deleted and their
rows go by ``ON DELETE CASCADE``. Two prunes at once take disjoint threads; a prune
killed between batches leaves every batch it committed done and nothing half-done, and
a re-run finishes the job. The WhatsApp channel's bookkeeping (finished ``wa_outbound``
rows, ``deliveries``) is deleted the same way: batches of rows taken ``FOR UPDATE SKIP
LOCKED``, oldest first, each batch one statement. The SQL is in ``store/queries.sql``
(``retention_*``).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from signoff.runtime.errors import SignoffError
from signoff.runtime.records import PruneCounts
from signoff.store.connector import Conn, Connector
from signoff.store.queries import SQL

Archive = Callable[[list[dict[str, Any]]], Awaitable[None]]


def _counts(row: Any) -> PruneCounts:
    return PruneCounts(
        threads=int(row["threads"]),
        messages=int(row["messages"]),
        runs=int(row["runs"]),
        cards=int(row["cards"]),
        audited=int(row["audited"]),
    )


class Retention:
    def __init__(self, db: Connector) -> None:
        self._db = db

    async def dry_run(
        self, tenant: str | None, older_than_seconds: float, exclude: list[str]
    ) -> PruneCounts:
        """What a prune with this rule would delete now (no lock, nothing changed)."""
        row = await self._db.fetchrow(SQL.retention_dry_run, tenant, older_than_seconds, exclude)
        assert row is not None
        return _counts(row)

    async def prune_batch(
        self,
        tenant: str | None,
        older_than_seconds: float,
        exclude: list[str],
        limit: int,
        archive: Archive,
    ) -> tuple[PruneCounts, int]:
        """Prune up to ``limit`` threads in one transaction; (what was deleted, how many
        threads were picked). Fewer picked than ``limit``: nothing more to do now.

        ``archive`` gets the audit rows first; if it raises, nothing is deleted. (A
        transaction retried after a lost race exports its rows again: at least once.)"""

        async def go(conn: Conn) -> tuple[PruneCounts, int]:
            await conn.execute(SQL.retention_jit_off)
            picked = [
                r["id"]
                for r in await conn.fetch(
                    SQL.retention_pick, tenant, older_than_seconds, limit, exclude
                )
            ]
            if not picked:
                return PruneCounts(), 0
            ids = [
                r["id"] for r in await conn.fetch(SQL.retention_recheck, picked, older_than_seconds)
            ]
            if not ids:
                return PruneCounts(), len(picked)
            counts = _counts(await conn.fetchrow(SQL.retention_counts, ids))
            if counts.audited:
                await archive([dict(r) for r in await conn.fetch(SQL.retention_audit, ids)])
            await conn.execute(SQL.retention_delete, ids)
            return counts, len(picked)

        return await self._db.transaction(go)

    async def prune_outbound(
        self, tenant: str | None, older_than_seconds: float, exclude: list[str], limit: int
    ) -> int:
        """Delete up to ``limit`` finished WhatsApp outbound rows (sent, failed, skipped) of
        the rule's tenants older than the window, in one transaction; how many went. Rows
        still ``claimed`` are never touched."""
        value = await self._db.fetchval(
            SQL.retention_outbound_delete, tenant, older_than_seconds, limit, exclude
        )
        return int(value or 0)

    async def count_outbound(
        self, tenant: str | None, older_than_seconds: float, exclude: list[str]
    ) -> int:
        """What :meth:`prune_outbound` would delete now, without a limit (dry run)."""
        value = await self._db.fetchval(
            SQL.retention_outbound_dry_run, tenant, older_than_seconds, exclude
        )
        return int(value or 0)

    async def prune_deliveries(self, older_than_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` channel delivery ids received before the window, in one
        transaction; how many went. The caller keeps the window above Meta's redelivery
        period (runtime/retention.py)."""
        value = await self._db.fetchval(SQL.retention_deliveries_delete, older_than_seconds, limit)
        return int(value or 0)

    async def count_deliveries(self, older_than_seconds: float) -> int:
        """What :meth:`prune_deliveries` would delete now, without a limit (dry run)."""
        value = await self._db.fetchval(SQL.retention_deliveries_dry_run, older_than_seconds)
        return int(value or 0)

    @asynccontextmanager
    async def exclusive(self, lease_seconds: float = 300.0) -> AsyncIterator[bool]:
        """Whether this process may run the scheduled prune now (one at a time across the
        workers): a lease row, held while the context is open and given back after it; a
        killed process's lease lapses after ``lease_seconds``. (Two prunes at once would
        still be safe, each batch locking its threads: the lease only saves the work.)"""
        holder = secrets.token_hex(8)
        taken = await self._db.fetchval(SQL.retention_lease_take, holder, lease_seconds)
        try:
            yield taken is not None
        finally:
            if taken is not None:
                with contextlib.suppress(SignoffError):
                    await self._db.execute(SQL.retention_lease_give, holder)
