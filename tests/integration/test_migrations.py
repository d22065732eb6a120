"""Replaying every migration yields exactly the canonical schema (store/schema.sql)."""

from __future__ import annotations

import asyncio
from importlib import resources

import pytest

from signoff.store.postgres import PostgresStore
from tests import pgbouncer
from tests.conftest import drop_database, fresh_database

CATALOG = """
SELECT 'column' AS what, table_name || '.' || column_name || ' ' || data_type || ' '
       || is_nullable || ' ' || coalesce(column_default, '') AS item
FROM information_schema.columns WHERE table_schema = 'public'
  AND table_name <> 'signoff_migrations'
UNION ALL
SELECT 'index', indexdef FROM pg_indexes WHERE schemaname = 'public'
  AND tablename <> 'signoff_migrations'
UNION ALL
SELECT 'constraint', conrelid::regclass::text || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace
  AND conrelid::regclass::text <> 'signoff_migrations'
UNION ALL
SELECT 'function', pg_get_functiondef(oid) FROM pg_proc
WHERE pronamespace = 'public'::regnamespace
UNION ALL
SELECT 'trigger', pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal
ORDER BY 1, 2
"""


async def describe(url: str) -> list[tuple[str, str]]:
    conn = await pgbouncer.connect(url)
    try:
        return [(r["what"], r["item"]) for r in await conn.fetch(CATALOG)]
    finally:
        await conn.close()


async def replay(url: str) -> list[str]:
    store = await PostgresStore.connect(url)
    try:
        first = await store.migrate()
        again = await store.migrate()
        assert again == []  # idempotent
        return first
    finally:
        await store.close()


async def load_canonical(url: str) -> None:
    conn = await pgbouncer.connect(url)
    try:
        await conn.execute(resources.files("signoff.store").joinpath("schema.sql").read_text())
    finally:
        await conn.close()


def test_migrations_equal_canonical_schema() -> None:
    migrated_url, migrated = fresh_database("so_mig")
    canonical_url, canonical = fresh_database("so_can")
    try:
        applied = asyncio.run(replay(migrated_url))
        assert applied[0] == "0001_init"
        asyncio.run(load_canonical(canonical_url))
        got, want = asyncio.run(describe(migrated_url)), asyncio.run(describe(canonical_url))
        assert len(want) > 50
        assert got == want
    finally:
        drop_database(migrated)
        drop_database(canonical)


def test_schema_difference_is_detected() -> None:
    """The comparison is not vacuous: one extra column shows up."""
    url, name = fresh_database("so_mig")
    try:
        asyncio.run(replay(url))
        before = asyncio.run(describe(url))

        async def alter() -> None:
            conn = await pgbouncer.connect(url)
            await conn.execute("ALTER TABLE cards ADD COLUMN sneaky int")
            await conn.close()

        asyncio.run(alter())
        assert asyncio.run(describe(url)) != before
    finally:
        drop_database(name)


@pytest.mark.parametrize("version", ["0001_init"])
def test_migration_files_are_packaged(version: str) -> None:
    assert resources.files("signoff.store.migrations").joinpath(f"{version}.sql").is_file()


def test_a_database_migrated_by_a_newer_version_is_said_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The operator probe's #12: after a rollback, a database carrying a migration this
    version does not know was "up to date" and every process started without a word."""
    url, name = fresh_database("so_mig")
    try:
        asyncio.run(replay(url))

        async def from_the_future() -> list[str]:
            conn = await pgbouncer.connect(url)
            await conn.execute("INSERT INTO signoff_migrations (version) VALUES ('9999_next')")
            await conn.close()
            store = await PostgresStore.connect(url)
            try:
                return await store.migrate()
            finally:
                await store.close()

        with caplog.at_level("WARNING", logger="signoff.store"):
            assert asyncio.run(from_the_future()) == []
        assert "9999_next" in caplog.text and "newer version" in caplog.text
    finally:
        drop_database(name)


def test_a_migration_blocked_by_an_open_transaction_fails_the_start_and_applies_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review's finding: a migration's ACCESS EXCLUSIVE request queued behind an open
    transaction on its table (a stuck session, a psql left open) for up to an hour, and
    every query the live processes made on that table queued behind it. It gives up
    after ``MIGRATION_LOCK_TIMEOUT``, typed, and applies nothing; once the transaction
    ends, the next start applies it."""
    from signoff.runtime.errors import Unavailable
    from signoff.store import schema

    monkeypatch.setattr(schema, "MIGRATION_LOCK_TIMEOUT", "300ms")
    url, name = fresh_database("so_mig")
    try:
        asyncio.run(replay(url))

        async def blocked() -> None:
            setup = await pgbouncer.connect(url)
            await setup.execute("ALTER TABLE app_processes DROP COLUMN bus")
            await setup.execute("DELETE FROM signoff_migrations WHERE version LIKE '0013%'")
            await setup.close()
            holder = await pgbouncer.connect(url)
            tx = holder.transaction()
            await tx.start()
            await holder.fetch("SELECT * FROM app_processes")  # an open reader
            store = await PostgresStore.connect(url)
            try:
                with pytest.raises(Unavailable, match=r"0013.*pg_stat_activity"):
                    await asyncio.wait_for(store.migrate(), 10)
                columns = await store.db.fetch(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name = 'app_processes' AND column_name = 'bus'"
                )
                assert columns == []  # nothing applied
                await tx.rollback()
                assert [v[:4] for v in await store.migrate()] == ["0013"]
            finally:
                await store.close()
                await holder.close()

        asyncio.run(blocked())
    finally:
        drop_database(name)


def test_a_migration_changed_after_it_was_applied_refuses_the_start() -> None:
    """An operator probe: a migration file changed after a database had applied it (the
    same name, other columns) was "up to date"; the worker then failed every run it held
    on a missing column, and the approved cards were invalidated. Each migration's
    checksum is kept as applied: a difference refuses the start, typed, nothing done.
    Checksums a version that kept none left out are filled in, without a word."""
    from signoff.runtime.errors import ConfigError

    url, name = fresh_database("so_mig")
    try:
        asyncio.run(replay(url))

        async def checks() -> None:
            conn = await pgbouncer.connect(url)
            try:
                sums = await conn.fetch("SELECT version, checksum FROM signoff_migrations")
                assert sums and all(len(r["checksum"] or "") == 64 for r in sums)
                # applied by an older signoff, which kept no checksum: filled in
                await conn.execute("UPDATE signoff_migrations SET checksum = NULL")
                store = await PostgresStore.connect(url)
                try:
                    assert await store.migrate() == []
                finally:
                    await store.close()
                after = await conn.fetch("SELECT version, checksum FROM signoff_migrations")
                assert sorted(map(tuple, after)) == sorted(map(tuple, sums))
                # the file now differs from what this database applied
                await conn.execute(
                    "UPDATE signoff_migrations SET checksum = 'x' WHERE version = '0015_begin_fence'"
                )
                store = await PostgresStore.connect(url)
                try:
                    with pytest.raises(ConfigError, match="0015_begin_fence differs"):
                        await store.migrate()
                finally:
                    await store.close()
            finally:
                await conn.close()

        asyncio.run(checks())
    finally:
        drop_database(name)
