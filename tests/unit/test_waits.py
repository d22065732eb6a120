"""The wait registry: what wakes a parked run, once, and what never does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from signoff.runtime.waits import WaitRegistry

Woken = list[tuple[str, float]]


def run(test: Callable[[WaitRegistry, Woken, asyncio.AbstractEventLoop], Awaitable[None]]) -> None:
    """Run ``test`` on a fresh loop with a registry that records (run, loop time) per wake."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        woken: Woken = []
        waits = WaitRegistry(lambda run_id: woken.append((run_id, loop.time())))
        await test(waits, woken, loop)

    asyncio.run(main())


def runs(woken: Woken) -> list[str]:
    return [run_id for run_id, _ in woken]


async def turn() -> None:
    """Let callbacks scheduled so far run."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_resolve_wakes_the_run_once() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        waits.park("r1", ["c1"])
        assert waits.is_parked("c1") and len(waits) == 1
        assert waits.resolve("c1", "approved")
        assert not waits.resolve("c1", "approved")  # a second signal for the same decision
        await turn()
        assert runs(woken) == ["r1"]
        assert not waits.is_parked("c1") and not waits.resolve("c1")
        assert waits.parked_runs() == ["r1"]  # parked until its owner drops it
        waits.drop_run("r1")
        assert len(waits) == 0 and waits.parked_cards() == []
        await turn()
        assert runs(woken) == ["r1"]

    run(t)


def test_unknown_cards_resolve_to_nothing() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        assert not waits.resolve("nope")
        waits.drop_run("nobody")
        assert waits.drop_all() == []
        await turn()
        assert woken == []

    run(t)


def test_a_multi_card_run_wakes_once_per_card() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        waits.park("r1", ["c1", "c2", "c3"])
        waits.park("r2", ["c4"])
        assert sorted(waits.parked_cards()) == ["c1", "c2", "c3", "c4"]
        assert waits.resolve("c1") and waits.resolve("c3")
        await turn()
        assert runs(woken) == ["r1", "r1"]
        assert sorted(waits.parked_cards()) == ["c2", "c4"]
        waits.drop_run("r1")  # the last card is cancelled, r2 is untouched
        assert waits.parked_cards() == ["c4"] and waits.parked_runs() == ["r2"]
        assert not waits.resolve("c2")
        assert waits.resolve("c4")
        await turn()
        assert runs(woken) == ["r1", "r1", "r2"]

    run(t)


def test_the_deadline_wakes_the_run_once() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        deadline = loop.time() + 0.05
        waits.park("r1", ["c1"], deadline)
        await asyncio.sleep(0.2)
        assert runs(woken) == ["r1"] and woken[0][1] >= deadline
        assert waits.is_parked("c1")  # the card still waits: the owner re-reads Postgres
        assert waits.resolve("c1")
        await turn()
        assert runs(woken) == ["r1", "r1"]

    run(t)


def test_deadlines_wake_in_order_each_once() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        offsets = {"r3": 0.09, "r1": 0.03, "r4": 0.03, "r2": 0.06}
        for run_id, offset in offsets.items():
            waits.park(run_id, [f"c-{run_id}"], now + offset)
        await asyncio.sleep(0.25)
        assert sorted(runs(woken)[:2]) == ["r1", "r4"] and runs(woken)[2:] == ["r2", "r3"]
        for run_id, at in woken:
            assert at >= now + offsets[run_id]

    run(t)


def test_parking_again_replaces_the_deadline() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        waits.park("later", ["c1"], now + 0.02)
        waits.park("later", ["c1"], now + 0.15)  # pushed back
        waits.park("sooner", ["c2"], now + 0.5)
        waits.park("sooner", ["c2"], now + 0.05)  # brought forward: the timer is re-armed
        waits.park("none", ["c3"], now + 0.03)
        waits.park("none", ["c3"])  # no deadline any more
        await asyncio.sleep(0.7)
        assert runs(woken) == ["sooner", "later"]
        assert 0.05 <= woken[0][1] - now < 0.45
        assert woken[1][1] >= now + 0.15

    run(t)


def test_an_earlier_deadline_parked_later_is_not_held_up() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        waits.park("slow", ["c1"], now + 0.6)
        waits.park("fast", ["c2"], now + 0.03)
        await asyncio.sleep(0.3)
        assert runs(woken) == ["fast"] and woken[0][1] >= now + 0.03

    run(t)


def test_parking_again_adds_cards_and_keeps_the_old_ones() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        waits.park("r1", ["c1"])
        waits.park("r1", ["c1", "c2"])  # c1 is not parked twice
        assert sorted(waits.parked_cards()) == ["c1", "c2"] and len(waits) == 1
        assert waits.resolve("c2")
        await turn()
        waits.park("r1", ["c3"])  # after a wake the run waits on what is left plus the new
        assert sorted(waits.parked_cards()) == ["c1", "c3"]
        waits.drop_run("r1")
        assert waits.parked_cards() == [] and not waits.resolve("c1")
        await turn()
        assert runs(woken) == ["r1"]

    run(t)


def test_a_card_parked_by_another_run_stays_with_it() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        waits.park("r1", ["c1"])
        waits.park("r2", ["c1", "c2"])
        waits.drop_run("r2")
        assert waits.parked_cards() == ["c1"]
        assert waits.resolve("c1")
        await turn()
        assert runs(woken) == ["r1"]

    run(t)


def test_a_resolved_card_parked_again_by_another_run_belongs_to_it() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        waits.park("r1", ["c1"])
        assert waits.resolve("c1")
        await turn()
        waits.park("r2", ["c1"])
        waits.drop_run("r1")  # must not take r2's wait with it
        assert waits.parked_cards() == ["c1"]
        assert waits.resolve("c1")
        await turn()
        assert runs(woken) == ["r1", "r2"]

    run(t)


def test_a_stale_resolution_does_not_touch_the_next_wait_on_the_card() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        waits.park("r1", ["c1"])
        assert waits.resolve("c1")
        waits.drop_run("r1")  # before r1's wake was delivered
        waits.park("r2", ["c1"])
        await turn()
        assert woken == [] and waits.parked_cards() == ["c1"]
        assert waits.resolve("c1")
        await turn()
        assert runs(woken) == ["r2"]

    run(t)


def test_drop_run_cancels_without_waking() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        waits.park("r1", ["c1", "c2"], loop.time() + 0.03)
        waits.park("r2", ["c3"], loop.time() + 0.03)
        assert waits.resolve("c1")
        waits.drop_run("r1")  # resolved, its wake not delivered yet: it never is
        assert not waits.resolve("c2")
        await asyncio.sleep(0.15)
        assert runs(woken) == ["r2"]
        assert waits.parked_runs() == ["r2"] and waits.parked_cards() == ["c3"]

    run(t)


def test_drop_all_forgets_everything_and_the_registry_stays_usable() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        for i in range(5):
            waits.park(f"r{i}", [f"c{i}", f"d{i}"], loop.time() + 0.03)
        assert waits.resolve("c0")
        assert sorted(waits.drop_all()) == [f"r{i}" for i in range(5)]
        assert len(waits) == 0 and waits.parked_cards() == [] and not waits.resolve("d1")
        await asyncio.sleep(0.1)
        assert woken == []
        waits.park("again", ["c9"], loop.time() + 0.02)
        await asyncio.sleep(0.1)
        assert runs(woken) == ["again"]

    run(t)


def test_many_dropped_deadlines_never_wake_and_the_rest_do() -> None:
    async def t(waits: WaitRegistry, woken: Woken, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for i in range(2000):
            waits.park(f"r{i}", [f"c{i}"], now + 0.05 + i * 0.00005)
        for i in range(2000):
            if i % 10:
                waits.drop_run(f"r{i}")  # most go: stale deadlines are rebuilt away
        for i in range(0, 2000, 20):
            waits.park(f"r{i}", [f"c{i}"], now + 0.3)  # half the rest move later
        await asyncio.sleep(0.6)
        expected = [f"r{i}" for i in range(10, 2000, 20)] + [f"r{i}" for i in range(0, 2000, 20)]
        assert sorted(runs(woken)) == sorted(expected)
        assert runs(woken)[:100] == [f"r{i}" for i in range(10, 2000, 20)]  # deadline order
        assert all(at >= now + 0.3 for _, at in woken[100:])

    run(t)


def test_a_failing_wake_does_not_stop_the_other_deadlines() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        woken: list[str] = []

        def on_ready(run_id: str) -> None:
            woken.append(run_id)
            if run_id == "bad":
                raise RuntimeError("boom")

        waits = WaitRegistry(on_ready)
        now = loop.time()
        waits.park("bad", ["c1"], now + 0.02)
        waits.park("good", ["c2"], now + 0.02)
        waits.park("later", ["c3"], now + 0.06)
        await asyncio.sleep(0.2)
        assert sorted(woken) == ["bad", "good", "later"] and woken[-1] == "later"
        assert len(errors) == 1 and isinstance(errors[0]["exception"], RuntimeError)

    asyncio.run(main())
