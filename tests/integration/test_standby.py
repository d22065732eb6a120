"""A read-only primary (a standby, a demoted primary, ``default_transaction_read_only``)
and a Redis replica answering ``-READONLY``: typed retriable errors, nothing written, and
recovery once a writable server answers again — never a wrong answer.

Postgres is reached directly here (not through PgBouncer, which keeps its own server
sessions across a failover until told to ``RECONNECT``; design note 32).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from signoff.demo.provider import Provider
from signoff.gateway.errors import error_body
from signoff.runtime.bus import Job
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.errors import Unavailable
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.metrics_server import worker_ready
from signoff.store.postgres import PostgresStore
from tests import pgbouncer
from tests.conftest import drop_database, fresh_database
from tests.rediscluster import cli, plain_servers

pytestmark = pytest.mark.anyio


class _Idle:
    """A worker that is up and has nothing running, for worker_ready."""

    def __init__(self) -> None:
        self.draining = False
        self.loops: list[asyncio.Task[None]] = []
        self.ticks = SimpleNamespace(tasks=[])


@pytest.fixture
def own_database() -> Iterator[tuple[str, str]]:
    url, name = fresh_database("so_ro")
    yield url, name
    drop_database(name)


async def set_read_only(url: str, name: str, on: bool) -> None:
    admin = await pgbouncer.connect(pgbouncer.direct(url))
    try:
        await admin.execute("SET default_transaction_read_only = off")
        value = "on" if on else "DEFAULT"
        await admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = {value}')
    finally:
        await admin.close()


async def test_a_read_only_primary_gives_unavailable_and_the_store_recovers(
    own_database: tuple[str, str],
) -> None:
    url, name = own_database
    setup = await PostgresStore.connect(url)
    try:
        await setup.migrate()
        kept = await setup.create_thread("demo", "ana")
    finally:
        await setup.close()
    await set_read_only(url, name, True)
    store = await PostgresStore.connect(url, max_size=2)
    try:
        errors = COUNTERS.values.get("signoff_postgres_errors_total", 0)
        with pytest.raises(Unavailable) as raised:
            await store.create_thread("demo", "bob")
        assert "read-only" in str(raised.value)
        # Counted, and told as what it is: the database answers, and takes no writes.
        assert COUNTERS.values.get("signoff_postgres_errors_total", 0) > errors
        assert error_body(raised.value)["message"] == (
            "the database takes no writes right now; try again"
        )
        # Reads still answer, and answer the truth.
        assert (await store.get_thread(kept.id)).owner == "ana"
        # A worker is not ready (/readyz): it answers SELECT 1, yet nothing a step does
        # could be written. A gateway is (every gateway shares this Postgres: reads and
        # the page still work, and a decision answers 503 meanwhile).
        with pytest.raises(Unavailable, match="read-only"):
            await store.ping(writable=True)
        await store.ping()
        assert await worker_ready(_Idle(), store, None) == "postgres unavailable"
        await set_read_only(url, name, False)
        # The sessions that answered read-only were closed, not pooled again.
        await store.ping(writable=True)
        assert await worker_ready(_Idle(), store, None) is None
        # The read-only session was dropped: the next try reaches a writable one.
        made = await store.create_thread("demo", "bob")
        assert (await store.get_thread(made.id)).owner == "bob"
    finally:
        await store.close()
    check = await pgbouncer.connect(pgbouncer.direct(url))
    try:  # exactly one thread of bob's: the refused write left nothing behind
        assert await check.fetchval("SELECT count(*) FROM threads WHERE owner = 'bob'") == 1
    finally:
        await check.close()


async def test_a_redis_replica_answering_readonly_gives_unavailable_then_recovers() -> None:
    keys = Keys("so-ro:")
    with plain_servers(2) as (primary, replica):
        cli(replica, "REPLICAOF", "127.0.0.1", str(primary))
        bus = RedisBus.from_url(f"redis://127.0.0.1:{replica}/0", keys, claim_idle_ms=200)
        try:
            cli(primary, "SET", keys.wait("card-1"), "w-1")
            deadline = asyncio.get_running_loop().time() + 10
            while await bus.wait_holder("card-1") != "w-1":  # a read: the replicated value
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            with pytest.raises(Unavailable):  # the pipelined path (SET)
                await bus.set_wait("card-2", "w-2", 10_000)
            with pytest.raises(Unavailable):  # redis-py's path (SET of a heartbeat)
                await bus.heartbeat("w-1", 10_000)
            with pytest.raises(Unavailable):
                await bus.enqueue(Job(thread_id="t", text="x", user="u", tenant="demo"))
            assert cli(primary, "EXISTS", keys.wait("card-2")).strip() == "0"
            # The replica is promoted (a failover): the same bus writes again.
            cli(replica, "REPLICAOF", "NO", "ONE")
            await bus.set_wait("card-2", "w-2", 10_000)
            assert await bus.wait_holder("card-2") == "w-2"
            await bus.heartbeat("w-1", 10_000)
            assert await bus.alive("w-1")
        finally:
            await bus.close()


async def test_the_demo_provider_asks_again_once_a_read_only_primary_takes_writes(
    own_database: tuple[str, str],
) -> None:
    # The demo's provider keeps a pool of its own. A session opened while the database
    # was read-only stays so after the setting is lifted: each approval that drew one
    # failed for good ("the tool failed (ReadOnlySQLTransactionError)"), a third of them
    # a minute after Postgres took writes again. A read-only refusal is now an unknown
    # outcome (asked again with the same key) and replaces the pool's sessions.
    url, name = own_database
    provider = await Provider.connect(url)
    try:
        await provider.seed("t1")
        customer = await provider.pool.fetchval(
            "SELECT id FROM demo_customers WHERE tenant = 't1' LIMIT 1"
        )
        await set_read_only(url, name, True)
        await provider.pool.expire_connections()
        # Reads still work, and open sessions that are read-only for their whole life.
        await asyncio.gather(*(provider.balance("t1") for _ in range(5)))
        with pytest.raises(ConnectionError):
            await provider.create_charge("k-ro", "t1", customer, 100, "x")
        await asyncio.gather(*(provider.balance("t1") for _ in range(5)))
        await set_read_only(url, name, False)
        refused = 0
        for n in range(10):
            try:
                await provider.create_charge(f"k-{n}", "t1", customer, 100, "x")
            except ConnectionError:
                refused += 1
        assert refused <= 1, refused  # the first may draw a stale session, not the next
        charged = await provider.pool.fetchval("SELECT count(*) FROM demo_charges")
        assert charged == 10 - refused
    finally:
        await provider.close()
