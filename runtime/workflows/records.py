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
