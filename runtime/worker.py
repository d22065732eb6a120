"""The worker: consumes the inbox, runs turns, parks runs, resumes them.

Parked runs are plain futures keyed by card id (``runtime.waits``), each registered as an
expiring wait token on the bus. A decision reaches the worker on its channel; the slow poll
and every (re)subscribe re-read Postgres, so a lost message costs latency, never a decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Coroutine
from contextvars import Context, ContextVar
from datetime import UTC, datetime
from typing import Any

from signoff.runtime import logs, slots, telemetry
from signoff.runtime.agent import Agent
from signoff.runtime.app import App
from signoff.runtime.backoff import doubling
from signoff.runtime.bus import Bus, Delivery
from signoff.runtime.cards import Card
from signoff.runtime.config import Settings
from signoff.runtime.drain import stop as stop_worker
from signoff.runtime.errors import (
    ExecutingElsewhere,
    ModelUnavailable,
    NotFound,
    RunInactive,
    SignoffError,
    Unavailable,
    UnknownTool,
    error_text,
)
from signoff.runtime.faults import Faults
from signoff.runtime.handover import hand_over
from signoff.runtime.intake import Intake
from signoff.runtime.keys import Keys
from signoff.runtime.lease import LeaseClock
from signoff.runtime.metrics import COUNTERS, LatencySamples
from signoff.runtime.models.base import Model
from signoff.runtime.notify import quietly, signal_decoder
from signoff.runtime.poller import Poller
from signoff.runtime.records import ACTIVE_RUN, Run, RunStatus
from signoff.runtime.slots import StepSlots
from signoff.runtime.store import Store
from signoff.runtime.sweeper import Sweeper
from signoff.runtime.ticks import Ticks
from signoff.runtime.waits import WaitRegistry
from signoff.runtime.wakes import Wakes
from signoff.runtime.workflows.engine import WorkflowEngine

log = logging.getLogger("signoff.worker")
# Set in an adopted run's continuation (and what it spawns): it takes an adoption slot.
_ADOPTED: ContextVar[bool] = ContextVar("signoff_adopted", default=False)

# A message whose run could not be started because the store or the bus did not answer
# is tried again after these waits, then handed back to the inbox (delivered again later).
START_RETRIES = (0.2, 0.5, 1.0, 2.0)
# A continuation that raised anything but Unavailable is tried this many more times (it
# may have lost a race), then its run is settled as failed with the error for the client.
WAKE_ERROR_RETRIES = 2
SUBSCRIBE_SECONDS = 10.0  # a worker whose subscription is not live by then does not start


class Worker:
    def __init__(
        self, *, settings: Settings, store: Store, bus: Bus, app: App, model: Model
    ) -> None:
        self.settings = settings
        self.store = store
        self.bus = bus
        self.app = app
        self.keys = Keys(settings.key_prefix)
        self.worker_id = settings.worker_id
        self.waits = WaitRegistry(on_ready=self._on_ready)
        self.faults = Faults(settings.faults)
        kwargs: dict[str, Any] = {"system": app.system} if app.system else {}
        self.agent = Agent(
            store=store,
            bus=bus,
            tools=app.tools,
            policy=app.policy,
            model=model,
            worker_id=self.worker_id,
            keys=self.keys,
            services=app.services,
            lease_seconds=settings.lease_seconds,
            wait_grace_ms=settings.wait_grace_ms,
            park=self._park,
            unpark=self.waits.drop_run,
            faults=self.faults,
            **kwargs,
        )
        self.notify = self.agent.notify
        self.workflows = WorkflowEngine.of(self)  # workflow runs (runtime/workflows)
        self.sweeper = Sweeper(self)
        self.poller = Poller(self)
        self.tasks: set[asyncio.Task[Any]] = set()  # every step in flight
        self.loops: list[asyncio.Task[Any]] = []
        self.ticks = Ticks()
        self._subscribed = asyncio.Event()
        # Adopted runs' continuations take one of their own slots, then a step slot (a
        # batch of them must not queue ahead of every live decision); both are let go
        # while the step waits on the model or a provider.
        self._step_slots = StepSlots(settings.steps_in_flight)
        self._adopt_slots = StepSlots(max(settings.pool_size * 2, 4), within=self._step_slots)
        self.agent.step_slot = self._slot
        self._adopting = 0  # adopted runs not yet continued
        # First turns: the inbox is read for what this worker has room for (note 58).
        self.intake = Intake(
            bus, self.worker_id, settings.turns_in_flight, self._handle, self.spawn
        )
        self.draining = False
        # Gateway received the decision -> future resolved, ns (one machine's wall clock).
        self.decision_latency_ns = LatencySamples(maxlen=100_000)
        self._traces: dict[str, str] = {}  # run -> traceparent of its decision
        self.lease_every = min(max(settings.lease_seconds / 3, 0.2), 2.0)
        self.lease = LeaseClock(  # the provider is called while it holds
            settings.lease_seconds, lambda: self.spawn(self.poller.let_go_of_taken())
        )
        self.wakes = Wakes(self.spawn, self.wake, lambda: self.draining)  # every continuation
        self.agent.executor.tool_timeout = settings.tool_timeout_seconds

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe first (and wait for it), then adopt runs, then take work (a stopped
        worker may be started again)."""
        self.draining, self.agent.accepting, self.agent.executor.closing = False, True, False
        self._subscribed.clear()  # the new subscription is waited for below
        self.workflows.reopen()
        self.loops.append(asyncio.create_task(self._listen(), name="signoff-listen"))
        try:  # no decision can reach it without its bus: said, not a traceback
            await asyncio.wait_for(self._subscribed.wait(), SUBSCRIBE_SECONDS)
        except TimeoutError:
            raise Unavailable(
                f"Redis did not answer within {SUBSCRIBE_SECONDS:.0f}s: a worker does not "
                "start without its bus (the log above says why); start it again once "
                "Redis answers"
            ) from None
        with contextlib.suppress(SignoffError):  # else the lease tick renews it
            await self.renew()
        self.agent.executor.lease = self.lease
        await self.adopt(own=True)  # a restarted worker with a stable id reclaims its runs now
        s = self.settings
        self.loops.append(
            asyncio.create_task(self.intake.run(lambda: self.draining), name="signoff-inbox")
        )
        self.ticks = Ticks()  # a stopped worker's loops stay stopped; a start gets new ones
        self.ticks.every("lease", self.lease_every, lambda _: self._lease_tick(), now=True)
        self.ticks.every("heartbeat", self.lease_every, lambda _: self._heartbeat(), now=True)
        self.ticks.every("poll", s.poll_seconds, lambda tick: self.poll(tick))
        self.ticks.every("sweep", s.sweep_seconds, lambda _: self.sweep())
        if self.workflows.workflows:  # an app without workflows costs nothing here
            self.ticks.every("workflows", self.workflows.every, self.workflows.step, now=True)

    async def stop(self, *, drain: bool = True, release: bool = True) -> None:
        """Stop taking work, finish in-flight steps, hand parked runs over (release leases;
        ``release=False`` leaves tokens and leases as they are, like a crash would)."""
        await stop_worker(self, drain=drain, release=release)

    def spawn(
        self, coro: Coroutine[Any, Any, Any], context: Context | None = None
    ) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, context=context)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def busy(self) -> bool:
        return bool(self.tasks)

    async def idle(self, timeout: float = 10.0) -> None:
        """Wait until no step is in flight (tests and burst mode)."""
        deadline = time.monotonic() + timeout
        while self.tasks and time.monotonic() < deadline:
            await asyncio.wait(list(self.tasks), timeout=deadline - time.monotonic())

    # -- running turns -------------------------------------------------------------

    async def run_message(
        self,
        thread_id: str,
        text: str,
        *,
        user: str,
        role: str = "user",
        channel: str = "http",
        message_id: str = "",
    ) -> Run | None:
        """Run a user message to its end or its park. An error settles the run (failed,
        with a ``run`` entry clients see) or, while it may pass, has it continued later.
        Raises only :class:`Unavailable` before the run exists: the caller tries again or
        hands the message back, so it is never lost (nor run twice: its run id derives
        from ``message_id``)."""
        message_id = message_id or f"local:{uuid.uuid4()}"
        try:
            return await self.agent.start(
                thread_id, text, user=user, role=role, channel=channel, message_id=message_id
            )
        except Exception as exc:
            return await self._after_error(thread_id, self.agent.run_id_for(message_id), exc)

    async def _after_error(self, thread_id: str, run_id: str, exc: Exception) -> Run | None:
        if isinstance(exc, UnknownTool):
            await self._hand_over(run_id, exc)
            return await self.store.get_run(run_id)
        COUNTERS.inc("signoff_handler_errors_total")
        transient = isinstance(exc, Unavailable)
        if transient:
            log.warning("message on thread %s: %s", thread_id, exc)
        else:
            log.error("message on thread %s failed", thread_id, exc_info=exc)
        try:
            run: Run | None = await self.store.get_run(run_id)
        except NotFound:
            run = None
        except Exception as away:
            # The store is away: the caller tries the message again (Unavailable is what
            # it retries and hands back; any other error would leave the entry held).
            if transient:
                raise exc from None
            raise Unavailable(f"{error_text(exc)}; its run could not be read: {away}") from exc
        if run is None:
            if transient:
                raise exc
            # Refused before its run existed (e.g. the thread is gone): tell the thread.
            body = {"error": error_text(exc), "message": "the message could not be run"}
            await quietly(
                self.store.append(thread_id, "error", body), "error entry", throttled=False
            )
            return None
        if run.status in ACTIVE_RUN and run.holder == self.worker_id:
            if transient:
                self.wakes.later(run.id, 0, 0.5)  # the step goes on once the store answers
            else:
                await self._settle_failed(run.id, exc)
                return await self.store.get_run(run.id)
        return run

    async def _settle_failed(self, run_id: str, exc: BaseException, attempt: int = 0) -> None:
        """Settle a run we hold as failed, with the error in its ``run`` entry; tried again
        later while the store does not answer. A run no longer ours is left alone."""
        self.waits.drop_run(run_id)
        try:
            run = await self.store.get_run(run_id)
            if run.status in ACTIVE_RUN and run.holder == self.worker_id:
                await self.agent._finish(run, RunStatus.FAILED, error_text(exc))
                COUNTERS.inc("signoff_runs_failed_by_error_total")
        except RunInactive:
            pass
        except Unavailable as again:
            delay = doubling(0.5, attempt, 30.0)
            log.warning("could not settle run %s (%s); again in %.1fs", run_id, again, delay)
            if not self.draining:
                asyncio.get_running_loop().call_later(
                    delay, lambda: self.spawn(self._settle_failed(run_id, exc, attempt + 1))
                )
        except Exception:
            log.exception("could not settle run %s", run_id)

    async def _handle(self, delivery: Delivery) -> None:
        """One inbox entry: run it, then ack it. Acked once its run exists (a redelivery
        finds that run, I5); handed back when it could not be started nor acked."""
        job = delivery.job
        if job.workflow_run:  # claimed by whoever runs it; adoption covers a crash after ack
            self.workflows.wake(job.workflow_run)
            await quietly(self.bus.ack(delivery.id), "inbox ack")
            return
        for wait in (*START_RETRIES, None):
            try:
                await self.run_message(
                    job.thread_id,
                    job.text,
                    user=job.user,
                    role=job.role,
                    channel=job.channel,
                    message_id=job.message_id or f"inbox:{delivery.id}",
                )
                break
            except Unavailable as exc:
                if wait is None or self.draining:
                    log.warning("inbox entry %s handed back: %s", delivery.id, exc)
                    COUNTERS.inc("signoff_inbox_released_total")
                    self.bus.release(delivery)
                    return
                await asyncio.sleep(wait)
            except Exception:
                # A bug on the error path: hand the entry back rather than hold it until
                # this process ends (a redelivery finds the run its message id names, I5).
                log.exception("inbox entry %s failed; handed back", delivery.id)
                COUNTERS.inc("signoff_inbox_released_total")
                self.bus.release(delivery)
                return
        self.faults.hit("inbox.before_ack")
        try:
            await self.bus.ack(delivery.id)
        except Exception as exc:
            log.warning("inbox entry %s done but not acked (%s); handed back", delivery.id, exc)
            COUNTERS.inc("signoff_inbox_released_total")
            self.bus.release(delivery)

    # -- parking and waking ---------------------------------------------------------

    async def _park(self, run: Run, pending: list[Card]) -> None:
        now = datetime.now(UTC)
        loop = asyncio.get_running_loop()
        left = min((c.expires_at - now).total_seconds() for c in pending)
        self.waits.park(run.id, [c.id for c in pending], loop.time() + max(left, 0.25) + 0.05)
        for card in pending:
            # The fallback of Notifier.card (the decision names our run's holder itself):
            # a Redis blip must not fail the step that parked.
            ttl_ms = int(max((card.expires_at - now).total_seconds(), 0) * 1000)
            ttl_ms += self.settings.wait_grace_ms
            await self.notify.set_wait(card.id, self.worker_id, ttl_ms)
        # A decision may have landed between the proposal and this registration (if the
        # store does not answer now, the slow poll looks again).
        with contextlib.suppress(SignoffError):
            await self._recheck([c.id for c in pending], "park")

    async def _recheck(self, card_ids: list[str], path: str) -> None:
        await self.poller.recheck(card_ids, path)

    async def poll(self, tick: int = 0) -> None:
        """One tick of the slow poll (runtime/poller.py)."""
        await self.poller.poll(tick)

    def _on_ready(self, run_id: str) -> None:
        trace = self._traces.pop(run_id, "") if self._traces else ""
        self.wakes.now(run_id, context=telemetry.context_of(trace))

    async def wake(self, run_id: str, attempt: int = 0) -> None:
        try:
            # Bounded (SIGNOFF_STEPS_IN_FLIGHT, agent.step_slot: taken under the run's lock):
            # steps past it would only queue for a pooled connection. A step waiting on the
            # model or a provider lets its slot go.
            logs.bind(run_id=run_id)  # this task's lines carry the run's id
            started = time.monotonic_ns()
            with telemetry.span("continue", run_id=run_id):
                run = await self.agent.continue_run(run_id)
            # The step's own time starts once it holds its slot.
            self.waits.woken.finished(run_id, max(started, slots.taken_ns()))
        except UnknownTool as exc:
            await self._hand_over(run_id, exc, attempt)
            return
        except Unavailable as exc:
            # The run is ours (we renew its lease) and no longer parked: unless we try
            # again, nobody continues it and its decisions wait for our restart (I6).
            delay = min(doubling(0.5, attempt, 30.0), exc.detail.get("retry_after", 30.0))
            level = logging.INFO if isinstance(exc, ExecutingElsewhere) else logging.WARNING
            log.log(level, "continuing run %s: %s; again in %.1fs", run_id, exc, delay)
            self.wakes.later(run_id, attempt + 1, delay)
            if isinstance(exc, ModelUnavailable):  # the chat said "working…" and nothing else
                self.spawn(self.notify.run_notice(run_id, "model_unavailable"))
            return
        except Exception as exc:
            COUNTERS.inc("signoff_handler_errors_total")
            if attempt < WAKE_ERROR_RETRIES:
                log.warning("continuing run %s raised %r; trying again", run_id, exc)
                self.wakes.later(run_id, attempt + 1, 0.2 * (attempt + 1))
                return
            log.error("continuing run %s failed; settling it as failed", run_id, exc_info=exc)
            await self._settle_failed(run_id, exc)
            return
        if run is None or run.status is not RunStatus.WAITING or run.holder != self.worker_id:
            self.waits.drop_run(run_id)

    async def _hand_over(self, run_id: str, exc: UnknownTool, attempt: int = 0) -> None:
        self.waits.drop_run(run_id)  # not invalidated: to a worker that serves it (handover.py)
        await hand_over(
            self.store, self.worker_id, self.app.name, run_id, exc, attempt, self.wakes.later
        )

    async def _listen(self) -> None:
        """Own the subscription loop: re-subscribe after any drop and re-read Postgres."""
        channel = self.keys.worker_channel(self.worker_id)
        while True:
            try:
                async with self.bus.subscribe(channel) as sub:
                    self._subscribed.set()
                    await self._recheck(self.waits.parked_cards(), "subscribe")
                    await self.workflows.recheck()
                    async for raw in sub:
                        try:
                            signal = signal_decoder.decode(raw)
                        except Exception:
                            log.warning("ignored a malformed signal on %s", channel)
                            continue
                        if signal.run_id:
                            self.workflows.wake(signal.run_id, signal.at_ns)
                            continue
                        if signal.trace and (run := self.waits.run_of(signal.card_id)):
                            self._traces[run] = signal.trace  # continued under its trace
                        if self.waits.resolve(signal.card_id, signal.status) and signal.at_ns:
                            self.decision_latency_ns.append(time.time_ns() - signal.at_ns)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("worker subscription dropped (%s); re-subscribing", exc)
                await asyncio.sleep(0.2)

    # -- leases and adoption -------------------------------------------------------------

    async def adopt(self, *, own: bool = False) -> list[str]:
        """Take over active runs whose lease lapsed and continue them from the store.

        At most ``adopt_batch`` adopted runs wait to be continued here at a time: the
        rest stay lapsed for the next tick, or for another worker with room."""
        room = self.settings.adopt_batch - self._adopting
        if room <= 0 or self.draining:
            return []
        sent = time.monotonic()
        runs = await self.store.adopt_runs(
            self.worker_id, self.settings.lease_seconds, room, own=own
        )
        self.lease.renewed(sent)  # the statement renewed this worker's lease too
        parked = set(self.waits.parked_runs())
        adopted = []
        for run in runs:
            # Taken (again): a card found executing gets a whole window (note 49).
            self.agent.executor.elsewhere.forget(run.id)
            if run.id in parked:
                continue
            adopted.append(run.id)
            self._adopting += 1
            self.wakes.begin(run.id)  # due: the sweep leaves it to this continuation
            self.spawn(self._adopted(run.id))
        COUNTERS.inc("signoff_runs_adopted_total", len(adopted))
        if adopted:
            log.info(
                "took over %d run(s) no live worker holds (let go by a worker that stopped, "
                "or held by one whose lease lapsed)",
                len(adopted),
            )
        return adopted

    async def _adopted(self, run_id: str) -> None:
        _ADOPTED.set(True)  # this task's continuation takes an adoption slot
        try:
            self.waits.woken.woke(run_id, "adoption")
            await self.wake(run_id)
        finally:
            self._adopting -= 1
            self.wakes.end(run_id)

    def _slot(self) -> slots.Slot:
        """The slot a continuation takes under its run's lock (Agent.step_slot): an
        adopted run's first takes an adoption slot, then a step slot; what it starts
        (a workflow's wake, a retry) is live work again."""
        if _ADOPTED.get():
            _ADOPTED.set(False)
            return self._adopt_slots.slot()
        return self._step_slots.slot()

    async def renew(self) -> None:
        sent = time.monotonic()
        await self.store.renew_leases(self.worker_id, self.settings.lease_seconds)
        self.lease.renewed(sent)

    async def _lease_tick(self) -> None:
        await self.renew()
        await self.adopt()

    async def _heartbeat(self) -> None:
        # Its own loop: a Redis that does not answer must not hold the lease's renewal.
        await self.bus.heartbeat(self.worker_id, int(self.lease_every * 3000))

    # -- sweeping (runtime/sweeper.py) ----------------------------------------------------

    async def sweep(self) -> tuple[list[Card], list[Card]]:
        """Expire overdue cards, settle approved cards nobody started, flag stuck ones."""
        return await self.sweeper.sweep()

    async def sweep_approved(self) -> list[Card]:
        return await self.sweeper.sweep_approved()
