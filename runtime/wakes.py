"""A worker's continuations of the runs it holds, now or after a wait, and which runs
have one running or scheduled.

Every continuation of a held run goes through :class:`Wakes`: a decision's signal, a
retry after the store did not answer, a hand-over looked at again. The sweep continues
a run of ours that is parked nowhere here only when no continuation of it is running or
scheduled (design note 48): a run whose revalidation is slow, whose retry is waiting
out its backoff, or whose hand-over is backing off is not orphaned, and a second
continuation would only queue for its lock, holding one of the worker's step slots.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import Context
from typing import Any

Spawn = Callable[[Coroutine[Any, Any, Any], Context | None], Any]


class Wakes:
    def __init__(
        self,
        spawn: Spawn,
        wake: Callable[[str, int], Awaitable[None]],
        draining: Callable[[], bool],
    ) -> None:
        self._spawn = spawn
        self._wake = wake
        self._draining = draining
        self._pending: dict[str, int] = {}  # run -> continuations running or scheduled

    def pending(self, run_id: str) -> bool:
        """A continuation of this run is running or scheduled here."""
        return run_id in self._pending

    def begin(self, run_id: str) -> None:
        """A continuation of the run is due (:meth:`end` once it is over)."""
        self._pending[run_id] = self._pending.get(run_id, 0) + 1

    def end(self, run_id: str) -> None:
        left = self._pending.get(run_id, 0) - 1
        if left > 0:
            self._pending[run_id] = left
        else:
            self._pending.pop(run_id, None)

    def now(self, run_id: str, attempt: int = 0, context: Context | None = None) -> None:
        """Continue the run at once (a decision's signal: even while draining, the steps
        in flight get their grace)."""
        self.begin(run_id)
        self._spawn(self._run(run_id, attempt), context)

    def later(self, run_id: str, attempt: int, delay: float = 0.0) -> None:
        """Continue the run after ``delay`` seconds (none once the worker is draining: its
        runs are released for another worker)."""
        if self._draining():
            return
        if delay <= 0:
            self.now(run_id, attempt)
            return
        self.begin(run_id)

        def fire() -> None:
            if self._draining():
                self.end(run_id)
            else:
                self._spawn(self._run(run_id, attempt), None)

        asyncio.get_running_loop().call_later(delay, fire)

    async def _run(self, run_id: str, attempt: int) -> None:
        try:
            await self._wake(run_id, attempt)
        finally:
            self.end(run_id)
