"""Durable workflows: steps and gates (a gate is a wait, like a card's).

``definition`` and ``payload`` are pure; ``engine`` runs steps on a worker; ``service``
holds the operations a gateway calls (start, get, resume, deliver an event, retry,
cancel). Design note 25.
"""

from __future__ import annotations

from signoff.runtime.workflows.definition import (
    ACTIVE_WORKFLOW,
    PARKED_WORKFLOW,
    RESERVED_KEYS,
    EventGate,
    FunctionStep,
    Gate,
    HumanGate,
    Step,
    Workflow,
    WorkflowContext,
    WorkflowStatus,
    await_event,
    await_human,
)
from signoff.runtime.workflows.records import Interrupt, WorkflowRun

__all__ = [
    "ACTIVE_WORKFLOW",
    "PARKED_WORKFLOW",
    "RESERVED_KEYS",
    "EventGate",
    "FunctionStep",
    "Gate",
    "HumanGate",
    "Interrupt",
    "Step",
    "Workflow",
    "WorkflowContext",
    "WorkflowRun",
    "WorkflowStatus",
    "await_event",
    "await_human",
]
