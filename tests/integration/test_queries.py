"""Every named statement of store/queries.sql is valid against the migrated schema."""

from __future__ import annotations

import dataclasses

import asyncpg
import pytest

from signoff.store.queries import SQL, Queries
from tests import pgbouncer

pytestmark = pytest.mark.anyio

NAMES = [f.name for f in dataclasses.fields(Queries)]


async def test_every_statement_prepares(database_url: str) -> None:
    conn = await pgbouncer.connect(database_url)
    try:
        failed = {}
        for name in NAMES:
            try:
                await conn.prepare(getattr(SQL, name))
            except asyncpg.PostgresError as exc:
                failed[name] = str(exc)
    finally:
        await conn.close()
    assert failed == {}
    assert len(NAMES) > 40
