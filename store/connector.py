"""The one place the store talks to asyncpg: statements, transactions, retries, errors.

Managers (``store/threads.py``, ``runs.py``, ``workers.py``, ``cards.py``) run named
statements (``store/queries.sql``) through a :class:`Connector`, which

* runs one statement on a pooled connection (its own implicit transaction:
  :meth:`~Connector.execute`, :meth:`~Connector.fetch`, :meth:`~Connector.fetchrow`,
  :meth:`~Connector.fetchval`) or a function in one transaction
  (:meth:`~Connector.transaction`);
* tries either again, whole, when Postgres rolled it back as the victim of a deadlock or
  a serialization failure (three times, 10-200 ms apart; design note 16), then answers a
  retriable :class:`~signoff.runtime.errors.Unavailable` (503);
* translates driver errors at this boundary: the server gone or a statement past the
  timeout -> ``Unavailable``; a value Postgres refuses -> ``InvalidInput``; never a raw
  asyncpg exception.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg
import msgspec

from signoff.runtime.errors import InvalidInput, Unavailable
from signoff.runtime.metrics import COUNTERS
from signoff.store.pool import Pool

T = TypeVar("T")

log = logging.getLogger("signoff.store")

Conn = asyncpg.Connection
Row = asyncpg.Record

# The server went away or the session broke mid-statement: Unavailable (503), retryable.
# (TimeoutError is an OSError; asyncpg raises InternalClientError when a session is
# terminated by the server while a statement is in flight.)
GONE = (
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
RACE = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError)

# asyncpg's prepared statements met a pooler that hands each transaction another server
# session (PgBouncer < 1.21 in transaction mode) with the statement cache on: a setting to
# change, not a bug of the statement nor of the run it served (design note 32).
PREPARED_LOST = (
    asyncpg.exceptions.InvalidSQLStatementNameError,
    asyncpg.exceptions.DuplicatePreparedStatementError,
)
POOLER_HINT = (
    "Postgres lost a prepared statement between transactions: behind PgBouncer older than "
    "1.21 in transaction pooling mode, set SIGNOFF_DB_STATEMENT_CACHE_SIZE=0"
)
RACE_RETRIES = (0.01, 0.05, 0.2)

# Postgres refused a write because the session is read-only: a standby, a demoted primary
# after a failover, or default_transaction_read_only. Nothing was written; the pool drops
# the connection (store/pool.py) so a later try reaches the new primary.
READ_ONLY = asyncpg.exceptions.ReadOnlySQLTransactionError

# Postgres refused or stopped the statement for a reason of its own, not of the input: it
# is starting or shutting down (57P01, 57P03), an operator or a server-side timeout
# cancelled it (57014 statement_timeout, 55P03 lock_timeout, 25P03 and 57P05 idle
# timeouts), it ran out of connections, memory or disk (class 53), or an I/O or internal
# error (58, XX). Nothing of the statement was committed: Unavailable (503), retryable.
# Left out on purpose: data errors (22, the input's fault: 422) and every other class
# (constraint violations, undefined objects: a bug, which goes on as it is).
TRANSIENT = (
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
    asyncpg.exceptions.PostgresSystemError,
    asyncpg.exceptions.InternalServerError,
)

# What a client is told of a Postgres error (the driver's words name hosts, statements
# and arguments: logged where the error is).
POSTGRES_UNANSWERED = "the database did not answer; try again"
POSTGRES_READ_ONLY = "the database takes no writes right now; try again"

_json_encode = msgspec.json.Encoder()


def _encode(value: Any) -> str:
    return _json_encode.encode(value).decode()


async def init_connection(conn: Conn) -> None:
    """json and jsonb travel as msgspec encodes and decodes them."""
    for typ in ("jsonb", "json"):
        await conn.set_type_codec(
            typ, encoder=_encode, decoder=msgspec.json.decode, schema="pg_catalog"
        )


class Connector:
    """One pool of asyncpg connections (``store.pool``) and the rules for using it."""

    def __init__(self, pool: Pool, timeout: float | None = None) -> None:
        self.pool = pool
        self.timeout = timeout

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float | None = None,
        statement_cache_size: int | None = None,
    ) -> Connector:
        """``timeout`` bounds connecting, waiting for a pooled connection and each statement:
        a stalled or half-open Postgres then fails fast with :class:`Unavailable` (503)
        instead of hanging its callers; the transaction is rolled back by the server.

        ``statement_cache_size``: asyncpg's named prepared statements per connection. Behind
        PgBouncer in transaction pooling mode they need PgBouncer ≥ 1.21 with
        ``max_prepared_statements`` set; with an older one pass 0 (unnamed statements,
        prepared again on every call; design note 32)."""
        try:
            pool = await Pool.create(
                url,
                min_size=min_size,
                max_size=max_size,
                init=init_connection,
                command_timeout=timeout,
                connect_timeout=timeout or 60.0,
                statement_cache_size=statement_cache_size,
            )
        except (OSError, asyncpg.PostgresError) as exc:
            raise Unavailable(f"cannot reach Postgres: {exc}").said_as(POSTGRES_UNANSWERED) from exc
        return cls(pool, timeout)

    async def close(self) -> None:
        await self.pool.close()

    # -- one statement --------------------------------------------------------------

    async def execute(self, query: str, *args: Any) -> str:
        """Run one statement; its status (``"DELETE 1"``)."""
        return await self._one(lambda c: c.execute(query, *args))

    async def fetch(self, query: str, *args: Any) -> list[Row]:
        return await self._one(lambda c: c.fetch(query, *args))

    async def fetchrow(self, query: str, *args: Any) -> Row | None:
        return await self._one(lambda c: c.fetchrow(query, *args))

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self._one(lambda c: c.fetchval(query, *args))

    async def on_connection(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """``fn`` on one pooled connection, outside a transaction; an exception that is not
        the driver's closes the connection instead of pooling it again."""
        return await self._one(fn)

    async def _one(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        async def once() -> T:
            try:
                async with self.pool.connection(self.timeout) as conn:
                    return await fn(conn)
            except Exception as exc:
                error = _translated(exc)
                if error is None:
                    raise
                raise error from exc

        return await self._retrying(once)

    # -- transactions ---------------------------------------------------------------

    @asynccontextmanager
    async def tx(self) -> AsyncIterator[Conn]:
        """One transaction, not tried again (:meth:`transaction` is)."""
        try:
            async with self.pool.connection(self.timeout) as conn, conn.transaction():
                yield conn
        except Exception as exc:
            error = _translated(exc)
            if error is None:
                raise
            raise error from exc

    async def transaction(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """``fn`` in one transaction, tried again whole if Postgres picked it as the victim
        of a deadlock or serialization failure."""

        async def once() -> T:
            async with self.tx() as conn:
                return await fn(conn)

        return await self._retrying(once)

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        fresh = False  # tried again on a fresh session after a read-only refusal
        for wait in (*RACE_RETRIES, None):
            try:
                return await attempt()
            except Unavailable as exc:
                if isinstance(exc.__cause__, READ_ONLY) and not fresh:
                    # Nothing was written; the pool dropped that session (and the idle
                    # ones): once more on a new one, which sees a lifted setting or the
                    # new primary. Still read-only: Unavailable (503), retriable.
                    fresh = True
                    continue
                if wait is None or not isinstance(exc.__cause__, RACE):
                    raise
                log.warning("store: %s; trying again", exc.__cause__.__class__.__name__)
                COUNTERS.inc("signoff_store_races_retried_total")
                await asyncio.sleep(wait * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")


def _translated(exc: Exception) -> Exception | None:
    """The error callers see for a driver error; ``None`` for anything else (a
    SignoffError raised inside a transaction, a bug), which goes on as it is."""
    if isinstance(exc, GONE):
        COUNTERS.inc("signoff_postgres_errors_total")
        # (TimeoutError is an OSError: a statement or pool wait ran past the timeout.)
        # (Exceptions are always true: an empty message read "Postgres unavailable: ".)
        return Unavailable(f"Postgres unavailable: {str(exc) or type(exc).__name__}").said_as(
            POSTGRES_UNANSWERED
        )
    if isinstance(exc, asyncpg.DataError):
        return InvalidInput(f"invalid value: {exc}").said_as("a value could not be stored")
    if isinstance(exc, READ_ONLY):
        COUNTERS.inc("signoff_postgres_errors_total")
        return Unavailable(
            f"Postgres is read-only (a standby?); retry: {exc}", retriable=True
        ).said_as(POSTGRES_READ_ONLY)
    if isinstance(exc, TRANSIENT):
        COUNTERS.inc("signoff_postgres_errors_total")
        return Unavailable(f"Postgres refused the statement; retry: {exc}", retriable=True).said_as(
            POSTGRES_UNANSWERED
        )
    if isinstance(exc, RACE):
        return Unavailable(f"lost a race in Postgres; retry: {exc}", retriable=True).said_as(
            "a concurrent change got there first; try again"
        )
    if isinstance(exc, PREPARED_LOST):
        COUNTERS.inc("signoff_postgres_errors_total")
        log.error("%s (%s)", POOLER_HINT, exc)
        return Unavailable(f"{POOLER_HINT} ({exc})").said_as(POSTGRES_UNANSWERED)
    return None
