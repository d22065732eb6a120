"""Versioned migrations (``store/migrations/NNNN_name.sql``), applied in order, once each.

``store/schema.sql`` is the canonical schema they must add up to
(``tests/integration/test_migrations.py`` replays them and compares).
"""

from __future__ import annotations

from importlib import resources

from signoff.store.connector import Connector
from signoff.store.queries import SQL

MIGRATION_TIMEOUT = 3600.0  # a migration may rewrite big tables: not bound by the store timeout


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
        done = {r["version"] for r in await conn.fetch(SQL.migrations_applied)}
        for f in files:
            version = f.name.removesuffix(".sql")
            if version in done:
                continue
            await conn.execute(f.read_text(), timeout=MIGRATION_TIMEOUT)
            await conn.execute(SQL.migration_record, version)
            applied_now.append(version)
    return applied_now
