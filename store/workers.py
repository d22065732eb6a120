"""Workers and their leases (design note 14): a run is held by its holder while that
worker's one row in ``workers`` has a future ``lease_until``; renewing is one row however
many runs it holds, and a lapsed worker's runs are adopted by another."""

from __future__ import annotations

from datetime import datetime

from signoff.runtime.records import Run
from signoff.store import rows
from signoff.store.connector import Connector
from signoff.store.queries import SQL


class Workers:
    def __init__(self, db: Connector) -> None:
        self._db = db

    async def renew_leases(self, holder: str, lease_seconds: float) -> None:
        """Renew this worker's lease: every run it holds stays held (one row)."""
        await self._db.execute(SQL.worker_renew, holder, lease_seconds)

    async def lease_of(self, holder: str) -> tuple[datetime, float] | None:
        """Worker ``holder``'s lease: (when it lapses, seconds until then); None: no row."""
        row = await self._db.fetchrow(SQL.worker_lease, holder)
        return None if row is None else (row["lease_until"], row["left_seconds"])

    async def execution_fence(self, card_id: str, holder: str, lease_seconds: float) -> bool:
        """Renew ``holder``'s lease; whether ``card_id`` is still ``executing``, unflagged,
        in a run it holds or takes back here from an adopter that has not stepped past
        the card (so no other worker nor an operator can have acted on it)."""
        return bool(await self._db.fetchval(SQL.worker_fence, card_id, holder, lease_seconds))

    async def release_runs(self, holder: str) -> None:
        """Hand every run back at once and drop the worker's lease (graceful stop)."""
        await self._db.execute(SQL.run_release, holder)

    async def release_idle(self, holder: str, busy: list[str]) -> list[str]:
        """Hand back at once the ``waiting`` runs ``holder`` holds but the ``busy`` ones
        (a stopping worker: its steps of those are still in flight); the ids released."""
        found = await self._db.fetch(SQL.run_release_idle, holder, busy)
        return [r["id"] for r in found]

    async def adopt_runs(
        self, holder: str, lease_seconds: float, limit: int = 1000, *, own: bool = False
    ) -> list[Run]:
        """Take over active runs nobody holds: released ones and those of workers whose
        lease lapsed (``own``: also those already ours). Renews our lease too."""
        found = await self._db.fetch(SQL.run_adopt, holder, lease_seconds, limit, own)
        return [rows.run(r) for r in found]

    async def forget_workers(self, idle_seconds: float = 3600.0) -> int:
        """Drop the lease rows of workers lapsed for ``idle_seconds`` that hold no run."""
        status = await self._db.execute(SQL.workers_forget, idle_seconds)
        return int(status.split()[-1])
