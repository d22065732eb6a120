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
            await slots.outside(hangs(), timeout=slots.PATIENCE + 0.1)
        assert cancelled.is_set()  # the call itself was cancelled
        assert s.free == 0  # held again: the step goes on to record the timeout
    assert s.free == 1


async def test_the_deadline_bounds_the_call_not_the_wait_for_the_slot() -> None:
    """A review's finding: a provider that answered in time, its step then waiting past
    the deadline for a slot other steps held, was turned into a timeout (an unknown
    outcome, the provider asked again)."""
    s = StepSlots(1)
    calls = 0

    async def provider() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(slots.PATIENCE + 0.2)
        return "charged"

    async def step() -> str:
        async with s.slot():
            return await slots.outside(provider(), timeout=slots.PATIENCE + 0.4)

    async def other() -> None:
        await asyncio.sleep(slots.PATIENCE + 0.05)
        async with s.slot():  # held well past the first step's deadline
            await asyncio.sleep(1.0)

    answer, _ = await asyncio.gather(step(), other())
    assert (answer, calls) == ("charged", 1)
    assert s.free == 1


async def test_a_task_started_during_a_step_does_not_use_its_slot() -> None:
    """A review's finding: a task a step starts copies its context; it let go of (and
    took back) the step's slot, after the step had ended too: slots over-released or
    lost for good."""
    s = StepSlots(2)
    child_done = asyncio.Event()
    seen: list[int] = []

    async def slow() -> None:
        await asyncio.sleep(slots.PATIENCE + 0.1)

    async def child() -> None:
        await slots.outside(slow())  # while its parent holds the slot
        seen.append(s.free)
        await asyncio.sleep(0.05)  # ... and after its parent's block ended
        await slots.outside(slow())
        child_done.set()

    async with s.slot():
        spawned = asyncio.create_task(child())
        await asyncio.sleep(slots.PATIENCE + 0.05)
        assert s.free == 1  # the child waits without touching the parent's slot
        await asyncio.sleep(0.2)  # the child's first wait is over
    await child_done.wait()
    await spawned
    assert seen == [1]
    assert s.free == 2


async def test_a_cancelled_caller_waits_for_its_call_to_end() -> None:
    s = StepSlots(1)
    ended = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0.05)  # a provider call winding down
            ended.set()

    async def continuation() -> None:
        async with s.slot():
            await slots.outside(slow_to_stop())

    for moment in (0.01, slots.PATIENCE + 0.05):  # holding the slot; having let it go
        ended.clear()
        task = asyncio.create_task(continuation())
        await asyncio.sleep(moment)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ended.is_set()
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


async def test_nested_slots_hold_both_bounds_and_let_both_go() -> None:
    # An adopted run's continuation: one of four adoption slots, then the one step slot.
    steps = StepSlots(1)
    adopted = StepSlots(4, within=steps)
    inside, most = 0, 0
    free_while_waiting: list[tuple[int, int]] = []

    async def work(slow: bool) -> None:
        nonlocal inside, most
        async with adopted.slot():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1
            if slow:

                async def call() -> None:
                    await asyncio.sleep(slots.PATIENCE + 0.1)
                    free_while_waiting.append((steps.free, adopted.free))

                await slots.outside(call())

    await asyncio.gather(work(True), *(work(False) for _ in range(5)))
    assert most == 1  # the outer bound holds every nested slot
    assert steps.most_taken == 1 and adopted.most_taken <= 4
    assert free_while_waiting == [(1, 4)]  # both let go while the call waited
    assert (steps.free, adopted.free) == (1, 4)


async def test_a_nested_slot_cancelled_while_taken_back_holds_nothing() -> None:
    steps = StepSlots(1)
    adopted = StepSlots(2, within=steps)
    started = asyncio.Event()

    async def waiter() -> None:
        async with adopted.slot():

            async def call() -> None:
                started.set()
                await asyncio.sleep(slots.PATIENCE + 0.05)

            await slots.outside(call())

    async def hog() -> None:  # holds the step slot while the waiter wants it back
        await started.wait()
        await asyncio.sleep(slots.PATIENCE + 0.01)
        async with steps.slot():
            await asyncio.sleep(0.3)

    task = asyncio.create_task(waiter())
    other = asyncio.create_task(hog())
    await asyncio.sleep(slots.PATIENCE + 0.2)  # the waiter holds its adoption slot again,
    task.cancel()  # and waits for the step slot
    with pytest.raises(asyncio.CancelledError):
        await task
    await other
    assert (steps.free, adopted.free) == (1, 2)
