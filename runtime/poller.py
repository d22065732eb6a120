"""The worker's slow poll: what finds a decision whose signal was lost.

A decision is committed in Postgres before it is signalled (I6), so a signal that never
came (a gateway killed between its commit and its publish, a publish while Redis was
away) costs latency, never the decision. At each tick the poll reads the approved cards
of runs this worker holds (an index of the few approved cards not yet started: constant
however many runs are parked) and wakes their runs; every :data:`POLL_FULL_EVERY`-th tick
it re-reads every parked card, :data:`RECHECK_CHUNK` ids per statement, for the decisions
that are not approvals (a rejection, an edit). A (re)subscribe re-reads every parked card
at once (design note 38). An approved card that cannot start here while its run waits on
a sibling (another app version's tool in the run: ``Approved.blocked``) wakes nothing;
the pending cards of its run are re-read instead, at each tick.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from signoff.runtime.errors import SignoffError

if TYPE_CHECKING:
    from signoff.runtime.worker import Worker

log = logging.getLogger("signoff.worker")

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

    async def let_go_of_taken(self) -> None:
        """After this worker's lease lapsed (a renewal came too late: Postgres away, or a
        read-only while): forget the parked runs another worker adopted meanwhile. They
        stayed parked here (counted in ``signoff_parked_runs`` by both workers) until a
        card of theirs was decided."""
        w = self.worker
        parked = w.waits.parked_runs()
        held: set[str] = set()
        try:
            for start in range(0, len(parked), RECHECK_CHUNK):
                chunk = parked[start : start + RECHECK_CHUNK]
                held |= await w.store.runs_held_among(w.worker_id, chunk)
        except SignoffError as exc:  # each is let go once a card of it is decided
            log.warning("could not look for parked runs taken over: %s", exc)
            return
        taken = [run_id for run_id in parked if run_id not in held]
        for run_id in taken:
            w.waits.drop_run(run_id)
            w.agent.executor.elsewhere.forget(run_id)
        if taken:
            log.warning(
                "this worker's lease had lapsed: %d parked run(s) are no longer its own "
                "(another worker took them over); let go",
                len(taken),
            )

    async def poll(self, tick: int = 0) -> None:
        """One tick: the approved cards of runs held here, or, every
        :data:`POLL_FULL_EVERY`-th tick, every parked card."""
        w = self.worker
        if tick % POLL_FULL_EVERY == 0:
            await self.recheck(w.waits.parked_cards(), "poll")
            return
        served = [t.name for t in w.agent.tools]
        found = await w.store.approved_held(w.worker_id, tools=served)
        blocked = w.agent.approved.blocked  # what a wake would find blocked again
        for card_id in [c for c in blocked if c not in found]:
            del blocked[card_id]
        if blocked:  # their pending siblings are what can unblock them: looked at now
            runs = set(blocked.values())
            await self.recheck([c for r in runs for c in w.waits.cards_of(r)], "poll")
        for card_id, run_id in found.items():
            if card_id in blocked or w.waits.resolve(card_id, "approved", "poll"):
                continue
            # A card an unseen edit proposed; not a run being continued now (its approved
            # card is still revalidating while a sibling waits: design note 60), nor one
            # already due to be continued again.
            if not w.wakes.pending(run_id) and not w.agent.lock(run_id).locked():
                w.waits.wake_run(run_id, "poll")
