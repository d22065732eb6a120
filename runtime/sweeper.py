"""The worker's sweeper: what a missed signal or a lost process leaves behind.

Every ``sweep_seconds`` each worker expires overdue pending cards (the database's
clock, I7), settles approved cards nobody started (invalidated when their run is
over, signalled again when it is not) and flags executions stuck past
``stuck_after_seconds`` for a person (never retried, I4).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from signoff.runtime.cards import Card, Status
from signoff.runtime.metrics import COUNTERS

if TYPE_CHECKING:
    from signoff.runtime.worker import Worker

log = logging.getLogger("signoff.worker")

# A reason per language (a tool's ``Label``): the page shows the person's.
APPROVED_ORPHAN_REASON = {
    "en": "its run ended before this approved action started (a newer message, or an error); "
    "nothing was executed",
    "pt-BR": "a execução terminou antes de esta ação aprovada começar (uma mensagem nova, ou "
    "um erro); nada foi executado",
}


class Sweeper:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.signalled_again: dict[str, float] = {}  # stale approved card -> when

    async def sweep(self) -> tuple[list[Card], list[Card]]:
        """Expire overdue pending cards (DB clock), settle approved cards nobody started,
        flag stuck executions. Returns the expired and the stuck cards."""
        w = self.worker
        expired: list[Card] = []
        for card_id in await w.store.overdue_card_ids():
            moved = await w.store.expire(card_id)
            if moved is not None:
                card = moved.card
                expired.append(card)
                if not w.waits.resolve(card.id, "expired", "expiry"):
                    await w.notify.card(card, entry=moved.entry)  # deletes its wait token
                else:
                    await w.notify.clear_wait(card.id)
                    await w.notify.thread(card.thread_id, [moved.entry])
        await self.sweep_approved()
        stuck = await w.store.flag_stuck(w.settings.stuck_after_seconds)
        await w.store.forget_workers()
        for card in stuck:
            COUNTERS.inc("signoff_cards_flagged_total")
            log.error("card %s stuck in executing: flagged for reconciliation", card.id)
        return expired, stuck

    async def sweep_approved(self) -> list[Card]:
        """Approved cards not started for ``approved_stale_seconds``. Normally a card is
        started within milliseconds of its approval; one left behind either belongs to a
        run that is over (nobody will execute it: it is invalidated, with the reason, by
        ``system:sweeper``) or its holder missed the signal (signalled again, at most once
        per ``approved_stale_seconds`` per card, so a backlog is not signalled again at
        every sweep; a lapsed holder's run is adopted). Returns the cards invalidated."""
        w = self.worker
        every = w.settings.approved_stale_seconds
        stale = await w.store.approved_stale(every)
        invalidated: list[Card] = []
        now, signalled = time.monotonic(), self.signalled_again
        again: Counter[str] = Counter()  # holder -> cards signalled again (one line a sweep)
        for card, run_active, holder in stale:
            if run_active:
                if now - signalled.get(card.id, -every) < every:
                    continue
                signalled[card.id] = now
                COUNTERS.inc("signoff_approved_stale_total")
                again[holder or "nobody"] += 1
                log.debug("card %s approved but not started; signalling its run again", card.id)
                if w.waits.resolve(card.id, str(card.status), "sweep"):
                    continue
                if holder != w.worker_id:
                    await w.notify.card(card)
                elif not w.wakes.pending(card.run_id) and not w.agent.lock(card.run_id).locked():
                    # Ours, parked nowhere here, no continuation of it running or due:
                    # nothing else would wake it (design note 48).
                    log.warning("run %s is ours but not parked here: continuing it", card.run_id)
                    w.wakes.now(card.run_id)
                continue
            COUNTERS.inc("signoff_approved_stale_total")
            moved = await w.store.move(
                card.id,
                Status.APPROVED,
                Status.INVALIDATED,
                actor="system:sweeper",
                result={"reason": APPROVED_ORPHAN_REASON, "changes": []},
                detail={"reason": APPROVED_ORPHAN_REASON},
            )
            if moved is not None:
                log.error("card %s was approved after its run ended: invalidated", card.id)
                invalidated.append(moved.card)
                await w.notify.thread(card.thread_id, [moved.entry])
        for gone in signalled.keys() - {c.id for c, _, _ in stale}:
            del signalled[gone]
        if again:  # after a worker died, its runs' approvals wait here until adopted
            log.warning(
                "%d approved card(s) not started after %.0fs: their runs signalled again "
                "(held by %s; a holder that died is taken over once its lease lapses)",
                sum(again.values()),
                every,
                ", ".join(f"{who} ×{n}" for who, n in again.most_common(5)),
            )
        return invalidated
