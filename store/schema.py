"""Versioned migrations (``store/migrations/NNNN_name.sql``), applied in order, once each.

``store/schema.sql`` is the canonical schema they must add up to
(``tests/integration/test_migrations.py`` replays them and compares).
"""

from __future__ import annotations

import hashlib
import logging
from importlib import resources

import asyncpg

from signoff.runtime.errors import ConfigError, Unavailable
from signoff.store.connector import Connector
from signoff.store.queries import SQL

log = logging.getLogger("signoff.store")

MIGRATION_TIMEOUT = 3600.0  # a migration may rewrite big tables: not bound by the store timeout
# A table lock a migration waits for longer than this fails the start (typed, nothing
# applied): queued behind an open transaction, its ACCESS EXCLUSIVE request would hold up
# every query the live processes make on that table until it got the lock.
MIGRATION_LOCK_TIMEOUT = "10s"


async def migrate(db: Connector) -> list[str]:
    """Apply pending migrations in order, in one transaction under an advisory lock (two
    processes migrating at once apply each once); return the versions applied now."""
    files = sorted(
        (
            f
            for f in resources.files("signoff.store.migrations").iterdir()
            if f.name.endswith(".sql")
        ),
        key=lambda f: f.name,
    )
    applied_now: list[str] = []
    async with db.tx() as conn:
        await conn.execute(SQL.migrations_lock)
        await conn.execute(SQL.migrations_table)
        await conn.execute(SQL.migrations_checksums)
        sums = {r["version"]: r["checksum"] for r in await conn.fetch(SQL.migrations_applied)}
        done = set(sums)
        texts = {f.name.removesuffix(".sql"): f.read_text() for f in files}
        changed = sorted(
            v for v, s in sums.items() if s is not None and v in texts and s != _sha(texts[v])
        )
        if changed:
            # Its schema is not what this code's SQL expects (an operator probe: a worker
            # on such a database failed every run it held, and its approved cards were
            # invalidated): refused at start, nothing done.
            raise ConfigError(
                f"migration {', '.join(changed)} differs from the one applied to this "
                "database: the database's schema is not the one this version of signoff "
                "expects. Run the version that migrated it, or restore the database"
            )
        for version, checksum in sums.items():
            if checksum is None and version in texts:
                await conn.execute(SQL.migration_checksum_set, version, _sha(texts[version]))
        unknown = sorted(done - {f.name.removesuffix(".sql") for f in files})
        if unknown:
            # A newer signoff migrated this database (a rollback, or an old process of a
            # rolling deploy): said loudly, as nothing here knows what those changed.
            log.warning(
                "the database has migrations this version of signoff does not know (%s): a "
                "newer version migrated it; run that version (rolling back needs a restore "
                "of the database from before those migrations)",
                ", ".join(unknown),
            )
        pending = [f for f in files if f.name.removesuffix(".sql") not in done]
        if pending:
            await conn.execute(SQL.migrations_lock_timeout, MIGRATION_LOCK_TIMEOUT)
        for f in pending:
            version = f.name.removesuffix(".sql")
            try:
                await conn.execute(texts[version], timeout=MIGRATION_TIMEOUT)
            except asyncpg.LockNotAvailableError as exc:
                raise Unavailable(
                    f"migration {version} waited {MIGRATION_LOCK_TIMEOUT} for a lock on a "
                    "table it changes, held by another session (an open transaction: see "
                    "pg_stat_activity); nothing was applied. Start again once it ends"
                ) from exc
            await conn.execute(SQL.migration_record, version, _sha(texts[version]))
            applied_now.append(version)
    return applied_now


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
