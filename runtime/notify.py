"""Tell the owning worker and the thread's gateways that a card changed.

Called only after the change is committed in Postgres (I6). A publish that
nobody hears is fine: the worker's re-read on (re)subscribe and slow poll
finds the decision in Postgres.
"""

from __future__ import annotations

import msgspec

from runtime import hints
from runtime.bus import Bus
from runtime.cards import Card
from runtime.errors import SignoffError
from runtime.keys import Keys
from runtime.records import Entry
from store.postgres import PostgresStore


class CardSignal(msgspec.Struct, frozen=True):
    card_id: str
    status: str
    at_ns: int = 0  # monotonic-free wall time of the decision, for latency measurement


_enc = msgspec.json.Encoder()
signal_decoder = msgspec.json.Decoder(CardSignal)


async def notify_card(
    store: PostgresStore,
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
    signal = _enc.encode(CardSignal(card.id, str(card.status), at_ns))
    heard = 0
    if early_owner:
        heard = await bus.publish(keys.worker_channel(early_owner), signal)
    if not heard:
        owner = await bus.wait_owner(card.id)
        if owner is None:
            try:
                owner = (await store.get_run(card.run_id)).worker_id
            except SignoffError:
                owner = None
        if owner and owner != early_owner:
            heard = await bus.publish(keys.worker_channel(owner), signal)
    await bus.publish(
        keys.thread_channel(card.thread_id),
        hints.of_entries([entry]) if entry is not None else hints.RELOAD,
    )
    return heard
