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
        self._loops: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}

    def every(self, what: str, seconds: float, step: Step, *, now: bool = False) -> None:
        """Call ``step(tick)`` every ``seconds`` (the first at once with ``now``); the
        loop's task is named ``signoff-<what>``."""
        stopping = asyncio.Event()
        task = asyncio.create_task(
            self._loop(what, seconds, step, now, stopping), name=f"signoff-{what}"
        )
        self._loops[what] = (task, stopping)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return [task for task, _ in self._loops.values()]

    async def stop(self, grace: float, *, keep: tuple[str, ...] = ()) -> None:
        """End every loop but those named in ``keep`` after its current tick; cancel
        what is still ticking after ``grace`` seconds."""
        ending = {what: loop for what, loop in self._loops.items() if what not in keep}
        for what, (_, stopping) in ending.items():
            stopping.set()
            del self._loops[what]
        tasks = [task for task, _ in ending.values()]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=grace)
        for task in late:
            log.warning("%s still ticking after %.1fs; cancelled", task.get_name(), grace)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(
        self, what: str, seconds: float, step: Step, now: bool, stopping: asyncio.Event
    ) -> None:
        # Whatever a tick raises is logged and the loop goes on: a loop that ended would
        # leave the worker alive without its lease (its runs adopted under it), its poll
        # or its sweeps.
        tick = 0
        while not stopping.is_set():
            if tick or not now:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), seconds)
                if stopping.is_set():
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
