"""A worker's step slots: how many continuations work in this process and the store at
once (``SIGNOFF_STEPS_IN_FLIGHT``). A continuation holds its slot while it works, and
lets it go while it waits on something slow elsewhere (the model's reply, seconds with a
hosted model; a provider's revalidation or execution), then takes one back before it
goes on (design note 56). What answers within ``PATIENCE`` (the offline model, a local
provider) is waited for holding the slot: letting go would only queue the step behind
newer ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")

PATIENCE = 0.1  # seconds a call is waited for holding the slot before it is let go


class _Held:
    """One continuation's slot; ``holding`` False while it is let go."""

    __slots__ = ("holding", "sem")

    def __init__(self, sem: asyncio.Semaphore) -> None:
        self.sem = sem
        self.holding = True


_current: ContextVar[_Held | None] = ContextVar("signoff_step_slot", default=None)


class StepSlots:
    def __init__(self, size: int) -> None:
        self._sem = asyncio.Semaphore(max(size, 1))
        self.size = max(size, 1)

    @property
    def free(self) -> int:
        return self._sem._value  # diagnostics and tests only

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot for the block (the continuation's task and what it awaits)."""
        await self._sem.acquire()
        held = _Held(self._sem)
        token = _current.set(held)
        try:
            yield
        finally:
            _current.reset(token)
            if held.holding:
                self._sem.release()


async def outside(call: Awaitable[T]) -> T:
    """Await ``call``; past ``PATIENCE``, without the caller's slot, taken back however
    ``call`` ends (a deadline's cancellation included: the step goes on to record it).
    Outside a slot (a first turn, a test) it is a plain await."""
    held = _current.get()
    if held is None or not held.holding:
        return await call
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=PATIENCE)
    except BaseException:
        task.cancel()
        raise
    if done:
        return task.result()
    held.holding = False
    held.sem.release()
    try:
        return await task  # a cancellation of the caller cancels the call too
    finally:
        await held.sem.acquire()  # cancelled again here: not held, and not released
        held.holding = True
