"""Which process serves which app (runtime/presence.py, design note 21): gateways and
workers register their app's fingerprint, and a run whose approved card names a tool its
holder does not serve is handed to a worker that does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from signoff.runtime.presence import AppProcess
from signoff.store import rows
from signoff.store.connector import Conn, Connector
from signoff.store.queries import SQL


def _values(p: AppProcess) -> tuple[Any, ...]:
    return (p.id, p.app, p.fingerprint, p.tools, p.roles, p.bus)


class Apps:
    def __init__(self, db: Connector) -> None:
        self._db = db

    async def join_app(
        self,
        process: AppProcess,
        live_seconds: float,
        check: Callable[[list[AppProcess]], None],
    ) -> None:
        """Register ``process`` once ``check`` accepted the other live processes: one
        transaction under a lock every joining process takes, so two processes starting
        at once see each other. Nothing is written when ``check`` raises."""

        async def go(conn: Conn) -> None:
            await conn.execute(SQL.app_join_lock)
            await conn.execute(SQL.app_processes_forget)
            found = await conn.fetch(SQL.app_processes_live, process.id, float(live_seconds))
            check([msgspec.convert(dict(r), AppProcess) for r in found])
            await conn.execute(SQL.app_process_upsert, *_values(process))

        await self._db.transaction(go)

    async def beat_app(self, process: AppProcess) -> None:
        """Renew ``process``'s row (written again if it was forgotten)."""
        await self._db.execute(SQL.app_process_upsert, *_values(process))

    async def installation_id(self) -> str:
        """This database's own random id (migration 0014): the same through any URL."""
        value = await self._db.fetchval(SQL.installation_id)
        return str(value)

    async def leave_app(self, process_id: str) -> None:
        await self._db.execute(SQL.app_process_leave, process_id)

    async def app_processes(self, live_seconds: float) -> list[AppProcess]:
        """The live processes (renewed within ``live_seconds``)."""
        found = await self._db.fetch(SQL.app_processes_live, "", float(live_seconds))
        return [msgspec.convert(dict(r), AppProcess) for r in found]

    async def hand_over_run(
        self, run_id: str, holder: str, tool: str, live_seconds: float, app: str
    ) -> bool:
        """Let go of a run we hold (its holder NULL: adopted by the next worker that looks)
        when another live worker of ``app`` serves ``tool``; False (and the run kept) when
        none does."""
        value = await self._db.fetchval(
            SQL.run_hand_over, rows.uuid_of(run_id), holder, tool, float(live_seconds), app
        )
        return value is not None
