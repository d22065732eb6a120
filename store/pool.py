"""A small pool of asyncpg connections, handed out in turn.

Why not ``asyncpg.Pool``: on this path every statement is short, and asyncpg's pool
costs ~50 µs of a ~120 µs round trip here (a task per acquire when it has a
timeout, a shielded task per release, a reset query unless switched off). This
one is a free list and a queue of waiters; release is synchronous. What it keeps
from asyncpg's: lazy growth up to ``max_size``, broken connections are dropped
and replaced on demand, the wait for a connection is bounded by ``timeout``.

A connection is only reused after a clean exit or a Postgres error (the server
answered; a transaction block has rolled back). After anything else (a
cancellation, a timeout, a dropped socket) it is terminated rather than
trusted: its protocol state is unknown.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import asyncpg

# asyncpg's prepared-statement cache per connection, when the caller names none (0 behind
# PgBouncer < 1.21 in transaction pooling mode; design note 32).
STATEMENT_CACHE_SIZE = 100


class Pool:
    def __init__(
        self,
        url: str,
        *,
        min_size: int,
        max_size: int,
        init: Callable[[asyncpg.Connection], Awaitable[None]],
        command_timeout: float | None,
        connect_timeout: float,
        statement_cache_size: int | None = None,
    ) -> None:
        self._url = url
        self._min = min_size
        self._max = max(max_size, 1)
        self._init = init
        self._command_timeout = command_timeout
        self._connect_timeout = connect_timeout
        self._statement_cache_size = statement_cache_size
        self._free: collections.deque[asyncpg.Connection] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[asyncpg.Connection]] = collections.deque()
        self._size = 0  # open or opening connections
        self._retiring: set[asyncio.Task[None]] = set()  # terminated once their cancel is out
        self._closed = False

    @property
    def url(self) -> str:
        """The server's URL (for a dedicated connection outside the pool)."""
        return self._url

    @classmethod
    async def create(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        init: Callable[[asyncpg.Connection], Awaitable[None]],
        command_timeout: float | None = None,
        connect_timeout: float = 60.0,
        statement_cache_size: int | None = None,
    ) -> Pool:
        pool = cls(
            url,
            min_size=min_size,
            max_size=max_size,
            init=init,
            command_timeout=command_timeout,
            connect_timeout=connect_timeout,
            statement_cache_size=statement_cache_size,
        )
        for _ in range(max(min_size, 1)):
            pool._free.append(await pool._connect())
        return pool

    async def _connect(self) -> asyncpg.Connection:
        self._size += 1
        try:
            conn: asyncpg.Connection = await asyncpg.connect(
                self._url,
                command_timeout=self._command_timeout,
                timeout=self._connect_timeout,
                statement_cache_size=(
                    STATEMENT_CACHE_SIZE
                    if self._statement_cache_size is None
                    else self._statement_cache_size
                ),
            )
            try:
                await self._init(conn)
            except BaseException:
                conn.terminate()
                raise
        except BaseException:
            self._size -= 1
            raise
        return conn

    @property
    def size(self) -> int:
        return self._size

    @property
    def free(self) -> int:
        return len(self._free)

    async def acquire(self, timeout: float | None = None) -> asyncpg.Connection:
        if self._closed:
            raise asyncpg.InterfaceError("pool is closed")
        while self._free:
            conn = self._free.popleft()
            if not conn.is_closed():
                return conn
            self._size -= 1
        if self._size < self._max:
            async with asyncio.timeout(timeout):
                return await self._connect()
        waiter: asyncio.Future[asyncpg.Connection] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())  # handed over as we gave up: pass it on
            else:
                waiter.cancel()
            raise

    def release(self, conn: asyncpg.Connection, *, reusable: bool = True) -> None:
        if not reusable or conn.is_closed() or conn.is_in_transaction() or self._closed:
            if not conn.is_closed():
                self._retire(conn)
            self._size -= 1
            self._replace()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._free.append(conn)

    def _retire(self, conn: asyncpg.Connection) -> None:
        """Terminate a connection we no longer trust, once asyncpg's cancel request for the
        statement it was running (sent when that statement timed out or its caller was
        cancelled) has reached the server. Terminated at once, asyncpg drops the request
        with it, and the server runs the abandoned statement to its end: a write whose
        caller was answered ``Unavailable`` (a decision waiting past the store timeout
        for a thread's lock, say) would still commit once the lock came free."""
        cancelling = [t for t in getattr(conn, "_cancellations", ()) if not t.done()]
        if not cancelling:
            conn.terminate()
            return
        task = asyncio.get_running_loop().create_task(_terminate_after(conn, cancelling))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _replace(self) -> None:
        """A connection went away while someone waits: open another for them."""
        if self._closed or not self._waiters or self._size >= self._max:
            return
        task = asyncio.get_running_loop().create_task(self._connect())
        task.add_done_callback(self._opened)

    def _opened(self, task: asyncio.Task[asyncpg.Connection]) -> None:
        if task.cancelled() or task.exception() is not None:
            # Could not connect: the waiters' own timeouts report it.
            return
        self.release(task.result())

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[asyncpg.Connection]:
        conn = await self.acquire(timeout)
        reusable = False
        try:
            yield conn
            reusable = True
        except asyncpg.exceptions.ReadOnlySQLTransactionError:
            # A standby or a demoted primary: the idle sessions were most likely opened on
            # it too; new ones may reach the new primary (or see the setting lifted).
            self.drop_free()
            raise
        except asyncpg.PostgresError:
            reusable = True  # the server answered; the connection is in a known state
            raise
        finally:
            self.release(conn, reusable=reusable)

    def drop_free(self) -> None:
        """Terminate the idle connections (they are opened again on demand)."""
        while self._free:
            self._free.popleft().terminate()
            self._size -= 1

    # asyncpg.Pool's shortcuts, for tools and tests
    async def execute(self, query: str, *args: object) -> str:
        async with self.connection() as conn:
            return await conn.execute(query, *args)

    async def fetchval(self, query: str, *args: object) -> object:
        async with self.connection() as conn:
            return await conn.fetchval(query, *args)

    async def close(self) -> None:
        self._closed = True
        for waiter in self._waiters:
            waiter.cancel()
        self._waiters.clear()
        conns = list(self._free)
        self._free.clear()
        self._size -= len(conns)

        async def close(conn: asyncpg.Connection) -> None:
            try:
                await asyncio.wait_for(conn.close(), 5)
            except (TimeoutError, OSError, asyncpg.InterfaceError):
                conn.terminate()

        # At once: half-open connections (a link cut without a reset) each wait out the
        # 5 s, and a stop must fit a orchestrator's grace period (operator probe).
        await asyncio.gather(*(close(c) for c in conns))

    def terminate(self) -> None:
        self._closed = True
        for conn in self._free:
            conn.terminate()
        self._free.clear()


# How long a retired connection waits for its statement's cancel request (a new connection
# to the server that carries it) before it is terminated anyway.
CANCEL_WAIT = 5.0


async def _terminate_after(conn: asyncpg.Connection, cancelling: list[asyncio.Task[None]]) -> None:
    try:
        await asyncio.wait(cancelling, timeout=CANCEL_WAIT)
    finally:
        conn.terminate()
