"""The workflow operations a gateway calls: start, get, resume, deliver an event, retry,
cancel. Each validates first (a bad payload is a 422 that changes nothing), commits in
Postgres, then hints (``notify.wake_workflow``: the run's live holder on its channel,
else the inbox); a hint that fails never fails the call (Postgres has the resolution).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from signoff.runtime.app import App
from signoff.runtime.bus import Bus
from signoff.runtime.config import Settings
from signoff.runtime.errors import (
    Conflict,
    InvalidInput,
    NotOwner,
    RateLimited,
    WorkflowNotFound,
)
from signoff.runtime.keys import Keys
from signoff.runtime.notify import wake_workflow
from signoff.runtime.store import WorkflowStore
from signoff.runtime.workflows.agent_step import agent_decisions
from signoff.runtime.workflows.definition import (
    EventGate,
    Gate,
    Workflow,
    WorkflowStatus,
)
from signoff.runtime.workflows.payload import validate
from signoff.runtime.workflows.records import Interrupt, Passed, WorkflowRun

# Roles that may deliver events to any run of their tenant (an integration, an operator).
EVENT_ROLES = frozenset({"service", "admin"})
# The window of SIGNOFF_QUOTA_WORKFLOW_RUNS_PER_MINUTE.
RUNS_WINDOW_SECONDS = 60.0
# An event's own id, chosen by its sender (as a message's idempotency key).
EVENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,100}")


class CheckEdit(Protocol):
    async def __call__(
        self, card_id: str, edits: dict[str, Any], *, principal: str, tenant: str | None
    ) -> object: ...


class WorkflowService:
    """Workflow runs for authenticated principals (the caller authenticates; ``by`` is
    recorded as who resumed, delivered, retried or cancelled)."""

    def __init__(
        self,
        *,
        store: WorkflowStore,
        bus: Bus,
        keys: Keys,
        app: str,
        workflows: Mapping[str, Workflow],
    ) -> None:
        self.store = store
        self.bus = bus
        self.keys = keys
        self.app = app
        self.workflows = dict(workflows)
        # Per-user bounds (G14; 0: none): starts per minute, events kept per run.
        self.runs_per_minute = 0
        self.events_kept = 0
        # How an agent gate's edits are checked before its map is saved (the gateway's
        # ``Decisions.check_edit``: the tool's parse and prepare, the policy); None: only
        # the editable fields are.
        self.check_edit: CheckEdit | None = None

    @classmethod
    def of(
        cls, store: WorkflowStore, bus: Bus, keys: Keys, app: App, settings: Settings | None = None
    ) -> WorkflowService:
        """The service for ``app``'s workflows (with ``settings``' per-user bounds)."""
        service = cls(store=store, bus=bus, keys=keys, app=app.name, workflows=app.workflow_map())
        if settings is not None:
            service.runs_per_minute = settings.quota_workflow_runs_per_minute
            service.events_kept = settings.workflow_events_kept
        return service

    def workflow(self, name: str) -> Workflow:
        found = self.workflows.get(name)
        if found is None:
            served = sorted(self.workflows)
            raise WorkflowNotFound(
                f"no workflow named {name!r}; this app serves: "
                + (", ".join(served) if served else "none"),
                workflow=name,
                workflows=served,
            )
        return found

    async def _own(
        self, run_id: str, tenant: str, user: str, role: str = "user", *, event: bool = False
    ) -> WorkflowRun:
        """The run, if ``user`` of ``tenant`` owns it. Only an ``event`` may also come from
        a principal of the tenant with a role of :data:`EVENT_ROLES` (a payment provider's
        integration): reading, retrying and cancelling a run are its owner's alone, as
        deciding a card is (I3)."""
        run = await self.store.get_workflow_run(run_id)
        if run.tenant != tenant:
            raise WorkflowNotFound(f"no workflow run {run_id}", run_id=run_id)
        if run.owner != user and not (event and role in EVENT_ROLES):
            raise NotOwner("not your workflow run", run_id=run_id)
        return run

    async def _hint(self, passed: Passed | WorkflowRun, at_ns: int = 0) -> None:
        run = passed.run if isinstance(passed, Passed) else passed
        if run.status is not WorkflowStatus.RUNNING:
            return
        live = isinstance(passed, Passed) and passed.holder_live
        holder = run.holder if live else None
        await wake_workflow(
            self.bus, self.keys, run.id, holder, tenant=run.tenant, owner=run.owner, at_ns=at_ns
        )

    async def start(
        self,
        name: str,
        input: Any = None,
        *,
        tenant: str,
        owner: str,
        run_id: str | None = None,
    ) -> WorkflowRun:
        """Start a run of workflow ``name`` for ``owner``; ``input`` is validated against
        the workflow's input type (422 otherwise). Any worker runs its first steps.

        ``run_id`` (a version-4 UUID the client chose) makes the start idempotent: the same
        start again returns the same run; another start with that id is a ``Conflict``
        (409)."""
        workflow = self.workflow(name)
        data: Any = None
        if workflow.input is not None:
            try:
                data = msgspec.to_builtins(msgspec.convert(input or {}, workflow.input))
            except msgspec.ValidationError as exc:
                raise InvalidInput(f"invalid input: {exc}") from exc
        elif input:
            raise InvalidInput(f"workflow {name!r} takes no input")
        if run_id is not None:
            try:
                chosen = uuid.UUID(run_id)
            except (ValueError, TypeError, AttributeError):
                raise InvalidInput(f"run_id {run_id!r} is not a UUID") from None
            if chosen.version != 4:
                # A run's agent steps talk on a thread named by its id's other 122 bits
                # (agent_step.workflow_thread_id): another version would share it.
                raise InvalidInput(f"run_id {run_id!r} is not a random (version 4) UUID")
            run_id = str(chosen)
        run, created = await self._create(run_id or str(uuid.uuid4()), tenant, owner, name, data)
        if not created:
            same = (run.tenant, run.owner, run.workflow, run.input) == (tenant, owner, name, data)
            if not same and (run.tenant, run.owner) == (tenant, owner):
                raise Conflict(f"run {run.id} exists and is another start", run_id=run.id)
            if not same:  # another person's (or tenant's) run: nothing said about it
                raise Conflict(
                    f"run_id {run.id} cannot be used: leave it out, or choose another",
                    run_id=run.id,
                )
            return run  # a retried start: its first hint went out (or adoption has it)
        await self._hint(run)
        return run

    async def _create(
        self, run_id: str, tenant: str, owner: str, name: str, data: Any
    ) -> tuple[WorkflowRun, bool]:
        if self.runs_per_minute <= 0:
            return await self.store.create_run(
                run_id, tenant=tenant, owner=owner, app=self.app, workflow=name, input=data
            )
        limit = self.runs_per_minute
        run, created, wait = await self.store.create_run_within_quota(
            run_id,
            tenant=tenant,
            owner=owner,
            app=self.app,
            workflow=name,
            input=data,
            limit=limit,
            window_seconds=RUNS_WINDOW_SECONDS,
        )
        if run is None:
            raise RateLimited(
                f"more than {limit} workflow runs a minute; wait before starting another",
                retry_after=wait,
                quota="workflow_runs_per_minute",
                limit=limit,
            )
        return run, created

    async def get(
        self, run_id: str, *, tenant: str, user: str, role: str = "user"
    ) -> tuple[WorkflowRun, list[Interrupt]]:
        """The run and its interrupts (the open one, if any, is last)."""
        run = await self._own(run_id, tenant, user, role)
        return run, await self.store.interrupts(run.id)

    async def list(
        self, *, tenant: str, owner: str, status: str | None = None
    ) -> list[WorkflowRun]:
        return await self.store.list_workflow_runs(tenant=tenant, owner=owner, status=status)

    def _gate(self, workflow: Workflow, step: int) -> Gate | None:
        steps = workflow.step_list
        gate = steps[step] if 0 <= step < len(steps) else None
        return gate if isinstance(gate, Gate) else None

    async def resume(self, run_id: str, payload: Any, *, tenant: str, by: str) -> WorkflowRun:
        """Resume a run parked at a human gate with ``payload`` (validated against the
        gate's schema: a failing payload is 422 and the run stays parked; only declared
        fields reach the state; who and when are recorded on the interrupt). Of two
        racing resumes one wins, the other gets ``NotParked`` (409)."""
        at_ns = time.time_ns()
        run = await self._own(run_id, tenant, by)  # the owner only, as for cards (I3)
        workflow = self.workflow(run.workflow)
        # An agent step's gate: a decision map over the cards its interrupt lists, checked
        # here, checkpointed on the interrupt, applied by the step (design note 30).
        decisions = await agent_decisions(self.store, workflow, run, payload)
        if decisions is not None and self.check_edit is not None:
            for card_id, value in decisions.items():  # all of them before anything is saved
                if isinstance(value, dict):
                    await self.check_edit(card_id, value["edit"], principal=by, tenant=tenant)

        def payload_for(step: int) -> dict[str, Any]:
            if decisions is not None and step == run.step:
                return decisions
            steps = workflow.step_list
            if not 0 <= step < len(steps) or isinstance(steps[step], EventGate):
                return validate(None, payload)
            return steps[step].resume_payload(payload)  # a human gate's schema, or the step's

        n_steps = len(workflow.step_list)
        passed = None
        if run.status is WorkflowStatus.AWAITING_HUMAN:  # the fast path: one statement
            passed = await self.store.pass_gate(
                run.id,
                status=run.status,
                step=run.step,
                payload=payload_for(run.step),
                by=by,
                n_steps=n_steps,
            )
        if passed is None:  # it moved on (or never waited): decided, and told, under locks
            passed = await self.store.resolve_gate(
                run.id, kind="human", payload_for=payload_for, by=by, n_steps=n_steps
            )
        await self._hint(passed, at_ns)
        return passed.run

    async def deliver_event(
        self,
        run_id: str,
        name: str,
        payload: Any,
        *,
        tenant: str,
        by: str,
        role: str = "user",
        event_id: str | None = None,
    ) -> Passed:
        """Deliver event ``name`` to a run: passes the gate it waits at for that event, or
        is kept for a later gate with a lookback (``buffered``); else ``WrongEvent`` /
        ``NotParked`` (409). The payload is validated against that gate's schema.
        ``event_id``: the sender's own id for the event (1-100 of ``A-Za-z0-9._:-``):
        sent again, it applies nothing and is answered as the first was (``repeated``)."""
        at_ns = time.time_ns()
        if not isinstance(name, str) or not name:
            raise InvalidInput("an event needs a name")
        if event_id is not None and not (
            isinstance(event_id, str) and EVENT_ID.fullmatch(event_id)
        ):
            raise InvalidInput("event_id must be 1-100 letters, digits or . _ : - (a UUID fits)")
        run = await self._own(run_id, tenant, by, role, event=True)
        workflow = self.workflow(run.workflow)

        def payload_for(step: int) -> dict[str, Any]:
            gate = self._gate(workflow, step)
            return validate(gate.schema if gate is not None else None, payload)

        n_steps = len(workflow.step_list)
        gate = self._gate(workflow, run.step)
        passed = None
        if (
            event_id is None  # an id is recorded with the delivery, under the run's lock
            and run.status is WorkflowStatus.AWAITING_EVENT
            and isinstance(gate, EventGate)
            and gate.event == name
        ):  # the fast path: one statement
            passed = await self.store.pass_gate(
                run.id,
                status=run.status,
                step=run.step,
                payload=payload_for(run.step),
                by=by,
                n_steps=n_steps,
                event=name,
            )
        if passed is None:  # kept for a later gate, or refused: decided under locks
            passed = await self.store.deliver_event(
                run.id,
                name,
                payload_for=payload_for,
                lookback_steps=workflow.lookback_steps(name),
                by=by,
                n_steps=n_steps,
                kept_limit=self.events_kept,
                kept_window=workflow.lookback_seconds(name),
                event_id=event_id,
            )
        if not passed.repeated:
            await self._hint(passed, at_ns)
        return passed

    async def retry(self, run_id: str, *, tenant: str, by: str, role: str = "user") -> WorkflowRun:
        """Re-arm the wait of a run that failed at a gate (it timed out), with a fresh
        deadline; ``NotRetriable`` (409) otherwise."""
        run = await self._own(run_id, tenant, by, role)
        workflow = self.workflow(run.workflow)

        def timeout_for(step: int) -> float | None:
            gate = self._gate(workflow, step)
            return gate.timeout if gate is not None else None

        retried, _ = await self.store.retry_gate(run.id, timeout_for=timeout_for)
        return retried

    async def cancel(self, run_id: str, *, tenant: str, by: str, role: str = "user") -> WorkflowRun:
        """Cancel an active run (its open gate too); a step in flight is not recorded."""
        run = await self._own(run_id, tenant, by, role)
        return await self.store.cancel_run(run.id, by)
