"""Parked runs: one plain future per waiting card, keyed by card id.

No task or task group is kept per wait, and nothing else is allocated per wait
but the future, three dict entries and, with a deadline, one ``(deadline, run_id)``
tuple: each future's done callback is the same bound method (its result is the
card id, so no closure is needed) run in one shared context instead of a copy per
card; a run's cards are its one card id, or a tuple of them; deadlines sit on one
heap drained by a single loop timer armed for the earliest one (replaced or
dropped deadlines are skipped when they come up, and the heap is rebuilt once
most of it is stale). ~0.6 KB per parked run at 100k (tracemalloc), its two ids included.

When a card's future resolves (a decision arrived on the fast path, the slow
poll found it decided) or its run's deadline passes, ``on_ready(run_id)`` is
called and the worker re-reads Postgres to decide what happens next: the registry
is only a trigger, never the truth.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
from collections.abc import Callable, Iterable

from signoff.runtime.spans import WakeTimer

# The heap is rebuilt when it holds more than twice the live deadlines plus this.
_STALE_SLACK = 64


class WaitRegistry:
    def __init__(self, on_ready: Callable[[str], None]) -> None:
        self._on_ready = on_ready
        self._futures: dict[str, asyncio.Future[str]] = {}  # card -> future (result: card id)
        self._card_run: dict[str, str] = {}  # card -> run
        # run -> its card id, or a tuple of them; may still name cards since resolved
        self._runs: dict[str, str | tuple[str, ...]] = {}
        self._deadlines: dict[str, float] = {}  # run -> loop time that wakes it
        self._heap: list[tuple[float, str]] = []  # (deadline, run), stale entries included
        self._timer: asyncio.TimerHandle | None = None
        self._context = contextvars.Context()  # done callbacks run here, one for all cards
        self.woken = WakeTimer()  # how and when each run was woken (runtime/spans.py)

    def __len__(self) -> int:
        return len(self._runs)

    def parked_runs(self) -> list[str]:
        return list(self._runs)

    def parked_cards(self) -> list[str]:
        return list(self._futures)

    def cards_of(self, run_id: str) -> list[str]:
        """The cards this run waits on here."""
        return self._held(run_id)

    def is_parked(self, card_id: str) -> bool:
        return card_id in self._futures

    def park(self, run_id: str, card_ids: Iterable[str], deadline: float | None = None) -> None:
        """Wait on these cards for this run; ``deadline`` is a loop time that wakes the run.

        Parking a run again adds its new cards and replaces its deadline (None: no deadline).
        """
        loop = asyncio.get_running_loop()
        cards = self._held(run_id)
        for card_id in card_ids:
            if card_id in self._futures:
                continue
            fut: asyncio.Future[str] = loop.create_future()
            fut.add_done_callback(self._done, context=self._context)
            self._futures[card_id] = fut
            self._card_run[card_id] = run_id
            cards.append(card_id)
        self._runs[run_id] = cards[0] if len(cards) == 1 else tuple(cards)
        self._forget_deadline(run_id)
        if deadline is not None:
            self._deadlines[run_id] = deadline
            heapq.heappush(self._heap, (deadline, run_id))
            self._arm(loop)

    def run_of(self, card_id: str) -> str | None:
        """The run parked on this card, if any."""
        return self._card_run.get(card_id)

    def resolve(self, card_id: str, status: str = "", path: str = "signal") -> bool:
        """The fast path: a decision for a parked card. False if nothing here waits on it.

        ``status`` is not kept: the woken run re-reads its cards from Postgres. ``path``
        names how the decision was learnt, for the run's wake span (:attr:`woken`).
        """
        fut = self._futures.get(card_id)
        if fut is None or fut.done():
            return False
        fut.set_result(card_id)
        self.woken.woke(self._card_run.get(card_id), path)
        return True

    def wake_run(self, run_id: str, path: str) -> bool:
        """Wake a run parked here on other cards than the one decided (a card an edit
        proposed, whose signal was lost: the run never parked on it). False if the run
        is not parked here."""
        for card_id in self._held(run_id):
            return self.resolve(card_id, "", path)
        return False

    def drop_run(self, run_id: str) -> None:
        """Forget a run (superseded, finished, handed over) without waking it."""
        held = self._runs.pop(run_id, None)
        if held is None:
            return
        self._forget_deadline(run_id)
        for card_id in self._held(run_id, held):
            del self._card_run[card_id]
            self._cancel(self._futures.pop(card_id))

    def drop_all(self) -> list[str]:
        runs = list(self._runs)
        for fut in self._futures.values():
            self._cancel(fut)
        self._futures.clear()
        self._card_run.clear()
        self._runs.clear()
        self._deadlines.clear()
        self._heap.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return runs

    # -- internals ---------------------------------------------------------------------

    def _held(self, run_id: str, held: str | tuple[str, ...] | None = None) -> list[str]:
        """The run's cards still waiting here (``held``: its entry, if already popped)."""
        if held is None:
            held = self._runs.get(run_id, ())
        if isinstance(held, str):
            held = (held,)
        return [c for c in held if self._card_run.get(c) == run_id]

    def _cancel(self, fut: asyncio.Future[str]) -> None:
        fut.remove_done_callback(self._done)  # no callback scheduled for a dropped wait
        fut.cancel()

    def _done(self, fut: asyncio.Future[str]) -> None:
        if fut.cancelled():
            return
        card_id = fut.result()
        if self._futures.get(card_id) is not fut:
            return  # dropped (and maybe parked again) after it resolved
        del self._futures[card_id]
        self._on_ready(self._card_run.pop(card_id))

    def _forget_deadline(self, run_id: str) -> None:
        if self._deadlines.pop(run_id, None) is None:
            return
        heap = self._heap
        if len(heap) > 2 * len(self._deadlines) + _STALE_SLACK:
            heap[:] = [(d, r) for d, r in heap if self._deadlines.get(r) == d]
            heapq.heapify(heap)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have the one timer fire by the earliest deadline on the heap."""
        if not self._heap:
            return
        when = self._heap[0][0]
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = loop.call_at(when, self._expire, when)

    def _expire(self, when: float) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = max(loop.time(), when)
        heap = self._heap
        try:
            while heap and heap[0][0] <= now:
                deadline, run_id = heapq.heappop(heap)
                if self._deadlines.get(run_id) == deadline:
                    del self._deadlines[run_id]
                    self._on_ready(run_id)
        finally:
            self._arm(loop)
