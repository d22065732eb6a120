"""The one publisher of hints: thread hints, text deltas, worker signals, wait tokens.

Everything here is sent after the change it tells about is committed in Postgres
(I6), and nothing here raises: a publish nobody hears is fine (the worker's re-read
on (re)subscribe and its slow poll find the decision in Postgres; a gateway re-reads
the log on a gap), and so is one that fails (Redis down), for the same reason. A
hint never fails a step after its commit (DESIGN.md §9, design note 18); a failure is
logged and counted (``signoff_hints_failed_total``).

A thread hint carries the log entries just committed (design note 2), so the
thread's gateways need not re-read the log; a worker signal only names a card, and
the worker re-reads its run before doing anything.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Sequence
from typing import Protocol

import msgspec

from signoff.runtime import hints
from signoff.runtime.bus import Bus, Job
from signoff.runtime.cards import Card, Status
from signoff.runtime.errors import SignoffError
from signoff.runtime.keys import Keys
from signoff.runtime.logs import Throttle, left_out
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.records import Entry, Moved, Run


class CardSignal(msgspec.Struct, frozen=True):
    """What the holder of a card's run is sent on its channel (``Keys.worker_channel``).

    A workflow run's holder gets one with ``run_id`` set (and no card): a gate of the run
    was passed; it continues the run from Postgres."""

    card_id: str
    status: str
    at_ns: int = 0  # wall time the gateway received the decision, for latency measurement
    run_id: str = ""  # a workflow run to continue
    trace: str = ""  # the deciding span's W3C traceparent when tracing is on (telemetry.py)


log = logging.getLogger("signoff.notify")
_enc = msgspec.json.Encoder()
signal_decoder = msgspec.json.Decoder(CardSignal)


class Runs(Protocol):
    """What the notifier reads of the store: a run, for its holder."""

    async def get_run(self, run_id: str) -> Run: ...


async def wake_workflow(
    bus: Bus,
    keys: Keys,
    run_id: str,
    holder: str | None,
    *,
    tenant: str,
    owner: str,
    at_ns: int = 0,
) -> str:
    """After a workflow run was made runnable (started, a gate passed) and committed: tell
    its live holder on its channel, else put it on the inbox for any worker. Never raises:
    without Redis the holder's poll (or adoption) finds the run in Postgres. Returns how
    it went: ``signal``, ``inbox`` or ``lost``."""
    try:
        if holder:
            signal = _enc.encode(CardSignal("", "workflow", at_ns, run_id=run_id))
            if await bus.publish(keys.worker_channel(holder), signal):
                return "signal"
        job = Job(thread_id="", text="", user=owner, tenant=tenant, workflow_run=run_id)
        await bus.enqueue(job)
        return "inbox"
    except Exception as exc:  # whatever Redis did, the commit stands
        COUNTERS.inc("signoff_hints_failed_total")
        log.warning("workflow run %s: no hint sent (%s); Postgres has it", run_id, exc)
        return "lost"


# One throttle per kind of thing sent (its name without the ids in it): a hint failing
# in an outage must not hide another kind's failure.
_HINT_FAILURES: dict[str, Throttle] = {}
_IDS = re.compile(r"[0-9a-fA-F-]{32,36}")


async def quietly(step: Awaitable[object], what: str, *, throttled: bool = True) -> bool:
    """Await something sent after a commit (a publish, a wait-token write or delete); a
    failure is logged and counted, never raised. True if it went through. ``throttled``:
    a failure that recurs in an outage is logged at most every 10 s per kind; False for
    what is no hint (a thread's error entry: logged every time, as an error)."""
    try:
        await step
    except Exception as exc:  # whatever Redis or the network did, the commit stands
        COUNTERS.inc("signoff_hints_failed_total")  # each one counted
        if not throttled:
            log.error("%s failed after its commit (%s); going on", what, exc)
            return False
        held = _HINT_FAILURES.setdefault(_IDS.sub("", what), Throttle()).allow()
        if held is not None:
            log.warning("%s failed after its commit (%s); going on%s", what, exc, left_out(held))
        return False
    return True


class Notifier:
    """Publishes every hint of one process (agent, worker, sweeper, decisions)."""

    def __init__(self, bus: Bus, keys: Keys, runs: Runs) -> None:
        self.bus = bus
        self.keys = keys
        self.runs = runs

    async def thread(self, thread_id: str, entries: Sequence[Entry] = ()) -> bool:
        """Tell the thread's gateways the log grew by these entries (none: re-read it)."""
        return await quietly(
            self.bus.publish(self.keys.thread_channel(thread_id), hints.of_entries(entries)),
            f"thread hint for {thread_id}",
        )

    async def delta(self, thread_id: str, seq: int, delta: str, run_id: str) -> bool:
        """A piece of the model's text as it streams (after log ``seq``; never stored)."""
        return await quietly(
            self.bus.publish(
                self.keys.thread_channel(thread_id), hints.of_delta(seq, delta, run_id)
            ),
            "text delta",
        )

    async def run_notice(self, run_id: str, notice: str) -> bool:
        """A run's passing state on its thread (``hints.of_notice``), e.g. the model cannot
        be reached. A hint: never raises."""
        try:
            run = await self.runs.get_run(run_id)
        except Exception as exc:
            log.debug("notice for run %s not sent: %s", run_id, exc)
            return False
        return await quietly(
            self.bus.publish(
                self.keys.thread_channel(run.thread_id), hints.of_notice(notice, run_id)
            ),
            "run notice",
        )

    async def moved(self, moved: Moved | None) -> Card | None:
        """Hint a committed card change to its thread; the card as it left it (None: no
        change was made)."""
        if moved is None:
            return None
        await self.thread(moved.card.thread_id, [moved.entry])
        return moved.card

    async def card(
        self,
        card: Card,
        *,
        at_ns: int = 0,
        holder: str | None = None,
        entry: Entry | None = None,
        trace: str = "",
    ) -> int:
        """Signal the worker holding the card's run, then hint the thread; how many
        workers heard the signal.

        ``holder``: the run's holder as the deciding statement saw it (no Redis read on
        the decision path). If nobody hears the signal there, the card's wait token is
        read, then the run's holder in Postgres. ``entry``: the log entry the change
        wrote, carried to the thread's gateways (without it they re-read the log).
        """
        heard = 0
        try:
            heard = await self._signal_holder(card, at_ns, holder, trace)
        except Exception as exc:  # never fail the caller after its commit (I6)
            COUNTERS.inc("signoff_hints_failed_total")
            log.warning(
                "card %s changed; could not signal its worker (%s): Postgres has it", card.id, exc
            )
        if card.status is not Status.PENDING:
            # The card left pending (decided, expired, superseded): its wait token has
            # served (the signal above read it if it needed to). Deleted, not left to expire.
            await self.clear_wait(card.id)
        await self.thread(card.thread_id, [entry] if entry is not None else ())
        return heard

    async def set_wait(self, card_id: str, holder: str, ttl_ms: int) -> bool:
        """The wait token naming ``holder`` for the card: ``card``'s fallback."""
        return await quietly(self.bus.set_wait(card_id, holder, ttl_ms), "wait token")

    async def clear_wait(self, card_id: str) -> bool:
        return await quietly(self.bus.clear_wait(card_id), f"wait token delete for {card_id}")

    async def _signal_holder(
        self, card: Card, at_ns: int, holder: str | None, trace: str = ""
    ) -> int:
        signal = _enc.encode(CardSignal(card.id, str(card.status), at_ns, trace=trace))
        heard = 0
        if holder:
            heard = await self.bus.publish(self.keys.worker_channel(holder), signal)
        if not heard:
            other = await self.bus.wait_holder(card.id)
            if other is None:
                try:
                    other = (await self.runs.get_run(card.run_id)).holder
                except SignoffError:
                    other = None
            if other and other != holder:
                heard = await self.bus.publish(self.keys.worker_channel(other), signal)
        return heard
