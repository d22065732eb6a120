"""A worker's periodic loops (lease, slow poll, sweep, workflows): each tick runs whole.

Stopping ends a loop between two ticks, not in the middle of one: a task cancelled while
asyncpg waits on a statement sends Postgres (or PgBouncer) a cancel request on a new
connection, and the pool closes right after. Behind PgBouncer 1.18-1.19 two such cancels in
flight at once can abort PgBouncer itself ("disconnect_client(): bad client state"), taking
every other process's connections with it; a tick that finishes needs no cancel. A tick
still running after the grace period is cancelled all the same (a stalled Postgres must not
hold a stopping worker forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from signoff.runtime.errors import SignoffError
from signoff.runtime.metrics import COUNTERS

log = logging.getLogger("signoff.worker")

Step = Callable[[int], Awaitable[object]]


class Ticks:
    """Periodic loops that log a failed tick and go on, and stop between ticks."""

    def __init__(self) -> None:
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def every(self, what: str, seconds: float, step: Step, *, now: bool = False) -> None:
        """Call ``step(tick)`` every ``seconds`` (the first at once with ``now``); the
        loop's task is named ``signoff-<what>``."""
        task = asyncio.create_task(self._loop(what, seconds, step, now), name=f"signoff-{what}")
        self._tasks.append(task)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    async def pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until stopping; True when stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return self.stopping

    async def stop(self, grace: float) -> None:
        """End every loop after its current tick; cancel what is still ticking after
        ``grace`` seconds."""
        self._stopping.set()
        tasks, self._tasks = self._tasks, []
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=grace)
        for task in late:
            log.warning("%s still ticking after %.1fs; cancelled", task.get_name(), grace)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, what: str, seconds: float, step: Step, now: bool) -> None:
        # Whatever a tick raises is logged and the loop goes on: a loop that ended would
        # leave the worker alive without its lease (its runs adopted under it), its poll
        # or its sweeps.
        tick = 0
        while not self.stopping:
            if (tick or not now) and await self.pause(seconds):
                return
            tick += 1
            try:
                await step(tick)
            except asyncio.CancelledError:
                raise
            except SignoffError as exc:
                log.warning("%s failed: %s", what, exc)
            except Exception:
                COUNTERS.inc("signoff_handler_errors_total")
                log.exception("%s failed; trying again at the next tick", what)
