"""Workflow definitions: ordered steps and gates, as plain data (no I/O).

::

    from signoff import Workflow, WorkflowContext, await_event, await_human

    class Approval(msgspec.Struct):
        approved: bool
        note: str = ""

    async def extract(ctx: WorkflowContext) -> dict[str, Any]:
        return {"amount": 120}

    review = Workflow(
        "review",
        steps=[extract, await_human("approve the payout", schema=Approval, timeout=3 * 86400),
               pay],
    )

A step is an ``async def step(ctx) -> Mapping | None``: what it returns is merged into the
run's shared state, which later steps read as ``ctx.state``. A gate parks the run until a
person resumes it (:func:`await_human`) or an event is delivered (:func:`await_event`);
the gate's payload, validated against its msgspec schema, is merged into the state.

Other kinds of step (an agent step) subclass :class:`Step` and give the engine a handler
for their kind (``runtime/workflows/engine.py``, :meth:`WorkflowEngine.register`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, ClassVar

import msgspec

from signoff.runtime.errors import ConfigError, SignoffError

# State keys the engine owns: a payload or a step result carrying one is refused outright.
RESERVED_KEYS = frozenset({"steps", "input", "run_id", "status", "workflow"})


class WorkflowStatus(StrEnum):
    RUNNING = "running"
    AWAITING_HUMAN = "awaiting_human"
    AWAITING_EVENT = "awaiting_event"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_WORKFLOW = frozenset(
    {WorkflowStatus.RUNNING, WorkflowStatus.AWAITING_HUMAN, WorkflowStatus.AWAITING_EVENT}
)
PARKED_WORKFLOW = frozenset({WorkflowStatus.AWAITING_HUMAN, WorkflowStatus.AWAITING_EVENT})


@dataclass(frozen=True)
class WorkflowContext:
    """What a step sees: the run's shared state (read-only; return a mapping to change it),
    the run's validated input (an instance of the workflow's ``input`` type, or None), the
    run id, the principal who started it, the step's name and the app's services."""

    run_id: str
    workflow: str
    step: str
    principal: str
    tenant: str
    state: Mapping[str, Any]
    input: Any = None
    services: Any = None


StepFunction = Callable[[WorkflowContext], Awaitable[Mapping[str, Any] | None]]


class Step:
    """A step of a workflow. ``kind`` names how the engine runs it: ``function`` and the
    gates here; an extension kind (e.g. ``agent``) registers a handler with the engine."""

    kind: ClassVar[str] = "step"
    name: str

    def resume_payload(self, payload: Any) -> dict[str, Any]:
        """A resume payload for a wait this step parked at, validated (``InvalidInput``,
        ``ReservedKey``); what is recorded on the interrupt. An extension step that parks
        (e.g. on cards, with a decision map) overrides it."""
        from signoff.runtime.workflows.payload import validate

        return validate(None, payload)


@dataclass(frozen=True)
class FunctionStep(Step):
    """A plain async function; its returned mapping is merged into the state. At least
    once: a worker that dies after the function's side effect but before its completion
    is recorded runs it again (make side effects idempotent, e.g. keyed by ``run_id``)."""

    kind: ClassVar[str] = "function"
    fn: StepFunction
    name: str = ""


def seconds_of(value: float | timedelta | None, what: str) -> float | None:
    if value is None:
        return None
    out = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not out > 0:
        raise ConfigError(f"{what} must be positive, got {value!r}")
    return out


@dataclass(frozen=True)
class Gate(Step):
    """A wait: the run parks (a row in Postgres, nothing in a worker's memory) until
    resumed, an event arrives or its timeout passes."""

    schema: type[msgspec.Struct] | None = None
    timeout: float | None = None  # seconds
    timeout_response: Mapping[str, Any] | None = None
    name: str = ""

    def resume_payload(self, payload: Any) -> dict[str, Any]:
        from signoff.runtime.workflows.payload import validate

        return validate(self.schema, payload)

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of the payload (persisted on the interrupt for UIs)."""
        from signoff.runtime.workflows.payload import json_schema

        return json_schema(self.schema)


# What a human gate asks: a fixed text, or one written from the run's state when the
# gate opens (the amount to approve: a fixed "approve the payout" showed the person
# nothing of what they approved, a first-hour walkthrough).
Reason = str | Callable[[Mapping[str, Any]], str]
MAX_REASON = 4000  # characters of a reason written from the state


@dataclass(frozen=True)
class HumanGate(Gate):
    kind: ClassVar[str] = "human"
    reason: Reason = ""

    def reason_for(self, state: Mapping[str, Any]) -> str:
        """The reason shown when the gate opens on ``state`` (the app's function may
        raise: the run then fails at the gate, as a step that raises does)."""
        if isinstance(self.reason, str):
            return self.reason
        text = self.reason(state)
        if not isinstance(text, str) or not text.strip():
            raise SignoffError(f"the reason of gate {self.name!r} is not a text: {text!r}")
        return text[:MAX_REASON]


@dataclass(frozen=True)
class EventGate(Gate):
    kind: ClassVar[str] = "event"
    event: str = ""
    lookback: float | None = None  # seconds an early delivery is kept for this gate


def await_human(
    reason: Reason,
    *,
    schema: type[msgspec.Struct] | None = None,
    timeout: float | timedelta | None = None,
    timeout_response: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> HumanGate:
    """Park until a person resumes the run with a payload valid for ``schema`` (a msgspec
    Struct type; its declared fields are merged into the state, others are dropped).

    ``reason``: what the person is asked, a text or a function of the run's state
    called when the gate opens (``lambda s: f"Approve the payout of R$ {s['amount']}"``),
    so the form shows what is being approved.

    ``timeout`` (seconds or a timedelta): when it passes, the run resumes with
    ``timeout_response`` (validated like a person's answer, recorded as automatic), or,
    without one, fails at the gate (``retry`` re-arms the wait)."""
    return HumanGate(
        reason=reason,
        schema=schema,
        timeout=seconds_of(timeout, "await_human timeout"),
        timeout_response=dict(timeout_response) if timeout_response is not None else None,
        name=name or "",
    )


def await_event(
    event: str,
    *,
    schema: type[msgspec.Struct] | None = None,
    timeout: float | timedelta | None = None,
    timeout_response: Mapping[str, Any] | None = None,
    lookback: float | timedelta | None = None,
    name: str | None = None,
) -> EventGate:
    """Park until the event named ``event`` is delivered to the run; its payload, validated
    against ``schema``, is merged into the state.

    ``lookback`` (opt-in): an event delivered to the run up to this long before the run
    reaches the gate is kept and consumed when it does (an earlier one is not)."""
    if not event:
        raise ConfigError("await_event needs an event name")
    return EventGate(
        event=event,
        schema=schema,
        timeout=seconds_of(timeout, "await_event timeout"),
        timeout_response=dict(timeout_response) if timeout_response is not None else None,
        lookback=seconds_of(lookback, "await_event lookback"),
        name=name or "",
    )


def _as_step(item: Step | StepFunction) -> Step:
    if isinstance(item, Step):
        return item
    if callable(item) and inspect.iscoroutinefunction(item):
        return FunctionStep(fn=item, name=getattr(item, "__name__", "step"))
    raise ConfigError(f"a workflow step must be an async function or a Step, not {item!r}")


def _default_name(step: Step) -> str:
    if isinstance(step, EventGate):
        return f"event:{step.event}"
    if isinstance(step, HumanGate):
        return "await_human"
    return step.kind


@dataclass(frozen=True)
class Workflow:
    """A named sequence of steps and gates, registered with ``App(workflows=[...])``.

    ``input``: a msgspec Struct type the start payload is validated against (None: no
    input). Step names must be unique (unnamed gates get ``await_human``,
    ``event:<name>``, then ``#2``, ``#3``...)."""

    name: str
    steps: Sequence[Step | StepFunction]
    input: type[msgspec.Struct] | None = None
    _steps: tuple[Step, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from signoff.runtime.workflows.payload import check_schema, validate

        if not self.name:
            raise ConfigError("a workflow needs a name")
        if not self.steps:
            raise ConfigError(f"workflow {self.name!r} has no steps")
        steps: list[Step] = []
        seen: set[str] = set()
        for item in self.steps:
            step = _as_step(item)
            base = getattr(step, "name", "") or _default_name(step)
            name, n = base, 1
            while name in seen:
                n += 1
                name = f"{base}#{n}"
            seen.add(name)
            if name != getattr(step, "name", ""):
                object.__setattr__(step, "name", name)
            if isinstance(step, Gate):
                check_schema(step.schema, f"{self.name}.{name}")
                if step.timeout_response is not None:
                    try:
                        validate(step.schema, step.timeout_response)
                    except SignoffError as exc:
                        raise ConfigError(
                            f"workflow {self.name!r}, gate {name!r}: timeout_response is "
                            f"not valid for its schema: {exc.message}"
                        ) from exc
            steps.append(step)
        check_schema(self.input, f"{self.name} input")
        object.__setattr__(self, "_steps", tuple(steps))

    @property
    def step_list(self) -> tuple[Step, ...]:
        """The steps as the engine runs them (functions wrapped, names unique)."""
        return self._steps

    def index_of(self, name: str) -> int:
        for i, step in enumerate(self._steps):
            if step.name == name:
                return i
        raise KeyError(name)

    def lookback_seconds(self, event: str) -> float:
        """The longest lookback of the gates that take ``event`` (0: none keeps it)."""
        return max(
            (
                s.lookback
                for s in self._steps
                if isinstance(s, EventGate) and s.event == event and s.lookback is not None
            ),
            default=0.0,
        )

    def lookback_steps(self, event: str) -> list[int]:
        """Indexes of the event gates named ``event`` that keep early deliveries."""
        return [
            i
            for i, s in enumerate(self._steps)
            if isinstance(s, EventGate) and s.event == event and s.lookback is not None
        ]

    def shape(self) -> list[dict[str, Any]]:
        """What processes must agree on (App.fingerprint): each step's name, kind and
        payload schema."""
        out: list[dict[str, Any]] = []
        for s in self._steps:
            item: dict[str, Any] = {"name": s.name, "kind": s.kind}
            if isinstance(s, Gate):
                item["schema"] = s.json_schema()
            if isinstance(s, EventGate):
                item["event"] = s.event
            out.append(item)
        return out
