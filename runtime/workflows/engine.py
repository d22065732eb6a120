"""The worker side of workflows: run a run's steps, open its gates, time gates out.

A gate is a wait, as a card is, but a parked workflow run keeps nothing in a worker's
memory: it is a row (status ``awaiting_*``) and an open interrupt in Postgres. When a
gate is passed (a resume or an event at any gateway, the sweeper's timeout) the
resolution is committed first, then the run's live holder is signalled on its channel
(``CardSignal.run_id``) or, with none, the run goes on the inbox; the worker that gets
it claims the run (``wf_claim``) and runs its next steps. A missed signal costs latency
only: each worker's poll finds running runs it holds, and a lapsed holder's running runs
are adopted (Postgres is the truth, design note 26).

Steps run at least once: a step's completion (state merge, step + 1) is one statement,
so a completed step never runs again; a worker that dies after a step's side effect but
before its completion runs it again on the next worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from types import MappingProxyType
from typing import Any

from signoff.runtime.backoff import doubling
from signoff.runtime.bus import Bus
from signoff.runtime.config import Settings
from signoff.runtime.errors import (
    ExecutingElsewhere,
    RunInactive,
    SignoffError,
    Unavailable,
    error_text,
)
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS, LatencySamples
from signoff.runtime.notify import wake_workflow
from signoff.runtime.store import WorkflowStore
from signoff.runtime.workflows.definition import (
    EventGate,
    FunctionStep,
    Gate,
    HumanGate,
    Step,
    Workflow,
    WorkflowContext,
    WorkflowStatus,
)
from signoff.runtime.workflows.payload import decode_input, step_update, validate
from signoff.runtime.workflows.records import GateOpening, Interrupt, WorkflowRun

log = logging.getLogger("signoff.workflows")

# What a step of an extension kind is run by: its result is merged into the state, or a
# GateOpening parks the run at this step (resolved like a gate: payload merged, step + 1).
StepHandler = Callable[[Step, WorkflowContext], Awaitable[Mapping[str, Any] | GateOpening | None]]
Spawn = Callable[[Coroutine[Any, Any, Any]], Any]

# Extension step kinds, registered at import time by the module that defines the step
# (``register_step_kind("agent", factory)``): every engine built afterwards runs steps of
# that kind with ``factory(engine)``. The engine's ``host`` is its worker (its agent, its
# store), for handlers that need more than the workflow store.
STEP_KINDS: dict[str, Callable[[WorkflowEngine], StepHandler]] = {}


def register_step_kind(kind: str, factory: Callable[[WorkflowEngine], StepHandler]) -> None:
    """Have every engine built from now on run steps of ``kind`` with ``factory(engine)``."""
    STEP_KINDS[kind] = factory


def opening(step: Gate, state: Mapping[str, Any]) -> GateOpening:
    """The gate as it opens on the run's ``state`` (a human gate's reason may be written
    from it)."""
    return GateOpening(
        kind=step.kind,
        step_name=step.name,
        reason=step.reason_for(MappingProxyType(dict(state)))
        if isinstance(step, HumanGate)
        else None,
        schema=step.json_schema(),
        event=step.event if isinstance(step, EventGate) else None,
        timeout=step.timeout,
        timeout_response=dict(step.timeout_response) if step.timeout_response else None,
        lookback=step.lookback if isinstance(step, EventGate) else None,
    )


async def run_function(step: Step, ctx: WorkflowContext) -> Mapping[str, Any] | None:
    assert isinstance(step, FunctionStep)
    return await step.fn(ctx)


UNAVAILABLE_FIRST, UNAVAILABLE_MOST = 1.0, 30.0  # seconds before a run is tried again


class WorkflowEngine:
    """Runs workflow steps on one worker (``Worker.workflows``)."""

    def __init__(
        self,
        *,
        store: WorkflowStore,
        bus: Bus,
        keys: Keys,
        settings: Settings,
        app: str,
        workflows: Mapping[str, Workflow],
        worker_id: str,
        services: Any,
        spawn: Spawn,
        host: Any = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.keys = keys
        self.settings = settings
        self.app = app
        self.workflows = dict(workflows)
        self._names = sorted(self.workflows)
        self.worker_id = worker_id
        self.services = services
        self._spawn = spawn
        self.host = host  # the Worker, for extension handlers (its agent, notifier, store)
        self.handlers: dict[str, StepHandler] = {"function": run_function}
        for kind, factory in STEP_KINDS.items():
            self.handlers[kind] = factory(self)
        self._inflight: set[str] = set()
        self._again: set[str] = set()
        # Run -> how many times in a row its steps met Unavailable, and until when (loop
        # time) the poll leaves it alone: retried after a pause that doubles up to
        # UNAVAILABLE_MOST. A step whose provider never recovered was tried again at
        # every poll tick (~20 a second in tests), a warning each time: a review.
        self._unavailable: dict[str, tuple[int, float]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}  # a run's next wake-up, if set
        self._stopping = False
        self._reclaimed = False  # our own runs taken back once (a restart with a stable id)
        # Signal received (gateway's wall clock at the resolution) -> the next step starts.
        self.wake_latency_ns = LatencySamples(maxlen=100_000)

    @classmethod
    def of(cls, worker: Any) -> WorkflowEngine:
        """The engine of a :class:`~signoff.runtime.worker.Worker` (its store, bus, app)."""
        return cls(
            store=worker.store.workflows,
            bus=worker.bus,
            keys=worker.keys,
            settings=worker.settings,
            app=worker.app.name,
            workflows=worker.app.workflow_map(),
            worker_id=worker.worker_id,
            services=worker.app.services,
            spawn=worker.spawn,
            host=worker,
        )

    @property
    def in_flight(self) -> int:
        """Runs whose steps run here now (a parked run is not one: it holds nothing)."""
        return len(self._inflight)

    async def resolution(self, run_id: str, step: int) -> Interrupt | None:
        """The latest resolved interrupt of the run at ``step``: what a re-entered extension
        step (``GateOpening(reenter=True)``) was resumed with."""
        found = [
            i
            for i in await self.store.interrupts(run_id)
            if i.step == step and i.status == "resolved"
        ]
        return found[-1] if found else None

    def register(self, kind: str, handler: StepHandler) -> None:
        """Run steps of ``kind`` (a :class:`Step` subclass's ``kind``) with ``handler``."""
        self.handlers[kind] = handler

    # -- waking ------------------------------------------------------------------------

    def wake(self, run_id: str, at_ns: int = 0) -> None:
        """Continue the run (a signal, an inbox entry, the poll): claim it and run its next
        steps, unless it is being run here already (then it is looked at again after)."""
        if self._stopping:
            return
        if run_id in self._inflight:
            self._again.add(run_id)
            return
        self._inflight.add(run_id)
        self._spawn(self._drive(run_id, at_ns))

    async def _drive(self, run_id: str, at_ns: int) -> None:
        try:
            while True:
                self._again.discard(run_id)
                await self._advance(run_id, at_ns)
                at_ns = 0
                if run_id not in self._again or self._stopping:
                    break
        finally:
            self._inflight.discard(run_id)
            self._again.discard(run_id)

    def _later(self, run_id: str, delay: float) -> None:
        """Wake the run after ``delay``, instead of any wake-up set for it before (a
        review: timers left from earlier failures fired during a later, longer pause)."""
        if self._stopping:
            return
        earlier = self._timers.pop(run_id, None)
        if earlier is not None:
            earlier.cancel()
        loop = asyncio.get_running_loop()
        self._timers[run_id] = loop.call_later(delay, self._timer_fired, run_id)

    def _timer_fired(self, run_id: str) -> None:
        self._timers.pop(run_id, None)
        self.wake(run_id)

    async def _advance(self, run_id: str, at_ns: int) -> None:
        try:
            run = await self.store.claim(run_id, self.worker_id, self.app, self._names)
            if run is None:
                self._unavailable.pop(run_id, None)
                return  # not running, or a live worker holds it
            if at_ns:
                self.wake_latency_ns.append(time.time_ns() - at_ns)
            await self._steps(run)
            self._unavailable.pop(run_id, None)
        except RunInactive:
            self._unavailable.pop(run_id, None)
            return  # cancelled or taken over while a step ran: nothing more to do here
        except ExecutingElsewhere as exc:  # an agent step's card: a lease at most (note 49)
            log.info("workflow run %s: %s; continuing it later", run_id, exc)
            self._later(run_id, 2.0)
        except Unavailable as exc:
            tries = self._unavailable.get(run_id, (0, 0.0))[0]
            delay = doubling(UNAVAILABLE_FIRST, tries, UNAVAILABLE_MOST)
            rest = asyncio.get_running_loop().time() + delay
            self._unavailable[run_id] = (tries + 1, rest)
            log.warning("workflow run %s: %s; continuing it in %.0f s", run_id, exc, delay)
            self._later(run_id, delay)
        except Exception:  # a bug: the run stays running here; looked at again later
            log.exception("workflow run %s: continuing it failed; again in 5s", run_id)
            self._later(run_id, 5.0)

    async def _steps(self, run: WorkflowRun) -> None:
        workflow = self.workflows.get(run.workflow)
        if workflow is None:
            await self.store.fail_run(run.id, self.worker_id, f"unknown workflow {run.workflow!r}")
            return
        steps = workflow.step_list
        n = len(steps)
        while run.status is WorkflowStatus.RUNNING and not self._stopping:
            if run.step >= n:
                error = f"workflow {run.workflow!r} has no step {run.step} (its definition shrank)"
                await self.store.fail_run(run.id, self.worker_id, error)
                return
            step = steps[run.step]
            if isinstance(step, Gate):
                try:
                    opened = opening(step, run.state)
                except Exception as exc:  # the app's reason function: as a step's failure
                    log.warning("workflow run %s: gate %r failed: %r", run.id, step.name, exc)
                    await self.store.fail_run(
                        run.id, self.worker_id, f"gate {step.name!r} failed: {error_text(exc)}"
                    )
                    return
                run, _ = await self.store.open_gate(run.id, self.worker_id, run.step, opened, n)
                continue
            handler = self.handlers.get(step.kind)
            try:
                if handler is None:
                    raise SignoffError(f"no handler for steps of kind {step.kind!r}")
                result = await handler(step, self._context(workflow, run, step))
                if isinstance(result, GateOpening):
                    run, _ = await self.store.open_gate(run.id, self.worker_id, run.step, result, n)
                    continue
                update = step_update(result, step.name)
            except (Unavailable, RunInactive):
                raise
            except Exception as exc:
                log.warning("workflow run %s: step %r failed: %r", run.id, step.name, exc)
                COUNTERS.inc("signoff_workflow_steps_failed_total")
                await self.store.fail_run(
                    run.id, self.worker_id, f"step {step.name!r} failed: {error_text(exc)}"
                )
                return
            run = await self.store.complete_step(
                run.id, self.worker_id, run.step, step.name, update, n
            )

    def _context(self, workflow: Workflow, run: WorkflowRun, step: Step) -> WorkflowContext:
        return WorkflowContext(
            run_id=run.id,
            workflow=run.workflow,
            step=step.name,
            principal=run.owner,
            tenant=run.tenant,
            state=MappingProxyType(dict(run.state)),
            input=decode_input(workflow.input, run.input),
            services=self.services,
        )

    # -- the loop: adoption, missed signals, timeouts --------------------------------------

    @property
    def every(self) -> float:
        """Seconds between two :meth:`tick` (the worker's ``workflows`` loop, ticks.py)."""
        return max(min(self.settings.sweep_seconds, self.settings.poll_seconds), 0.05)

    async def step(self, _tick: int = 0) -> None:
        """One tick of the worker's ``workflows`` loop: :meth:`tick`, reclaiming our own
        runs until that has once succeeded."""
        await self.tick(own=not self._reclaimed)
        self._reclaimed = True

    async def tick(self, *, own: bool = False) -> None:
        """Adopt running runs nobody live holds (``own``: the first tick also reclaims
        ours), pick up running runs we hold but do not run (a missed signal), time out
        gates whose deadline passed (database clock)."""
        for run_id in await self.store.adopt_workflow_runs(
            self.worker_id,
            self.settings.lease_seconds,
            self.app,
            self._names,
            self.settings.adopt_batch,
            own=own,
        ):
            self.wake(run_id)
        self.recheck_ids(await self.store.due_runs(self.worker_id))
        await self.sweep()

    def recheck_ids(self, run_ids: list[str]) -> None:
        now = asyncio.get_running_loop().time()
        for run_id in run_ids:
            resting = run_id in self._unavailable and self._unavailable[run_id][1] > now
            if run_id not in self._inflight and not resting:  # a signal still wakes it
                self.wake(run_id)

    async def recheck(self) -> None:
        """After a (re)subscribe: signals may have been missed."""
        if not self.workflows:
            return
        try:
            self.recheck_ids(await self.store.due_runs(self.worker_id))
        except SignoffError as exc:
            log.warning("workflow recheck failed: %s", exc)

    async def sweep(self) -> int:
        """Gates whose deadline passed: resolved with their timeout response (automatic,
        ``system:timeout``) or failed; returns how many were settled here."""
        settled = 0
        for interrupt_id, run_id in await self.store.overdue_interrupts(self.app, self._names):
            try:
                run = await self.store.get_workflow_run(run_id)
            except SignoffError:
                continue
            workflow = self.workflows.get(run.workflow)
            if workflow is None:
                continue  # another version of the app serves it
            steps = workflow.step_list

            def response_for(
                intr: Interrupt, steps: tuple[Step, ...] = steps
            ) -> dict[str, Any] | None:
                if intr.timeout_response is None:
                    return None
                gate = steps[intr.step] if intr.step < len(steps) else None
                schema = gate.schema if isinstance(gate, Gate) else None
                return validate(schema, intr.timeout_response)

            passed = await self.store.time_out(
                interrupt_id, run_id, response_for=response_for, n_steps=len(steps)
            )
            if passed is None:
                continue
            settled += 1
            COUNTERS.inc("signoff_workflow_gates_timed_out_total")
            if passed.run.status is WorkflowStatus.RUNNING:
                if passed.holder_live and passed.run.holder != self.worker_id:
                    await wake_workflow(
                        self.bus,
                        self.keys,
                        run_id,
                        passed.run.holder,
                        tenant=passed.run.tenant,
                        owner=passed.run.owner,
                    )
                else:
                    self.wake(run_id)
        return settled

    def reopen(self) -> None:
        """Take wakes again (the worker was started again after a stop)."""
        self._stopping = False
        self._unavailable.clear()  # the runs are adopted afresh: no pause carried over

    def stop(self) -> None:
        """Take no more wakes (the worker drains the steps in flight, then releases its
        runs: ``release_workflow_runs``)."""
        self._stopping = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
