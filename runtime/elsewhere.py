"""Cards found `executing` in a run's previous holder, and when this worker first saw each
(design note 49).

The previous holder started them and may be alive, only cut off from Postgres; back, it
takes the run again to finish the call (``worker_fence``), so telling the model "outcome
unknown" at once would lose an approval that still executes. Each is left alone for a
window (a lease and a tool deadline: a call begun before the lease lapsed may still be
running) from when it was first seen here, whichever path saw it: a continuation's resume,
or the claim of an approved sibling that runs beside it (the window used to start only
once that sibling was done). :meth:`Executor.settle_elsewhere` flags what outlives it.
"""

from __future__ import annotations

import time
from collections.abc import Container, Iterable

from signoff.runtime.cards import Card, Status
from signoff.runtime.errors import ExecutingElsewhere


def executing_elsewhere(cards: Iterable[Card], started: Container[str] = ()) -> list[Card]:
    """The cards `executing`, not yet flagged, and not ``started`` here."""
    return [
        c
        for c in cards
        if c.status is Status.EXECUTING and not c.needs_reconciliation and c.id not in started
    ]


class Elsewhere:
    """When each card found executing elsewhere was first seen here, by card."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[str, float]] = {}  # card -> (run, first seen)

    def first_seen(self, card_id: str) -> float | None:
        seen = self._first.get(card_id)
        return None if seen is None else seen[1]

    def seen(self, run_id: str, cards: Iterable[Card], started: Container[str] = ()) -> None:
        """The run's cards found executing and not ``started`` here: their window starts
        now unless it already has."""
        now = time.monotonic()
        for card in executing_elsewhere(cards, started):
            self._first.setdefault(card.id, (run_id, now))

    def wait(self, run_id: str, cards: list[Card], window: float) -> list[Card]:
        """The run's cards executing elsewhere, once each has been seen for ``window``
        seconds (to flag); :class:`ExecutingElsewhere` while one has not, with the time
        left as ``retry_after``."""
        now = time.monotonic()
        for card_id, (_, seen) in list(self._first.items()):
            if now - seen > 10 * window:
                del self._first[card_id]
        self.seen(run_id, cards)
        elsewhere = executing_elsewhere(cards)
        left = [window - (now - self._first[c.id][1]) for c in elsewhere]
        if any(t > 0 for t in left):
            raise ExecutingElsewhere(  # looked at again no later than its window's end
                f"run {run_id}: a card is executing in the run's previous holder; looked at "
                f"again (its outcome is told unknown {window:g}s after it was first seen)",
                retry_after=min(t for t in left if t > 0) + 0.05,
            )
        return elsewhere

    def settled(self, card_ids: Iterable[str]) -> None:
        for card_id in card_ids:
            self._first.pop(card_id, None)

    def forget(self, run_id: str) -> None:
        """The run is held by another worker now (taken back), or adopted again: if it
        comes back to this one, its cards get a whole window again."""
        for card_id, (run, _) in list(self._first.items()):
            if run == run_id:
                del self._first[card_id]
