"""Shared fixtures: a fresh Postgres database per test session on a real server.

The server is the machine's Postgres (127.0.0.1:5432) or an embedded one
(``tests/services.py``). Async tests use anyio's pytest plugin on asyncio.
"""

from __future__ import annotations

import asyncio
import gc
import secrets
import signal
import socket
import warnings
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from redis.asyncio.connection import AbstractConnection

from signoff.store import pool
from signoff.store.postgres import PostgresStore
from tests import pgbouncer, services
from tests.rediscluster import LocalCluster, local_cluster


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C stops the run (pytest's interrupt summary, every fixture torn down). With
    Python's own handler in place, each asyncio runner of an async test swaps in its own,
    which cancels the test's task instead: the test failed and the suite went on, at
    every Ctrl-C. An equivalent handler that is not Python's is left alone by them."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def _create_db(server_url: str, name: str) -> None:
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _drop_db(server_url: str, name: str) -> None:
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def fresh_database(prefix: str = "so_t") -> tuple[str, str]:
    """Create an empty database on the test server; returns (url, name)."""
    server = services.postgres_url()
    name = f"{prefix}_{secrets.token_hex(5)}"
    asyncio.run(_create_db(server, name))
    return with_database(server, name), name


def drop_database(name: str) -> None:
    asyncio.run(_drop_db(services.postgres_url(), name))


@pytest.fixture(scope="session", autouse=True)
def _statement_cache_behind_pgbouncer() -> Iterator[None]:
    """Through PgBouncer (``SIGNOFF_TEST_PGBOUNCER=1``), stores open with asyncpg's
    statement cache off, as a deployment behind PgBouncer < 1.21 sets it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pool, "STATEMENT_CACHE_SIZE", pgbouncer.statement_cache_size())
        if pgbouncer.enabled():  # the demo app's own pool, and processes tests start
            patch.setenv("SIGNOFF_DB_STATEMENT_CACHE_SIZE", "0")
        yield


@pytest.fixture(autouse=True)
def _pgbouncer_alive() -> Iterator[None]:
    """Through PgBouncer, each test starts with one running (tests/pgbouncer.py revive):
    looked at before the test and again after its fixtures are torn down (where a crash
    comes from), so the next test's fixtures find it running."""
    if pgbouncer.enabled():
        pgbouncer.revive()
    yield
    if pgbouncer.enabled():
        pgbouncer.revive()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A migrated database shared by the session (tests use their own threads and users);
    through PgBouncer in transaction pooling mode when ``SIGNOFF_TEST_PGBOUNCER=1``."""
    yield from migrated_database()


def migrated_database(prefix: str = "so_t", *, pooled: bool = True) -> Iterator[str]:
    """A fresh migrated database (through PgBouncer when the run asks and ``pooled``:
    ``pooled=False`` for a test that keeps session settings), dropped after.

    For a module whose assertions count what every worker in the database does: on the
    session's database, a harness's worker also adopts the lapsed runs other tests left
    there (runs of stopped workers, of made-up holders) and continues them with its model.
    """
    url, name = fresh_database(prefix)
    if pooled and pgbouncer.enabled():
        url = pgbouncer.through(url)

    async def migrate() -> None:
        store = await PostgresStore.connect(url)
        try:
            await store.migrate()
        finally:
            await store.close()

    asyncio.run(migrate())
    yield url
    drop_database(name)


def end_runs(database_url: str, *tenants: str) -> None:
    """Supersede the active runs a module left in the session's database under these
    tenants (made-up holders, stopped workers): a later test's worker would adopt them and
    continue them with its own model, and tests that count its work would see them."""

    async def end() -> None:
        conn = await pgbouncer.connect(database_url)
        try:
            await conn.execute(
                "UPDATE runs SET status = 'superseded'"
                " WHERE tenant = ANY($1::text[]) AND status IN ('running', 'waiting')",
                list(tenants),
            )
        finally:
            await conn.close()

    asyncio.run(end())


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.connect(database_url, max_size=20)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A local 3-master + 3-replica Redis Cluster for the session (``tests/rediscluster.py``)."""
    with local_cluster() as cluster:
        _CLUSTER_PORTS.update(cluster.ports)
        yield cluster


_CLUSTER_PORTS: set[int] = set()  # the session's local Redis Cluster, once started


@pytest.fixture(autouse=True)
def _cluster_leaks_closed(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the local Redis Cluster, or any slow test (and its other fixtures'
    teardown), close the connections that were dropped without being closed while
    servers were killed, stopped or restarted on purpose: redis-py's cluster client's
    (opened to startup nodes by ``NodesManager.initialize`` and replaced during a
    topology reload; traced with an allocation probe), bare sockets a transport let go
    of, and transports closed on a test's event loop that ended before they let go of
    their socket. They stay referenced for a while, so a ``gc.collect()`` here did not
    find them, and when they were collected later their ``ResourceWarning`` failed
    whichever test ran then (``test_500_threads_across_pools``, and in CI's slow pass
    ``test_postgres_restart_and_redis_master_kill_under_load_lose_nothing``: five
    closing transports; pytest turns warnings into errors here). Any StreamWriter still
    open to a cluster node once every client of the test is closed is such a leftover.
    Checked after every test once the cluster has started: a reconnect redis-py began in
    a cluster test may open its socket after that test's teardown."""
    yield
    slow = request.node.get_closest_marker("slow") is not None
    if not _CLUSTER_PORTS and not slow:
        return
    if _close_cluster_leftovers():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


def _close_cluster_leftovers() -> int:
    """Close every redis-py connection and bare StreamWriter still open to a node of the
    local cluster, and every transport closed on an event loop that has ended; return
    how many. A connection is emptied as redis-py's own ``_close`` does, so neither its
    ``__del__`` nor its StreamWriter's warns later. ``type()`` rather than
    ``isinstance``: ``gc.get_objects()`` holds weak proxies, and ``isinstance`` on a dead
    one raises ``ReferenceError``."""
    closed = 0
    for obj in gc.get_objects():
        kind = type(obj)
        if issubclass(kind, AbstractConnection):
            writer = getattr(obj, "_writer", None)
            if writer is not None and getattr(obj, "port", None) in _CLUSTER_PORTS:
                _abort(writer.transport)
                obj._writer = obj._reader = None
                closed += 1
        elif issubclass(kind, asyncio.StreamWriter) and not obj.transport.is_closing():
            peer = obj.get_extra_info("peername")
            if peer and peer[1] in _CLUSTER_PORTS:
                _abort(obj.transport)
                closed += 1
        elif issubclass(kind, asyncio.Transport) and obj.is_closing():
            # closed on a loop that ended before it let go of its socket (CI's slow pass:
            # a killed master's, collected in the next module's test); what its __del__
            # would do, without the warning. The peer is the one the transport kept when
            # it connected: a socket whose peer was killed has none any more.
            sock = getattr(obj, "_sock", None)
            loop = getattr(obj, "_loop", None)
            ended = loop is not None and loop.is_closed()
            peer = obj.get_extra_info("peername")
            ours = bool(peer) and isinstance(peer, tuple) and peer[1] in _CLUSTER_PORTS
            if sock is not None and (ended or ours):
                obj._sock = None
                sock.close()
                closed += 1
        elif kind is socket.socket and obj.fileno() != -1 and _peer_port(obj) in _CLUSTER_PORTS:
            obj.close()  # a bare socket left so
            closed += 1
    return closed


def _peer_port(sock: socket.socket) -> int | None:
    try:
        return int(sock.getpeername()[1])
    except (OSError, IndexError, TypeError, ValueError):
        return None


def _abort(transport: asyncio.BaseTransport) -> None:
    if isinstance(transport, asyncio.WriteTransport):
        try:
            transport.abort()
        except RuntimeError:  # its event loop is already closed: the socket goes with it
            pass
