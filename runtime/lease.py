"""A worker's lease as its own clock sees it (:class:`LeaseClock`): whether the provider
may still be called for a run this worker holds (runtime/execution.py)."""

from __future__ import annotations

import time
from collections.abc import Callable


class LeaseClock:
    """Until when this worker's lease surely holds, by its own monotonic clock: when the
    last renewal that succeeded was sent, plus the lease, less a fifth for safety (the
    database's expiry is later still: it counts from when it ran the renewal).

    A renewal sent after the lease had lapsed starts a new ``epoch``: the database takes
    it (the row is upserted), but runs may have been adopted in between, so an execution
    begun in an earlier epoch sends nothing more."""

    def __init__(self, seconds: float, on_lapsed: Callable[[], object] | None = None) -> None:
        self.seconds = seconds
        self.until = 0.0
        self.epoch = 0
        self.on_lapsed = on_lapsed  # told when a renewal follows a lapse (not the first)

    def renewed(self, sent_at: float) -> None:
        if sent_at >= self.until:
            self.epoch += 1
            if self.epoch > 1 and self.on_lapsed is not None:
                self.on_lapsed()
        self.until = max(self.until, sent_at + self.seconds * 0.8)

    def holds(self, since: float | None = None) -> bool:
        """The lease holds now and, given ``since`` (when the execution began), the time
        since then is short of most of a lease: no other worker can have adopted the run
        (and told its model the outcome is unknown, or an operator reconciled it)."""
        now = time.monotonic()
        return now < self.until and (since is None or now - since < self.seconds * 0.8)
