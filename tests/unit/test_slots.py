"""A worker's step slots (runtime/slots.py): held while a continuation works, let go while
it waits on something slow, taken back however that ends; never leaked, never doubled."""

from __future__ import annotations

import asyncio

import pytest

from signoff.runtime import slots
from signoff.runtime.slots import StepSlots

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_at_most_size_work_at_once() -> None:
    s, inside, most = StepSlots(2), 0, 0

    async def work() -> None:
        nonlocal inside, most
        async with s.slot():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)  # local work: the slot stays held
            inside -= 1

    await asyncio.gather(*(work() for _ in range(6)))
    assert most == 2
    assert s.free == 2


async def test_a_slow_call_lets_the_slot_go_and_takes_it_back() -> None:
    s = StepSlots(1)
    seen: list[int] = []

    async def slow() -> str:
        await asyncio.sleep(slots.PATIENCE + 0.2)
        seen.append(s.free)  # the slot is free while the call waits
        return "answer"

    async def waiter() -> str:
        async with s.slot():
            answer = await slots.outside(slow())
            seen.append(s.free)  # held again
            return answer

    async def other() -> None:
        await asyncio.sleep(slots.PATIENCE + 0.05)
        async with s.slot():  # gets the slot while the first waits
            seen.append(-1)

    answer, _ = await asyncio.gather(waiter(), other())
    assert answer == "answer"
    assert seen == [-1, 1, 0]
    assert s.free == 1


async def test_a_quick_call_keeps_the_slot() -> None:
    s = StepSlots(1)

    async def quick() -> int:
        return s.free

    async with s.slot():
        assert await slots.outside(quick()) == 0
    assert s.free == 1


async def test_a_failing_slow_call_takes_the_slot_back() -> None:
    s = StepSlots(1)

    async def fails() -> None:
        await asyncio.sleep(slots.PATIENCE + 0.05)
        raise ValueError("provider said no")

    async with s.slot():
        with pytest.raises(ValueError):
            await slots.outside(fails())
        assert s.free == 0
    assert s.free == 1


async def test_a_deadline_on_a_slow_call_takes_the_slot_back() -> None:
    s = StepSlots(1)
    cancelled = asyncio.Event()

    async def hangs() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with s.slot():
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(slots.PATIENCE + 0.1):
                await slots.outside(hangs())
        assert cancelled.is_set()  # the call itself was cancelled
        assert s.free == 0  # held again: the step goes on to record the timeout
    assert s.free == 1


async def test_a_cancelled_continuation_leaks_no_slot() -> None:
    s = StepSlots(2)
    started = asyncio.Event()

    async def hangs() -> None:
        started.set()
        await asyncio.sleep(10)

    async def continuation() -> None:
        async with s.slot():
            await slots.outside(hangs())

    for moment in (0.0, slots.PATIENCE + 0.05):  # holding the slot, then having let it go
        task = asyncio.create_task(continuation())
        await started.wait()
        await asyncio.sleep(moment)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started.clear()
        assert s.free == 2


async def test_cancelled_while_taking_the_slot_back_leaks_none() -> None:
    s = StepSlots(1)
    done = asyncio.Event()

    async def slow() -> None:
        await asyncio.sleep(slots.PATIENCE + 0.05)
        done.set()

    async def continuation() -> None:
        async with s.slot():
            await slots.outside(slow())

    task = asyncio.create_task(continuation())
    await asyncio.sleep(slots.PATIENCE + 0.01)  # it let the slot go
    async with s.slot():  # ... and we hold it while its call ends
        await done.wait()
        await asyncio.sleep(0.01)  # it now waits to take the slot back
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert s.free == 1


async def test_outside_a_slot_is_a_plain_await() -> None:
    async def value() -> int:
        await asyncio.sleep(slots.PATIENCE + 0.01)
        return 7

    assert await slots.outside(value()) == 7
