"""The worker's slow poll: what finds a decision whose signal was lost.

A decision is committed in Postgres before it is signalled (I6), so a signal that never
came (a gateway killed between its commit and its publish, a publish while Redis was
away) costs latency, never the decision. At each tick the poll reads the approved cards
of runs this worker holds (an index of the few approved cards not yet started: constant
however many runs are parked) and wakes their runs; every :data:`POLL_FULL_EVERY`-th tick
it re-reads every parked card, :data:`RECHECK_CHUNK` ids per statement, for the decisions
that are not approvals (a rejection, an edit). A (re)subscribe re-reads every parked card
at once (design note 38).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from signoff.runtime.worker import Worker

POLL_FULL_EVERY = 12
RECHECK_CHUNK = 5000


class Poller:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def recheck(self, card_ids: list[str], path: str) -> None:
        """Wake the runs parked on whichever of these cards left ``pending``."""
        w = self.worker
        for start in range(0, len(card_ids), RECHECK_CHUNK):
            chunk = card_ids[start : start + RECHECK_CHUNK]
            for card_id, status in (await w.store.decided_among(chunk)).items():
                w.waits.resolve(card_id, status, path)

    async def poll(self, tick: int = 0) -> None:
        """One tick: the approved cards of runs held here, or, every
        :data:`POLL_FULL_EVERY`-th tick, every parked card."""
        w = self.worker
        if tick % POLL_FULL_EVERY == 0:
            await self.recheck(w.waits.parked_cards(), "poll")
            return
        for card_id, run_id in (await w.store.approved_held(w.worker_id)).items():
            if not w.waits.resolve(card_id, "approved", "poll"):
                w.waits.wake_run(run_id, "poll")  # a card an unseen edit proposed
