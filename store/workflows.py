"""Workflow runs, their interrupts (gates) and events kept for a gate (design note 26).

Every change to a run locks the run row first (``wf_run_lock``), then its open
interrupt and its buffered events: a resolution, an event delivery, the engine opening a
gate, the sweeper timing one out, a retry and a cancel are each one transaction, so
whichever commits first wins and the others see the run as it left it (``NotParked``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from signoff.runtime.errors import (
    EventsFull,
    InvalidInput,
    NotParked,
    NotRetriable,
    RunInactive,
    WorkflowNotFound,
    WrongEvent,
)
from signoff.runtime.workflows.definition import PARKED_WORKFLOW, WorkflowStatus
from signoff.runtime.workflows.records import GateOpening, Interrupt, Passed, WorkflowRun
from signoff.store import rows
from signoff.store.connector import Conn, Connector, Row
from signoff.store.queries import SQL

if TYPE_CHECKING:
    from signoff.runtime.store import WorkflowStore

PayloadFor = Callable[[int], dict[str, Any]]
TIMEOUT_ACTOR = "system:timeout"
AWAITING = {"human": WorkflowStatus.AWAITING_HUMAN, "event": WorkflowStatus.AWAITING_EVENT}
_EXTRA = ("holder_live", "overdue", "interrupt")


def _run(row: Row) -> WorkflowRun:
    data = {k: v for k, v in dict(row).items() if k not in _EXTRA}
    return msgspec.convert(data, WorkflowRun)


def _interrupt(row: Row) -> Interrupt:
    data = {k: v for k, v in dict(row).items() if k not in _EXTRA}
    return msgspec.convert(data, Interrupt)


def _id(run_id: str) -> str:
    try:
        return rows.uuid_of(run_id)
    except Exception:
        raise WorkflowNotFound(f"no workflow run {run_id!r}", run_id=run_id) from None


async def _lock(conn: Conn, run_id: str) -> tuple[WorkflowRun, bool]:
    row = await conn.fetchrow(SQL.wf_run_lock, run_id)
    if row is None:
        raise WorkflowNotFound(f"no workflow run {run_id}", run_id=run_id)
    return _run(row), bool(row["holder_live"])


async def _open(conn: Conn, run_id: str) -> tuple[Interrupt, bool] | None:
    row = await conn.fetchrow(SQL.wf_interrupt_open_lock, run_id)
    return None if row is None else (_interrupt(row), bool(row["overdue"]))


async def _pass(
    conn: Conn,
    run: WorkflowRun,
    intr: Interrupt,
    payload: dict[str, Any],
    by: str,
    automatic: bool,
    n_steps: int,
) -> tuple[WorkflowRun, Interrupt]:
    row = await conn.fetchrow(SQL.wf_interrupt_resolve, intr.id, payload, by, automatic)
    resolved = _interrupt(rows.some(row))
    passed = await conn.fetchrow(
        SQL.wf_gate_passed, run.id, payload, intr.step_name, n_steps, intr.reenter
    )
    return _run(rows.some(passed)), resolved


def _not_parked(run: WorkflowRun, what: str) -> NotParked:
    return NotParked(
        f"workflow run {run.id} is {run.status}, not waiting for {what}",
        run_id=run.id,
        status=str(run.status),
    )


class WorkflowRows:
    """The :class:`~signoff.runtime.store.WorkflowStore` on Postgres."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    async def create_run(
        self, run_id: str, *, tenant: str, owner: str, app: str, workflow: str, input: Any
    ) -> tuple[WorkflowRun, bool]:
        """The new run, or the one with that id already (a retried start: the caller
        checks it is the same start) and False."""
        row = await self._db.fetchrow(
            SQL.wf_run_insert, run_id, tenant, owner, app, workflow, input
        )
        if row is None:
            return await self.get_workflow_run(run_id), False
        return _run(row), True

    async def create_run_within_quota(
        self,
        run_id: str,
        *,
        tenant: str,
        owner: str,
        app: str,
        workflow: str,
        input: Any,
        limit: int,
        window_seconds: float,
    ) -> tuple[WorkflowRun | None, bool, float]:
        """:meth:`create_run` unless ``owner`` started ``limit`` or more runs in the last
        ``window_seconds``: then ``(None, False, seconds until one leaves the window)``. A
        run that exists already (a retried start) is returned, never refused. One
        transaction under the user's quota lock: concurrent starts on any gateway cannot
        all see room for one more."""
        rid = _id(run_id)

        async def go(conn: Conn) -> tuple[WorkflowRun | None, bool, float]:
            await conn.execute(SQL.quota_user_lock, tenant, owner)
            found = await conn.fetchrow(SQL.wf_run_get, rid)
            if found is not None:
                return _run(found), False, 0.0
            recent = await conn.fetchrow(SQL.wf_runs_recent, tenant, owner, float(window_seconds))
            if recent is not None and recent["n"] >= limit:
                return None, False, max(float(recent["retry_after"] or 0.0), 0.0)
            row = await conn.fetchrow(SQL.wf_run_insert, rid, tenant, owner, app, workflow, input)
            if row is None:  # inserted meanwhile by a start that did not take the lock
                return _run(rows.some(await conn.fetchrow(SQL.wf_run_get, rid))), False, 0.0
            return _run(row), True, 0.0

        return await self._db.transaction(go)

    async def get_workflow_run(self, run_id: str) -> WorkflowRun:
        row = await self._db.fetchrow(SQL.wf_run_get, _id(run_id))
        if row is None:
            raise WorkflowNotFound(f"no workflow run {run_id}", run_id=run_id)
        return _run(row)

    async def interrupts(self, run_id: str) -> list[Interrupt]:
        return [_interrupt(r) for r in await self._db.fetch(SQL.wf_interrupts_of_run, _id(run_id))]

    async def list_workflow_runs(
        self,
        *,
        tenant: str | None = None,
        owner: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[WorkflowRun]:
        found = await self._db.fetch(SQL.wf_runs_list, tenant, owner, status, limit)
        return [_run(r) for r in found]

    async def list_agent_runs(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        return [dict(r) for r in await self._db.fetch(SQL.agent_runs_list, status, limit)]

    # -- the engine (worker side) ------------------------------------------------------

    async def claim(
        self, run_id: str, holder: str, app: str, workflows: list[str]
    ) -> WorkflowRun | None:
        """Hold a running run of one of ``workflows`` to run its next steps (None: not
        running, not served here, or held by a live worker other than ``holder``)."""
        row = await self._db.fetchrow(SQL.wf_claim, _id(run_id), holder, app, workflows)
        return None if row is None else _run(row)

    async def complete_step(
        self, run_id: str, holder: str, step: int, name: str, update: dict[str, Any], n_steps: int
    ) -> WorkflowRun:
        """Record step ``step`` done (state merge and step + 1, one statement); raises
        ``RunInactive`` if the run moved on meanwhile (cancelled, taken over)."""
        row = await self._db.fetchrow(SQL.wf_step_done, run_id, holder, step, update, name, n_steps)
        if row is None:
            raise RunInactive(f"workflow run {run_id} is no longer running here", run_id=run_id)
        return _run(row)

    async def fail_run(self, run_id: str, holder: str, error: str) -> WorkflowRun | None:
        row = await self._db.fetchrow(SQL.wf_fail, run_id, holder, error)
        return None if row is None else _run(row)

    async def open_gate(
        self, run_id: str, holder: str, step: int, gate: GateOpening, n_steps: int
    ) -> tuple[WorkflowRun, Interrupt]:
        """The run reached a gate: park it there (an open interrupt, status awaiting_*),
        or, for an event gate with a lookback, pass it at once with an event delivered
        within the window before (consumed). Raises ``RunInactive`` if the run is not
        running at ``step`` held by ``holder``."""

        async def go(conn: Conn) -> tuple[WorkflowRun, Interrupt]:
            run, _ = await _lock(conn, run_id)
            if run.status is not WorkflowStatus.RUNNING or run.holder != holder or run.step != step:
                raise RunInactive(f"workflow run {run_id} moved on", run_id=run_id)
            kept = None
            if gate.event is not None and gate.lookback is not None:
                kept = await conn.fetchrow(SQL.wf_event_take, run_id, gate.event, gate.lookback)
            args = (gate.step_name, gate.kind, gate.reason, gate.schema, gate.event)
            if kept is not None:
                row = await conn.fetchrow(
                    SQL.wf_interrupt_insert,
                    str(uuid.uuid4()),
                    run_id,
                    step,
                    *args,
                    None,
                    gate.timeout_response,
                    "resolved",
                    kept["payload"],
                    kept["delivered_by"],
                    False,
                    gate.detail,
                    gate.reenter,
                )
                intr = _interrupt(rows.some(row))
                passed = await conn.fetchrow(
                    SQL.wf_gate_passed,
                    run_id,
                    kept["payload"],
                    gate.step_name,
                    n_steps,
                    gate.reenter,
                )
                return _run(rows.some(passed)), intr
            row = await conn.fetchrow(
                SQL.wf_interrupt_insert,
                str(uuid.uuid4()),
                run_id,
                step,
                *args,
                gate.timeout,
                gate.timeout_response,
                "open",
                None,
                None,
                False,
                gate.detail,
                gate.reenter,
            )
            parked = await conn.fetchrow(SQL.wf_set_status, run_id, AWAITING[gate.kind], None)
            return _run(rows.some(parked)), _interrupt(rows.some(row))

        return await self._db.transaction(go)

    async def due_runs(self, holder: str, limit: int = 1000) -> list[str]:
        return [r["id"] for r in await self._db.fetch(SQL.wf_runs_due, holder, limit)]

    async def adopt_workflow_runs(
        self,
        holder: str,
        lease_seconds: float,
        app: str,
        workflows: list[str],
        limit: int = 1000,
        *,
        own: bool = False,
    ) -> list[str]:
        found = await self._db.fetch(
            SQL.wf_runs_adopt, holder, lease_seconds, limit, own, app, workflows
        )
        return [r["id"] for r in found]

    async def release_workflow_runs(self, holder: str) -> None:
        await self._db.execute(SQL.wf_release, holder)

    async def overdue_interrupts(
        self, app: str, workflows: list[str], limit: int = 500
    ) -> list[tuple[str, str]]:
        found = await self._db.fetch(SQL.wf_interrupts_overdue, limit, app, workflows)
        return [(r["id"], r["run_id"]) for r in found]

    # -- resolutions (any gateway, the sweeper) ------------------------------------------

    async def resolve_gate(
        self,
        run_id: str,
        *,
        kind: str,
        payload_for: PayloadFor,
        by: str,
        n_steps: int,
        automatic: bool = False,
    ) -> Passed:
        """Resolve the open ``kind`` gate of the run with a payload (validated for the gate
        the run waits at by ``payload_for``) and pass it: the interrupt records who and
        when, the payload is merged, the run runs again. ``NotParked`` if it waits at no
        such gate (another resolution won)."""
        rid = _id(run_id)

        async def go(conn: Conn) -> Passed:
            run, live = await _lock(conn, rid)
            if run.status is not AWAITING[kind]:
                raise _not_parked(run, f"a {kind} gate")
            found = await _open(conn, rid)
            if found is None:
                raise _not_parked(run, f"a {kind} gate")
            payload = payload_for(run.step)
            run, intr = await _pass(conn, run, found[0], payload, by, automatic, n_steps)
            return Passed(run=run, interrupt=intr, holder_live=live)

        return await self._db.transaction(go)

    async def pass_gate(
        self,
        run_id: str,
        *,
        status: WorkflowStatus,
        step: int,
        payload: dict[str, Any],
        by: str,
        n_steps: int,
        event: str | None = None,
        automatic: bool = False,
    ) -> Passed | None:
        """The fast path of a resolution, one statement: the run still parked with
        ``status`` at ``step`` passes its open gate (of ``event`` when given) with
        ``payload``. None if the run moved on meanwhile; then :meth:`resolve_gate` or
        :meth:`deliver_event` tell why, under locks."""
        row = await self._db.fetchrow(
            SQL.wf_pass_gate, _id(run_id), status, step, payload, by, automatic, event, n_steps
        )
        if row is None:
            return None
        intr = msgspec.convert(row["interrupt"], Interrupt)
        return Passed(run=_run(row), interrupt=intr, holder_live=bool(row["holder_live"]))

    async def deliver_event(
        self,
        run_id: str,
        name: str,
        *,
        payload_for: PayloadFor,
        lookback_steps: list[int],
        by: str,
        n_steps: int,
        kept_limit: int = 0,
        kept_window: float = 0.0,
        event_id: str | None = None,
    ) -> Passed:
        """Deliver event ``name``: pass the gate the run waits at if it waits for that
        event; else keep it if a gate at or after the run's step takes it with a lookback
        (``EventsFull`` when the run keeps ``kept_limit`` already, counting those of the
        last ``kept_window`` seconds; 0: no limit); else ``WrongEvent`` (it waits for
        another event) or ``NotParked``. An ``event_id`` delivered before applies nothing
        and is answered as it was (``repeated``; design note 65)."""
        rid = _id(run_id)

        async def go(conn: Conn) -> Passed:
            run, live = await _lock(conn, rid)
            seen = event_id and await conn.fetchrow(SQL.wf_event_id_get, rid, event_id)
            if seen and seen["name"] != name:
                raise InvalidInput(f"event_id {event_id!r} names another event of this run")
            if seen:  # delivered before: answered as it was, nothing applied
                was = {"buffered": bool(seen["kept"]), "repeated": True}
                return Passed(run=run, interrupt=None, holder_live=live, **was)
            passed = await deliver(conn, run, live)
            if event_id is not None:
                await conn.execute(SQL.wf_event_id_record, rid, event_id, name, passed.buffered)
            return passed

        async def deliver(conn: Conn, run: WorkflowRun, live: bool) -> Passed:
            found = await _open(conn, rid) if run.status in PARKED_WORKFLOW else None
            if found is not None and found[0].kind == "event" and found[0].event == name:
                payload = payload_for(run.step)
                run, intr = await _pass(conn, run, found[0], payload, by, False, n_steps)
                return Passed(run=run, interrupt=intr, holder_live=live)
            later = [i for i in lookback_steps if i > run.step or (i == run.step and found is None)]
            if run.status in (*PARKED_WORKFLOW, WorkflowStatus.RUNNING) and later:
                payload = payload_for(later[0])
                kept = SQL.wf_events_kept
                if kept_limit > 0 and await conn.fetchval(kept, rid, kept_window) >= kept_limit:
                    raise EventsFull(
                        f"workflow run {rid} keeps {kept_limit} events no gate has taken yet",
                        run_id=rid,
                        limit=kept_limit,
                    )
                await conn.execute(SQL.wf_event_insert, str(uuid.uuid4()), rid, name, payload, by)
                return Passed(run=run, interrupt=None, holder_live=live, buffered=True)
            if found is not None and found[0].kind == "event":
                raise WrongEvent(
                    f"workflow run {rid} waits for event {found[0].event!r}, not {name!r}",
                    run_id=rid,
                    expected=found[0].event,
                    got=name,
                )
            raise _not_parked(run, f"event {name!r}")

        return await self._db.transaction(go)

    async def time_out(
        self,
        interrupt_id: str,
        run_id: str,
        *,
        response_for: Callable[[Interrupt], dict[str, Any] | None],
        n_steps: int,
    ) -> Passed | None:
        """The gate's deadline passed (database clock): resolve it with its timeout
        response (``response_for``: validated, None without one) as ``system:timeout``,
        automatic; without one, the run fails at the gate. None if it was resolved first."""

        async def go(conn: Conn) -> Passed | None:
            run, live = await _lock(conn, run_id)
            found = await _open(conn, run_id)
            if found is None or found[0].id != interrupt_id or not found[1]:
                return None
            intr = found[0]
            try:
                response = response_for(intr)
                error = None
            except Exception as exc:  # a timeout response the schema refuses: fail at the gate
                response, error = None, f"timeout response refused: {exc}"
            if response is not None:
                run, intr = await _pass(conn, run, intr, response, TIMEOUT_ACTOR, True, n_steps)
                return Passed(run=run, interrupt=intr, holder_live=live)
            row = await conn.fetchrow(SQL.wf_interrupt_time_out, intr.id)
            reason = error or f"timed out at gate {intr.step_name!r}"
            failed = await conn.fetchrow(SQL.wf_set_status, run_id, WorkflowStatus.FAILED, reason)
            return Passed(
                run=_run(rows.some(failed)), interrupt=_interrupt(rows.some(row)), holder_live=live
            )

        return await self._db.transaction(go)

    async def retry_gate(
        self, run_id: str, *, timeout_for: Callable[[int], float | None]
    ) -> tuple[WorkflowRun, Interrupt]:
        """Re-arm the wait of a run that failed at a gate (timed out): a new open interrupt
        for the same gate with a fresh deadline; the run waits again."""
        rid = _id(run_id)

        async def go(conn: Conn) -> tuple[WorkflowRun, Interrupt]:
            run, _ = await _lock(conn, rid)
            last = await conn.fetchrow(SQL.wf_interrupt_last, rid, run.step)
            if (
                run.status is not WorkflowStatus.FAILED
                or last is None
                or last["status"] != "timed_out"
            ):
                raise NotRetriable(
                    f"workflow run {rid} is {run.status}, not failed at a gate", run_id=rid
                )
            old = _interrupt(last)
            row = await conn.fetchrow(
                SQL.wf_interrupt_insert,
                str(uuid.uuid4()),
                rid,
                old.step,
                old.step_name,
                old.kind,
                old.reason,
                old.schema,
                old.event,
                timeout_for(old.step),
                old.timeout_response,
                "open",
                None,
                None,
                False,
                old.detail,
                old.reenter,
            )
            parked = await conn.fetchrow(SQL.wf_set_status, rid, AWAITING[old.kind], None)
            return _run(rows.some(parked)), _interrupt(rows.some(row))

        return await self._db.transaction(go)

    async def cancel_run(self, run_id: str, by: str) -> WorkflowRun:
        """Cancel an active run (its open gate is cancelled too); ``RunInactive`` if over."""
        rid = _id(run_id)

        async def go(conn: Conn) -> WorkflowRun:
            run, _ = await _lock(conn, rid)
            if run.status not in (*PARKED_WORKFLOW, WorkflowStatus.RUNNING):
                raise RunInactive(f"workflow run {rid} is already {run.status}", run_id=rid)
            await conn.execute(SQL.wf_interrupts_cancel, rid, by)
            row = await conn.fetchrow(
                SQL.wf_set_status, rid, WorkflowStatus.CANCELLED, f"cancelled by {by}"
            )
            return _run(rows.some(row))

        return await self._db.transaction(go)


if TYPE_CHECKING:

    def _is_a_workflow_store(rows: WorkflowRows) -> WorkflowStore:
        return rows  # mypy checks the manager against the runtime's protocol here
