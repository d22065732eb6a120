"""Starting a card's execution when the database's answer may be lost (design note 50).

``card_begin_execution`` commits ``approved -> executing`` in one statement. If its
answer does not come (a store timeout while the commit went through, a connection
dropped after it), the worker cannot tell its own commit from no commit, nor from
another process's begin. Left at that, the run's next step found the card `executing`,
took it for a previous holder's and flagged it a lease and a tool deadline later: an
approval lost with the provider never called (an integrity probe). So each begin
carries a token of this very call into its `executing` audit row, and on a lost answer
the card is read back, asked until Postgres answers:

* still ``approved``: nothing was committed; the error stands (the run goes on later,
  as before);
* ``executing`` under this call's token: this call committed it, and the provider has
  not been called (this process would have called it): it is ours to send, through the
  lease fence as any send the worker's clock cannot vouch for;
* ``executing`` under another token, or none: another process started it;
* anything else: what became of the card.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from signoff.runtime.cards import Card, Status
from signoff.runtime.errors import Unavailable
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.records import Moved
from signoff.runtime.store import Store

log = logging.getLogger("signoff.worker")

# Waits between reads of a card whose begin got no answer (the last one repeats).
READ_BACK_RETRIES = (0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class Begun:
    """What a begin left: the card as it stands; ``ours``: this call moved it to
    `executing` (the provider is this caller's to call); ``moved``: the committed change
    as its answer reported it (``None`` when the answer was lost: nothing to hint)."""

    card: Card
    ours: bool
    moved: Moved | None = None


async def begin(
    store: Store,
    card_id: str,
    actor: str,
    holder: str | None,
    in_flight_seconds: float | None,
) -> Begun:
    """``approved -> executing`` for ``holder``'s run, the lost answer resolved."""
    attempt = uuid.uuid4().hex
    try:
        moved = await store.begin_execution(card_id, actor, holder, in_flight_seconds, attempt)
    except Unavailable as exc:
        return await _read_back(store, card_id, attempt, exc)
    if moved is not None:
        return Begun(moved.card, True, moved)
    return Begun(await store.get_card(card_id), False)


async def _read_back(store: Store, card_id: str, attempt: str, lost: Unavailable) -> Begun:
    tries = 0
    try:
        while True:
            try:
                card, token = await store.read_back_begin(card_id, attempt)
                break
            except Unavailable as exc:
                if tries % 30 == 0:  # the first, then about every half minute
                    log.warning(
                        "card %s: its begin got no answer (%s), nor its read-back yet (%s); "
                        "asking again",
                        card_id,
                        lost,
                        exc,
                    )
                await asyncio.sleep(READ_BACK_RETRIES[min(tries, len(READ_BACK_RETRIES) - 1)])
                tries += 1
    except asyncio.CancelledError:
        log.error(
            "card %s: stopping with its begin unanswered: if it is executing, the provider "
            "was not called by this process (reconcile it as not sent once its run's "
            "next holder has flagged it)",
            card_id,
        )
        raise
    if card.status is Status.APPROVED:
        raise lost  # nothing was committed: the run goes on later, as before
    ours = card.status is Status.EXECUTING and token == attempt
    if ours:
        COUNTERS.inc("signoff_begin_answers_lost_total")
        log.warning(
            "card %s: its begin committed but the answer was lost (%s); sending it", card_id, lost
        )
    return Begun(card, ours)
