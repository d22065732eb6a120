"""The execution of an approved card: revalidate, one winner, the frozen snapshot, once.

``approved -> executing`` is one conditional update, so of two processes holding the
same card one starts it (I4); the tool receives ``args_snapshot`` as read back from
Postgres and the card's ``operation_id`` as the provider's idempotency key (I2). An
execution that got no answer is asked again with the same key; one whose outcome stays
unknown is left ``executing`` for the sweeper to flag, never recorded as a failure that
may be false. A known outcome is recorded however long the store takes to answer again.

The provider is called only while this worker's lease surely holds (:class:`LeaseClock`):
a process frozen past it (SIGSTOP, a paused VM) may have had its run adopted and the card
reconciled meanwhile. Each tool call has a deadline (``SIGNOFF_TOOL_TIMEOUT_SECONDS``): a
revalidation without an answer, or meeting an unavailable service, leaves the card
approved for a later continuation; an execution without one is an unknown outcome. While
a tool call waits, the continuation's step slot is let go (runtime/slots.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from signoff.runtime import outcomes, slots
from signoff.runtime.begin import begin
from signoff.runtime.cards import Card, Status
from signoff.runtime.elsewhere import Elsewhere
from signoff.runtime.errors import ExecutingElsewhere, ToolTimedOut, Unavailable, UnknownTool
from signoff.runtime.faults import Faults
from signoff.runtime.lease import LeaseClock
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.notify import Notifier
from signoff.runtime.outcomes import NOT_SENT, REVALIDATION_FAILED
from signoff.runtime.store import Store
from signoff.runtime.telemetry import span
from signoff.runtime.tools import Label, Prepared, Registry, Tool, ToolContext

log = logging.getLogger("signoff.agent")
T = TypeVar("T")

# An execution that got no answer (timeout, dropped connection) is asked again with the
# same operation_id after these waits; the provider deduplicates by that key (I4).
UNKNOWN_OUTCOME = (TimeoutError, ConnectionError, Unavailable)
UNKNOWN_OUTCOME_RETRIES = (0.5, 1.0, 2.0)
# Fences answered "ours" but past most of a lease, in a row, before nothing is sent (the
# card recorded failed, certain): a database that slow would hold the card for ever.
LATE_FENCES = 5
# Waits between attempts to record a known outcome when the store does not answer; the
# last one repeats until it is recorded (or the process ends: then it is left executing).
RECORD_RETRIES = (0.2, 0.5, 1.0, 2.0, 4.0, 5.0)
# Waits between asking the database whether the provider may be called (the last repeats):
# short, so a worker back from an outage settles its executions before adopters (note 49).
FENCE_RETRIES = (0.1, 0.2, 0.5, 1.0)
# A revalidation that meets these is tried again later (the card stays approved).
TRANSIENT = (TimeoutError, ConnectionError, Unavailable)
CANCELLED_IN_CALL = (
    "card %s: stopping while its provider call (operation %s) was in flight: outcome "
    "unknown, left executing (the worker that takes its run over flags it for "
    "reconciliation once its window ends; check the provider for the operation id, then "
    "`signoff cards reconcile %s`)"
)


class Executor:
    """Executes approved cards for one worker (``actor`` in the audit: ``worker:<id>``)."""

    def __init__(
        self,
        *,
        store: Store,
        tools: Registry,
        notify: Notifier,
        actor: str,
        faults: Faults,
    ) -> None:
        self.store = store
        self.tools = tools
        self.notify = notify
        self.actor = actor
        self.faults = faults
        self.lease: LeaseClock | None = None  # None: no lease to keep (a worker sets one)
        self.tool_timeout: float | None = None  # seconds a tool call may take
        self.elsewhere = Elsewhere()  # cards executing in a run's previous holder
        self._theirs: set[str] = set()  # cards found moved by another process (not logged)
        self._started: set[str] = set()  # cards started here whose outcome is not recorded
        self.closing = False  # a stopping worker starts no card (runtime/drain.py)

    def executing(self) -> int:
        return len(self._started)

    async def read(self, tool: Tool, args: dict[str, Any], ctx: ToolContext) -> Any:
        """A read tool's call, under the tool deadline (:class:`ToolTimedOut`)."""
        return await self._in_time(tool, tool.execute(args, "", ctx))

    async def prepare(self, tool: Tool, data: Any, ctx: ToolContext) -> Prepared:
        """A write's ``prepare`` (it reads the world to freeze the card), under the tool
        deadline (:class:`ToolTimedOut`)."""
        prepared: Prepared = await self._in_time(tool, tool.prepare(data, ctx))
        return prepared

    async def allowed(
        self, tool: Tool, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> Any:
        """A write the policy lets through without a card, under the tool deadline; past
        it the call may have acted, and :class:`ToolTimedOut` says so."""
        return await self._in_time(tool, tool.execute(args, operation_id, ctx), acted=True)

    async def _in_time(self, tool: Tool, call: Coroutine[Any, Any, T], *, acted: bool = False) -> T:
        """``call`` within ``tool_timeout``: a read that hangs on a dead connection held
        its run (and the run's lock) for ever on a live worker, as a hung revalidation did
        (design note 48). Nothing is written on these paths, so "nothing was done" holds."""
        try:
            return await slots.outside(call, self.tool_timeout)
        except TimeoutError as exc:
            limit = "" if self.tool_timeout is None else f" ({self.tool_timeout:g} s)"
            log.warning("tool %s did not answer in time%s", tool.name, limit)
            outcome = (
                "it may have acted: check before doing it again"
                if acted
                else "nothing was done. Try again later"
            )
            raise ToolTimedOut(
                f"The tool {tool.name} did not answer in time{limit}; {outcome}.", tool=tool.name
            ) from exc

    async def settle_elsewhere(self, run_id: str, cards: list[Card]) -> None:
        """Cards of the run found `executing` when a continuation begins, not flagged
        (runtime/elsewhere.py): :class:`ExecutingElsewhere` for a lease and a tool
        deadline from when this worker first saw one (the run is continued again later).
        Past that, they are flagged for reconciliation, under the thread's lock and only
        while this worker holds the run (else it was taken back: ``ExecutingElsewhere``,
        and the re-read leaves the run to its holder), before the model is told the
        outcome is unknown (I4; design note 49). Without a lease (no worker) nothing
        waits."""
        if self.lease is None:
            return
        # A lease, plus the longest a provider call begun before it lapsed may still run:
        # a flag raised while the call is in flight invites an operator to settle a card
        # whose outcome is about to be known.
        window = self.lease.seconds + (self.tool_timeout or 0.0)
        elsewhere = self.elsewhere.wait(run_id, cards, window)
        if not elsewhere:
            return
        ids = [c.id for c in elsewhere]
        flagged = await self.store.flag_elsewhere(run_id, self.actor.removeprefix("worker:"), ids)
        for card_id in flagged:
            COUNTERS.inc("signoff_cards_flagged_total")
            log.error(
                "card %s: started by a process that held run %s before (another worker, or "
                "this id before a restart) and did not finish it within a lease; outcome "
                "unknown: flagged for reconciliation (check the provider for its operation "
                "id, then `signoff cards reconcile %s`)",
                card_id,
                run_id,
                card_id,
                extra={"card_id": card_id, "run_id": run_id},
            )
        if set(flagged) != set(ids):
            raise ExecutingElsewhere(f"run {run_id} changed while its cards were flagged")
        self.elsewhere.settled(ids)

    def seen_elsewhere(self, run_id: str, cards: Iterable[Card]) -> None:
        """The claim path: the run's cards executing, not started here, start their window
        now, not once the siblings claimed beside them are done."""
        self.elsewhere.seen(run_id, cards, self._started)

    def _epoch(self) -> int:
        return self.lease.epoch if self.lease is not None else 0

    def in_flight(self) -> float | None:
        """How long after a card's `executing_since` a call of this worker's may still be
        in flight: attempts start within most of a lease of it, each ends by the tool
        deadline. Kept in the `executing` audit row: a reconcile waits it out (design note
        49). ``None`` without a lease or a deadline."""
        if self.lease is None or self.tool_timeout is None:
            return None
        return self.lease.seconds + self.tool_timeout

    def _may_send(self, epoch: int, since: float | None = None) -> bool:
        """The provider may be called: the lease holds, in the epoch the execution began
        in, and (``since`` given) most of a lease has not passed since it began."""
        if self.lease is None:
            return True
        return self.lease.epoch == epoch and self.lease.holds(since)

    async def _fenced(self, card_id: str) -> float | None:
        """The clock could not vouch for the lease (a Postgres outage held the renewals
        up, or a pause): ask the database, renewing the lease in the same statement. When
        the card is still `executing`, unflagged, in a run this worker holds, or takes
        back because its adopter has not acted on it yet (``worker_fence``), nobody has
        been told anything about the card and the renewed lease keeps it so: the
        monotonic time that fence was sent (its answer is vouched for from then), else
        ``None``. Asked until the database answers in time: an outage, or a fence held up
        past most of a lease (a lock on the worker's row), must not fail an approval
        whose call was never made (the card stays `executing` meanwhile, and if the
        process stops first, the log says nothing was sent)."""
        if self.lease is None:
            return None
        holder = self.actor.removeprefix("worker:")
        attempt = late = 0
        try:
            while True:
                sent = time.monotonic()
                try:
                    ours = await self.store.execution_fence(card_id, holder, self.lease.seconds)
                except Unavailable as exc:
                    wait = FENCE_RETRIES[min(attempt, len(FENCE_RETRIES) - 1)]
                    if attempt % 30 == 0:  # the first, then about every half minute
                        log.warning(
                            "card %s: lease not confirmed (%s); asking again every %gs",
                            card_id,
                            exc,
                            FENCE_RETRIES[-1],
                        )
                    attempt += 1
                    await asyncio.sleep(wait)
                    continue
                self.lease.renewed(sent)
                if not ours:
                    return None
                if self.lease.holds(sent):
                    return sent
                # "Ours", but too late for this clock to vouch for the lease it renewed
                # (the statement waited past most of a lease): ask again, a prompt answer
                # can; a database that stays that slow gets the certain outcome instead.
                late += 1
                log.warning(
                    "card %s: lease confirmed only after %.1fs (%d of %d)",
                    card_id,
                    time.monotonic() - sent,
                    late,
                    LATE_FENCES,
                )
                if late >= LATE_FENCES:
                    return None
                await asyncio.sleep(FENCE_RETRIES[min(late, len(FENCE_RETRIES) - 1)])
        except asyncio.CancelledError:
            log.error(
                "card %s: stopping before the provider was called: nothing was sent "
                "(left executing; reconcile it as not sent)",
                card_id,
            )
            raise

    async def execute(self, card: Card, ctx: ToolContext) -> Card:
        """revalidate -> executing (one winner) -> execute(args_snapshot, operation_id);
        the card as it ends up (timed and traced as the ``execute`` span, logged)."""
        try:
            with span("execute", card_id=card.id, run_id=card.run_id, tool=card.tool):
                done = await self._execute(card, ctx)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():  # stopping
                raise
            # a tool let a cancellation out: the continuation is tried again, not ended
            raise Unavailable(f"executing card {card.id} was cancelled") from exc
        finally:
            self._started.discard(card.id)
        if card.id in self._theirs:
            self._theirs.discard(card.id)
        elif done.status is not Status.APPROVED:
            # Logged by the process that moved it (a card another one started, found done
            # here, is not "executed" twice in the logs: a hostile probe's false alarm).
            ids = {"card_id": card.id, "run_id": card.run_id, "thread_id": card.thread_id}
            log.info(
                "card %s", done.status, extra={**ids, "tool": card.tool, "status": done.status}
            )
        return done

    async def _execute(self, card: Card, ctx: ToolContext) -> Card:
        actor = self.actor
        tool = self.tools.get(card.tool)
        if tool is None:
            # Another version of the app proposed it: left approved for a worker that
            # serves the tool, never invalidated for a version skew (design note 21).
            raise UnknownTool(
                f"card {card.id} was approved for the tool {card.tool!r}, which this "
                "worker does not serve",
                tool=card.tool,
                card_id=card.id,
                run_id=card.run_id,
            )
        try:
            check = await slots.outside(tool.revalidate(card.args_snapshot, ctx), self.tool_timeout)
        except TRANSIENT as exc:  # not a verdict on the card: the run is continued later
            raise Unavailable(f"revalidating card {card.id}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # a tool's own failure must not wedge the run
            log.exception("revalidate failed for card %s", card.id)
            # The person (and the model) get a fixed reason; the error itself, which
            # may name internals, goes to the log and the audit row for operators.
            check_ok, changes = False, []
            reason: Label = REVALIDATION_FAILED
            detail: dict[str, Any] = {"reason": reason, "error": f"{type(exc).__name__}: {exc}"}
        else:
            check_ok, reason, changes = check.ok, check.reason, check.changes
            detail = {"reason": reason, "changes": changes}
        if not check_ok:
            moved = await self.store.move(
                card.id,
                Status.APPROVED,
                Status.INVALIDATED,
                actor=actor,
                result={"reason": reason, "changes": changes},
                detail=detail,
            )
            return await self.notify.moved(moved) or await self.store.get_card(card.id)
        if self.closing:  # left approved for the worker that takes the run over
            raise Unavailable(f"card {card.id} not started: this worker is stopping")
        began = time.monotonic()  # before the statement: a pause inside it counts too
        epoch = self._epoch()
        # Only while this worker holds the run (a worker's executor): one adopted while
        # it was held up is the adopter's to execute (design note 49).
        holder = actor.removeprefix("worker:") if self.lease is not None else None
        # Counted as started from before its statement, not once the hint after it went:
        # a stopping worker's drain waits for the cards it counts, and one cut between
        # its committed `executing` and its call was left for an operator, never sent.
        self._started.add(card.id)
        # A begin whose answer was lost is told from another's by its token (note 50).
        begun = await begin(self.store, card.id, actor, holder, self.in_flight())
        prompt = self._may_send(epoch, began)  # before the hint: a slow Redis is no pause
        if begun.moved is not None:
            await self.notify.moved(begun.moved)
        elif begun.ours:
            await self.notify.thread(card.thread_id)
        if not begun.ours:
            self._started.discard(card.id)
            if begun.card.status is Status.EXECUTING:
                # Another process started it first: a holder held up while the run was
                # adopted, whose statement predates the adoption. Left to it for a lease,
                # as a card found `executing` is (design note 49), not told unknown now.
                raise ExecutingElsewhere(f"card {card.id} was started by another process")
            self._theirs.add(card.id)
            return begun.card
        started = begun.card
        self.faults.hit("execute.after_start")
        unknown = False  # an attempt got no answer: the provider may have acted
        sent = True  # the outcome below is the provider's answer (not "nothing was sent")
        # Every attempt starts within most of a lease of `executing_since` (the begin, or
        # the last fence, which restarts it): with the tool deadline, that bounds how long
        # a call may be in flight, which a reconcile waits out (in_flight()).
        window = began
        for wait in (*UNKNOWN_OUTCOME_RETRIES, None):
            if not (prompt and self._may_send(epoch, window)):
                fenced_at = await self._fenced(card.id)
                if fenced_at is not None:
                    prompt, epoch, window = True, self._epoch(), fenced_at
            if not (prompt and self._may_send(epoch, window)):
                if not unknown:  # certain: nothing was sent
                    log.error("card %s: %s; recorded failed", card.id, NOT_SENT)
                    result, ok, sent = {"error": NOT_SENT}, False, False
                    break
                log.error("card %s: not confirmed ours between attempts; left executing", card.id)
                return await self._left_unknown(card, actor, "not confirmed ours between attempts")
            try:
                # I2: the frozen snapshot as read back from Postgres, never the model's arguments.
                # The deadline bounds the call, not the wait for a step slot after it.
                call = tool.execute(started.args_snapshot, started.operation_id, ctx)
                try:
                    answer = await slots.outside(call, self.tool_timeout)
                except asyncio.CancelledError:
                    log.error(CANCELLED_IN_CALL, card.id, started.operation_id, card.id)
                    raise
                ok = True  # the provider answered: whatever its answer holds, it acted
                self.faults.hit("execute.after_provider")
            except UNKNOWN_OUTCOME as exc:
                # No answer is not a failure: the provider may have acted. Ask again with the
                # same idempotency key; if it stays unknown, leave the card `executing` for
                # the sweeper to flag (I4) rather than record a failure that may be false.
                unknown = True
                if wait is None:
                    log.error("card %s: outcome still unknown (%s); left executing", card.id, exc)
                    return await self._left_unknown(card, actor, f"no answer: {exc!r}")
                log.warning("card %s: no answer (%r); asking again, same key", card.id, exc)
                await asyncio.sleep(wait)
                continue
            except Exception as exc:
                if unknown:
                    # After an attempt with no answer, a refusal of the repeat (a provider
                    # answering "that key is in use") does not say the first did nothing.
                    log.error("card %s: %r after an unknown outcome; left executing", card.id, exc)
                    return await self._left_unknown(card, actor, f"{exc!r} after no answer")
                log.warning("card %s failed: %s", card.id, exc)
                result, ok = outcomes.failed_result(exc), False
            else:
                result = outcomes.storable_result(answer)  # never raises
            break
        # The outcome is known now: recording it must not be lost to a passing store
        # timeout (the move is conditional, so a repeat is harmless).
        for attempt in itertools.count():
            try:
                finished = await self.store.finish_execution(
                    card.id, ok=ok, result=result, actor=actor
                )
                break
            except Unavailable as exc:
                wait = RECORD_RETRIES[min(attempt, len(RECORD_RETRIES) - 1)]
                log.warning(
                    "card %s: outcome not recorded yet (%s); again in %gs", card.id, exc, wait
                )
                try:
                    await asyncio.sleep(wait)
                except asyncio.CancelledError:  # stopping: say what only memory knew
                    log.error(
                        "card %s: stopping with its outcome unrecorded (left executing, "
                        "operation %s): ok=%s result=%s",
                        card.id,
                        started.operation_id,
                        ok,
                        result,
                    )
                    raise
        if finished is None and sent:
            await self._late_outcome(card, started.operation_id, ok, result, actor)
        return await self.notify.moved(finished) or await self.store.get_card(card.id)

    async def _left_unknown(self, card: Card, actor: str, why: str) -> Card:
        """A call this worker made stays unanswered: the card is left `executing` and
        flagged for an operator now (audited, while this worker holds the run), so that
        the model's "flagged for an operator" is true and `cards list --reconcile` shows
        it (the sweeper flagged it only after SIGNOFF_STUCK_AFTER_SECONDS). Never raises:
        the sweeper flags it later if this cannot."""
        if self.lease is not None:
            holder = actor.removeprefix("worker:")
            reason = f"the provider's answer is unknown ({why[:200]}); not asked again"
            try:
                if await self.store.flag_elsewhere(card.run_id, holder, [card.id], reason):
                    COUNTERS.inc("signoff_cards_flagged_total")
            except Exception as exc:
                log.warning("card %s: not flagged now (%s); the sweeper will", card.id, exc)
        return await self.store.get_card(card.id)

    async def _late_outcome(
        self, card: Card, operation_id: str, ok: bool, result: dict[str, Any], actor: str
    ) -> None:
        """The provider answered, but the card was no longer `executing` when the answer
        was to be recorded: an operator settled it while the call was in flight (or this
        worker's own record committed and its reply was lost, which the statement tells
        apart by the result). The answer must not vanish: it is logged, and written to the
        card's audit; one that contradicts the settled status (a charge made on a card
        settled `failed`) is an ERROR to settle with the provider by hand. Never raises:
        the log keeps the answer whatever the store does."""
        outcome = "succeeded" if ok else "failed"
        try:
            now = await self.store.late_outcome(card.id, outcome, result, actor)
        except Exception as exc:  # the log is then the only record
            log.error(
                "card %s: the provider answered (%s, operation %s, result %s) after the card "
                "was settled; its audit row was not written (%s)",
                card.id,
                outcome,
                operation_id,
                result,
                exc,
                extra={"card_id": card.id, "operation_id": operation_id},
            )
            return
        if now is None:  # recorded with this very answer already (a retried record), or gone
            log.info(
                "card %s: the provider answered (%s, operation %s, result %s): already "
                "recorded, or the card is gone (pruned)",
                card.id,
                outcome,
                operation_id,
                result,
                extra={"card_id": card.id, "operation_id": operation_id},
            )
            return
        contradicts = (now is Status.EXECUTED) != ok
        COUNTERS.inc("signoff_late_outcomes_total")
        log.log(
            logging.ERROR if contradicts else logging.WARNING,
            "card %s: the provider answered (%s, operation %s, result %s) after the card was "
            "settled %s%s",
            card.id,
            outcome,
            operation_id,
            result,
            now,
            "; they disagree: settle it with the provider by hand (README, Operating)"
            if contradicts
            else "",
            extra={"card_id": card.id, "operation_id": operation_id},
        )
