"""store.pool: the connection pool the store runs on (real Postgres)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from signoff.store.connector import init_connection
from signoff.store.pool import Pool
from tests import pgbouncer

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
