"""What runs on a timer reads indexes, not tables, however big the tables grow.

Every worker sweeps every ``sweep_seconds`` (2 s), renews its lease, polls; every
gateway with WhatsApp on polls its outbound entries every 0.3 s; retention runs hourly in
batches. A statement of those that reads a whole table costs a little on a fresh
database and more every day after (the cards, messages and threads are the audit trail
and are kept by default). This module builds a database of 20,000 threads, each with a
run, a card, five log entries, a WhatsApp contact and a workflow run, all finished (the
idle state a timer mostly sees), with a handful still pending, approved, executing,
waiting, open, then runs each periodic statement as a long-lived process does after
its fifth call (a generic plan), under ``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction
that is rolled back, and asserts that it scans no big table and touches a bounded
number of pages. A statement whose index went missing (or never existed:
``cards_stuck_executing`` before migration 0011 read all 20,000 cards, 70 ms at 200k)
or that walks every row of a table through an index (``wa_outbound_claim`` before
migration 0012 probed the log of every WhatsApp contact on every poll, 0.8 s at 200k)
fails here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from tests import bigdb
from tests.conftest import migrated_database

pytestmark = pytest.mark.anyio

N = 20_000


@pytest.fixture(scope="module")
def big_database() -> Iterator[str]:
    """Direct to Postgres: the plans are read with session settings (generic plans)."""

    async def populate(url: str) -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(bigdb.populate_sql(N))
            await conn.execute("VACUUM ANALYZE")
        finally:
            await conn.close()

    for url in migrated_database("so_plans", pooled=False):
        asyncio.run(populate(url))
        yield url


@pytest.fixture
async def conn(big_database: str) -> AsyncIterator[asyncpg.Connection]:
    c = await bigdb.connect(big_database)
    try:
        yield c
    finally:
        await c.close()


@pytest.mark.parametrize("name", sorted(bigdb.PERIODIC))
async def test_a_periodic_statement_reads_no_whole_table(
    conn: asyncpg.Connection, name: str
) -> None:
    plan = (await bigdb.explain(conn, name, bigdb.PERIODIC[name]))["Plan"]
    assert bigdb.scans(plan) == [], f"{name} reads {bigdb.scans(plan)} whole"
    pages = bigdb.pages(plan)
    assert pages <= bigdb.PAGE_BUDGET, f"{name} touched {pages} pages in the idle state"


@pytest.mark.parametrize("name", sorted(bigdb.PERIODIC))
async def test_a_periodic_statement_is_not_compiled_by_jit(
    conn: asyncpg.Connection, name: str
) -> None:
    """Scaled to this database's size: a generic plan that would pass jit_above_cost at
    200k threads passes a tenth of it here (retention_pick did, 19 ms of JIT per batch)."""
    await conn.execute(f"SET jit_above_cost = {bigdb.JIT_ABOVE_COST_AT_20K}")
    top = await bigdb.explain(conn, name, bigdb.PERIODIC[name])
    assert "JIT" not in top, f"{name} costs {top['Plan']['Total Cost']}: compiled by JIT"


async def test_the_check_catches_a_statement_that_reads_a_whole_table(
    conn: asyncpg.Connection,
) -> None:
    """The check itself: a statement that walks every card fails both assertions."""
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute("PREPARE probe AS SELECT count(*) FROM cards WHERE owner = $1")
        out = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe('u1')")
    finally:
        await tx.rollback()
        await conn.execute("DEALLOCATE ALL")
    plan = json.loads(out)[0]["Plan"]
    assert bigdb.scans(plan) == ["cards"]
    assert bigdb.pages(plan) > bigdb.PAGE_BUDGET
