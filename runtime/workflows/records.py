"""Workflow runs and their interrupts as the store returns them (plain records)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from signoff.runtime.workflows.definition import WorkflowStatus


class Interrupt(msgspec.Struct, frozen=True, kw_only=True):
    """One wait of a run at a gate: what it waits for and how it ended (the audit)."""

    id: str
    run_id: str
    step: int
    step_name: str
    kind: str  # human | event
    reason: str | None = None
    schema: dict[str, Any]  # JSON schema of the payload (from the gate's msgspec type)
    event: str | None = None
    deadline: datetime | None = None
    timeout_response: dict[str, Any] | None = None
    status: str  # open | resolved | timed_out | cancelled
    payload: dict[str, Any] | None = None
    resolved_by: str | None = None
    resolved_at: datetime | None = None
    automatic: bool = False
    # What an extension step parked with (e.g. an agent step's pending cards); None for gates.
    detail: dict[str, Any] | None = None
    # Passing it runs the same step again (an extension step's wait) instead of the next.
    reenter: bool = False
    created_at: datetime

    def public(self) -> dict[str, Any]:
        out = msgspec.to_builtins(self)
        assert isinstance(out, dict)
        return out


class WorkflowRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run of a workflow: where it stands (``status``, ``step`` = index of the next step
    to run or the gate it waits at), its shared ``state`` and its holder (the worker that
    runs it; None while nobody does)."""

    id: str
    tenant: str
    owner: str
    app: str
    workflow: str
    status: WorkflowStatus
    step: int
    state: dict[str, Any]
    input: Any = None
    steps: list[dict[str, Any]] = msgspec.field(default_factory=list)  # completed, in order
    holder: str | None = None
    error: str | None = None
    created_at: datetime
    updated_at: datetime

    def public(self) -> dict[str, Any]:
        out = msgspec.to_builtins(self)
        assert isinstance(out, dict)
        out.pop("holder", None)
        return out


class GateOpening(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine writes when a run reaches a gate (``open_gate``)."""

    kind: str
    step_name: str
    reason: str | None
    schema: dict[str, Any]
    event: str | None
    timeout: float | None
    timeout_response: dict[str, Any] | None
    lookback: float | None
    detail: dict[str, Any] | None = None  # kept on the interrupt (an extension step's own)
    # True: once resolved, the step that parked runs again (it reads the resolution from
    # its interrupt) instead of the run moving to the next step with the payload merged.
    reenter: bool = False


class Passed(msgspec.Struct, frozen=True, kw_only=True):
    """A gate's resolution (or an event's delivery) as committed: the run after it, the
    interrupt (None for an event kept for a later gate), whether the run's holder is live
    (else any worker continues it: the inbox) and whether the event was only kept."""

    run: WorkflowRun
    interrupt: Interrupt | None
    holder_live: bool
    buffered: bool = False
    repeated: bool = False  # an event id delivered before: nothing applied now
