"""store.pool: the connection pool the store runs on (real Postgres)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from signoff.runtime.cards import Decision, Status
from signoff.runtime.errors import Unavailable
from signoff.store.connector import init_connection
from signoff.store.pool import Pool
from signoff.store.postgres import PostgresStore
from tests import pgbouncer
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix
from tests.integration.test_quiet_start import unblocked

pytestmark = pytest.mark.anyio


async def make(url: str, max_size: int = 2) -> Pool:
    return await Pool.create(url, min_size=1, max_size=max_size, init=init_connection)


async def test_reuses_grows_to_max_then_waits_bounded(database_url: str) -> None:
    pool = await make(database_url, max_size=2)
    try:
        async with pool.connection() as a:
            pid = a.get_server_pid()
        async with pool.connection() as again:
            assert again.get_server_pid() == pid  # reused, not reopened
        assert pool.size == 1
        a = await pool.acquire()
        b = await pool.acquire()
        assert pool.size == 2 and a is not b
        with pytest.raises(TimeoutError):
            await pool.acquire(timeout=0.2)  # full: the wait is bounded
        waiter = asyncio.ensure_future(pool.acquire(timeout=5))
        await asyncio.sleep(0.05)
        pool.release(a)
        assert await waiter is a  # handed straight to the waiter
        pool.release(b)
        pool.release(a)
        assert pool.free == 2
    finally:
        await pool.close()


async def test_broken_or_interrupted_connections_are_not_reused(database_url: str) -> None:
    # About Postgres sessions themselves (server pids): never through PgBouncer.
    database_url = pgbouncer.direct(database_url)
    pool = await make(database_url, max_size=1)
    try:
        async with pool.connection() as conn:
            first = conn.get_server_pid()
        # the server ends the session: the next acquire opens a new one
        async with pool.connection() as killer:
            killer_pid = killer.get_server_pid()
        other = await pgbouncer.connect(database_url)
        try:
            await other.fetchval("SELECT pg_terminate_backend($1)", first)
        finally:
            await other.close()
        assert killer_pid == first
        # The pool drops the dead session, whether asyncpg noticed before the next use
        # or the use itself fails.
        try:
            async with pool.connection() as conn:
                await conn.fetchval("SELECT 1")
        except (
            asyncpg.PostgresConnectionError,
            asyncpg.InterfaceError,
            asyncpg.exceptions.InternalClientError,
            OSError,
        ):
            pass
        async with pool.connection() as conn:
            assert await conn.fetchval("SELECT 1") == 1
            second = conn.get_server_pid()
        assert second != first
        # a statement interrupted on our side: the connection is terminated, not trusted
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1), pool.connection() as conn:
                await conn.execute("SELECT pg_sleep(5)")
        async with pool.connection() as conn:
            assert conn.get_server_pid() != second
            assert await conn.fetchval("SELECT 1") == 1
        # a Postgres error leaves the session usable: it is kept
        async with pool.connection() as conn:
            third = conn.get_server_pid()
        with pytest.raises(asyncpg.PostgresError):
            async with pool.connection() as conn:
                await conn.execute("SELECT 1/0")
        async with pool.connection() as conn:
            assert conn.get_server_pid() == third
        assert pool.size == 1
    finally:
        await pool.close()


async def test_a_waiter_gets_a_fresh_connection_when_one_is_dropped(database_url: str) -> None:
    pool = await make(database_url, max_size=1)
    try:
        conn = await pool.acquire()
        waiter = asyncio.ensure_future(pool.acquire(timeout=10))
        await asyncio.sleep(0.05)
        pool.release(conn, reusable=False)  # dropped while someone waits
        fresh = await waiter
        assert fresh is not conn and not fresh.is_closed()
        assert await fresh.fetchval("SELECT 2") == 2
        pool.release(fresh)
    finally:
        await pool.close()


async def test_a_decision_answered_unavailable_is_not_committed_later(database_url: str) -> None:
    """A decision waiting past the store timeout for its thread's lock is answered
    Unavailable (503, retry) and must not commit once the lock comes free: the connection
    is terminated only after asyncpg's cancel request for its statement is out (before,
    terminating it dropped the request and the server ran the decision to its end)."""
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        slow = await PostgresStore.connect(database_url, timeout=0.3)
        holder = await pgbouncer.connect(database_url)
        probe = await pgbouncer.connect(database_url)
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.execute(
                "SELECT 1 FROM threads WHERE id = $1 FOR NO KEY UPDATE", card.thread_id
            )
            holder_pid = await holder.fetchval("SELECT pg_backend_pid()")
            with pytest.raises(Unavailable):
                await slow.decide(
                    card.id,
                    principal=card.owner,
                    decision=Decision.APPROVE,
                    snapshot_hash=card.snapshot_hash,
                    channel="test",
                )
            await unblocked(probe, holder_pid)  # cancelled on the server, not left waiting
            await tx.rollback()
        finally:
            await holder.close()
            await probe.close()
            await slow.close()
        await asyncio.sleep(0.1)
        after = await h.store.get_card(card.id)
        assert after.status is Status.PENDING
        assert [e.to_status for e in await h.store.card_events(card.id)] == ["pending"]
