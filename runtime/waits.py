"""Parked runs: one plain future per waiting card, keyed by card id.

A future in a dict costs ~0.2 KB; no task or task group is kept per wait.
When a card's future resolves (a decision arrived on the fast path, the slow
poll found it decided, or its deadline passed), ``on_ready(run_id)`` is called
and the owner re-reads Postgres to decide what happens next: the registry is
only a trigger, never the truth.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable


class WaitRegistry:
    def __init__(self, on_ready: Callable[[str], None]) -> None:
        self._on_ready = on_ready
        self._futures: dict[str, asyncio.Future[str]] = {}
        self._card_run: dict[str, str] = {}
        self._runs: dict[str, set[str]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def parked_runs(self) -> list[str]:
        return list(self._runs)

    def parked_cards(self) -> list[str]:
        return list(self._futures)

    def is_parked(self, card_id: str) -> bool:
        return card_id in self._futures

    def park(self, run_id: str, card_ids: Iterable[str], deadline: float | None = None) -> None:
        """Wait on these cards for this run; ``deadline`` is a loop time that wakes the run."""
        loop = asyncio.get_running_loop()
        cards = self._runs.setdefault(run_id, set())
        for card_id in card_ids:
            if card_id in self._futures:
                continue
            fut: asyncio.Future[str] = loop.create_future()
            fut.add_done_callback(self._done_callback(card_id))
            self._futures[card_id] = fut
            self._card_run[card_id] = run_id
            cards.add(card_id)
        old = self._timers.pop(run_id, None)
        if old is not None:
            old.cancel()
        if deadline is not None:
            self._timers[run_id] = loop.call_at(deadline, self._wake, run_id)

    def _done_callback(self, card_id: str) -> Callable[[asyncio.Future[str]], None]:
        def done(fut: asyncio.Future[str]) -> None:
            if fut.cancelled():
                return
            run_id = self._card_run.pop(card_id, None)
            self._futures.pop(card_id, None)
            if run_id is None:
                return
            cards = self._runs.get(run_id)
            if cards is not None:
                cards.discard(card_id)
            self._on_ready(run_id)

        return done

    def _wake(self, run_id: str) -> None:
        self._timers.pop(run_id, None)
        if run_id in self._runs:
            self._on_ready(run_id)

    def resolve(self, card_id: str, status: str = "") -> bool:
        """The fast path: a decision for a parked card. False if nothing here waits on it."""
        fut = self._futures.get(card_id)
        if fut is None or fut.done():
            return False
        fut.set_result(status)
        return True

    def drop_run(self, run_id: str) -> None:
        """Forget a run (superseded, finished, handed over) without waking it."""
        timer = self._timers.pop(run_id, None)
        if timer is not None:
            timer.cancel()
        for card_id in self._runs.pop(run_id, set()):
            self._card_run.pop(card_id, None)
            fut = self._futures.pop(card_id, None)
            if fut is not None and not fut.done():
                fut.cancel()

    def drop_all(self) -> list[str]:
        runs = list(self._runs)
        for run_id in runs:
            self.drop_run(run_id)
        return runs
