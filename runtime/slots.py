"""A worker's step slots: how many continuations work in this process and the store at
once (``SIGNOFF_STEPS_IN_FLIGHT``). A continuation holds its slot while it works, and
lets it go while it waits on something slow elsewhere (the model's reply, seconds with a
hosted model; a provider's revalidation or execution), then takes one back before it
goes on (design note 56). What answers within ``PATIENCE`` (the offline model, a local
provider) is waited for holding the slot: letting go would only queue the step behind
newer ones.

A slot belongs to the task that took it: a task started during a step (it copies the
step's context) or the call ``outside`` runs does not let go of it, or take it back. A
call's deadline bounds the call alone, never the wait to take the slot back: a provider
that answered in time is not turned into a timeout by a queue of other steps.

Slots may be nested (``StepSlots(n, within=steps)``: adopted runs' continuations take
one of their own, then a step slot): a slot holds both, lets both go, and takes them
back in the same order, so the outer bound holds every continuation of the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

PATIENCE = 0.1  # seconds a call is waited for holding the slot before it is let go


class _Held:
    """One continuation's slot: its owner task; ``holding`` False while it is let go or
    once the owner's block has ended."""

    __slots__ = ("chain", "holding", "owner")

    def __init__(self, chain: tuple[StepSlots, ...], owner: asyncio.Task[Any] | None) -> None:
        self.chain = chain
        self.owner = owner
        self.holding = True


async def _take(chain: tuple[StepSlots, ...]) -> None:
    """A slot of each, in order; none if cancelled on the way."""
    taken: list[StepSlots] = []
    try:
        for slots in chain:
            await slots._sem.acquire()
            taken.append(slots)
            slots.most_taken = max(slots.most_taken, slots.size - slots._sem._value)
    except BaseException:
        _give(tuple(taken))
        raise


def _give(chain: tuple[StepSlots, ...]) -> None:
    for slots in reversed(chain):
        slots._sem.release()


_current: ContextVar[_Held | None] = ContextVar("signoff_step_slot", default=None)
# When the calling task last took a slot (monotonic ns; 0: never): a step's own time.
_taken_ns: ContextVar[int] = ContextVar("signoff_step_slot_taken", default=0)


def taken_ns() -> int:
    """When this task last took a step slot (``time.monotonic_ns``), 0 if it never did."""
    return _taken_ns.get()


class StepSlots:
    def __init__(self, size: int, within: StepSlots | None = None) -> None:
        self._sem = asyncio.Semaphore(max(size, 1))
        self.size = max(size, 1)
        self._chain: tuple[StepSlots, ...] = (self, *(within._chain if within else ()))
        self.most_taken = 0  # the most slots held at once (diagnostics and tests)

    @property
    def free(self) -> int:
        return self._sem._value  # diagnostics and tests only

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot for the block (the calling task; see :func:`outside`)."""
        await _take(self._chain)
        _taken_ns.set(time.monotonic_ns())
        held = _Held(self._chain, asyncio.current_task())
        token = _current.set(held)
        try:
            yield
        finally:
            _current.reset(token)
            if held.holding:
                held.holding = False  # a task that copied the context finds it closed
                _give(self._chain)
            held.owner = None


Slot = contextlib.AbstractAsyncContextManager[None]


def unbounded() -> Slot:
    """No slot: what a continuation takes where nothing bounds them (no worker)."""
    return contextlib.nullcontext()


async def _within(call: Awaitable[T], timeout: float) -> T:
    async with asyncio.timeout(timeout):
        return await call


async def outside(call: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Await ``call`` (within ``timeout`` seconds: ``TimeoutError``); past ``PATIENCE``,
    without the caller's slot, taken back however ``call`` ends, with no deadline on that
    wait. Outside a slot of its own task (a first turn, a test, a task a step started)
    it is a plain await."""
    if timeout is not None:
        call = _within(call, timeout)
    held = _current.get()
    if held is None or not held.holding or held.owner is not asyncio.current_task():
        return await call
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=PATIENCE)
    except BaseException:
        await _end(task)  # the call is over before its caller unwinds
        raise
    if done:
        return task.result()
    held.holding = False
    _give(held.chain)
    try:
        return await task  # a cancellation of the caller cancels the call, and waits for it
    finally:
        await _take(held.chain)  # cancelled again here: none held, and none released
        held.holding = True


async def _end(task: asyncio.Future[Any]) -> None:
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: an error on the way out is not logged as lost
