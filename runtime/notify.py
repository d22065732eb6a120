"""Tell the owning worker and the thread's gateways that a card changed.

Called only after the change is committed in Postgres (I6). A publish that
nobody hears is fine: the worker's re-read on (re)subscribe and slow poll
finds the decision in Postgres. A publish that fails (Redis down) is fine too,
for the same reason: nothing here raises. A hint never fails a step after its
commit (DESIGN.md §9); it is logged and counted (``signoff_hints_failed_total``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import msgspec

from signoff.runtime import hints
from signoff.runtime.bus import Bus
from signoff.runtime.cards import Card
from signoff.runtime.errors import SignoffError
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.records import Entry
from signoff.runtime.store import Store


class CardSignal(msgspec.Struct, frozen=True):
    card_id: str
    status: str
    at_ns: int = 0  # monotonic-free wall time of the decision, for latency measurement


log = logging.getLogger("signoff.notify")
_enc = msgspec.json.Encoder()
signal_decoder = msgspec.json.Decoder(CardSignal)


async def quietly(hint: Awaitable[object], what: str) -> bool:
    """Await a hint (a publish, a wait-token write or delete) sent after a commit; a
    failure is logged and counted, never raised. True if it went through."""
    try:
        await hint
    except Exception as exc:  # whatever Redis or the network did, the commit stands
        COUNTERS.inc("signoff_hints_failed_total")
        log.warning("%s failed after its commit (%s); going on", what, exc)
        return False
    return True


async def notify_card(
    store: Store,
    bus: Bus,
    keys: Keys,
    card: Card,
    at_ns: int = 0,
    early_owner: str | None = None,
    entry: Entry | None = None,
) -> int:
    """Publish the change to the worker holding the run; returns how many heard it.

    ``early_owner``: the worker holding the card's run as the deciding statement saw
    it (no Redis read on the decision path). If nobody hears the signal there, the
    wait token is read, then the run's holder again, as without it. ``entry``: the log entry the change
    wrote, carried to the thread's gateways (without it they re-read the log).
    """
    heard = 0
    try:
        heard = await _signal_holder(store, bus, keys, card, at_ns, early_owner)
    except Exception as exc:  # never fail the caller after its commit (I6)
        COUNTERS.inc("signoff_hints_failed_total")
        log.warning(
            "card %s changed; could not signal its worker (%s): Postgres has it", card.id, exc
        )
    await quietly(
        bus.publish(
            keys.thread_channel(card.thread_id),
            hints.of_entries([entry]) if entry is not None else hints.RELOAD,
        ),
        f"thread hint for card {card.id}",
    )
    return heard


async def _signal_holder(
    store: Store,
    bus: Bus,
    keys: Keys,
    card: Card,
    at_ns: int,
    early_owner: str | None,
) -> int:
    signal = _enc.encode(CardSignal(card.id, str(card.status), at_ns))
    heard = 0
    if early_owner:
        heard = await bus.publish(keys.worker_channel(early_owner), signal)
    if not heard:
        owner = await bus.wait_owner(card.id)
        if owner is None:
            try:
                owner = (await store.get_run(card.run_id)).holder
            except SignoffError:
                owner = None
        if owner and owner != early_owner:
            heard = await bus.publish(keys.worker_channel(owner), signal)
    return heard
