"""Agent steps: the agent loop as a workflow step; its tool approvals park the run.

::

    from signoff import Edit, Workflow, agent_step

    review = Workflow("review", steps=[
        extract,
        agent_step("risk", prompt="Assess the risks of {title}", tools=["flag_clause"]),
        ...,
    ])

The step runs the app's agent loop (``runtime/agent.py``) on a thread of its own, the
workflow's thread (:func:`workflow_thread_id`), as a user message ``prompt`` (a template
formatted with the run's state, or a function of the step's context). Reads run at
once; every write goes through the normal path (policy, a card with its snapshot hash,
``request_key``). When the model proposes writes, the run parks ``awaiting_human`` with
an interrupt that lists ALL the pending cards (its JSON schema: one property per card);
``resume({card_id: True | False | Edit({...})})`` decides them in one call. The map is
checkpointed on the interrupt before any decision is applied (the resume commits it),
then the worker applies it card by card through the normal decision path, idempotently:
after a crash the next worker applies it again and finds the decisions already taken,
and each card still executes at most once (I4). When the model ends its turn, the step's
result is merged into the state under the step's name: ``{"reply": text, "actions":
[{card_id, tool, summary, status}]}``. Design note 30. This module is the definition
(no I/O); the worker side is ``agent_runner.py``, registered here as the ``agent`` step kind.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from signoff.runtime.errors import ConfigError, InvalidInput
from signoff.runtime.text import some_names
from signoff.runtime.workflows.definition import RESERVED_KEYS, Step, WorkflowContext
from signoff.runtime.workflows.engine import StepHandler, WorkflowEngine, register_step_kind

# The interrupt's schema names the cards it lists under this key (a JSON schema extension).
CARDS_KEY = "x-signoff-cards"
KIND = "agent"


class Edit(msgspec.Struct, frozen=True):
    """An edit of a pending card in a decision map: ``Edit({"amount_cents": 900})``.

    The tool's editable fields only. The edit is applied like an edit on the card (a new
    card, prepared by the tool's own code, with a new summary and hash, the old one
    ``modified``); the resume then approves the new card, since the person supplied its
    values in this very decision (design note 30). On the wire: ``{"edit": {...}}``."""

    edit: dict[str, Any]


Prompt = str | Callable[[WorkflowContext], str]


@dataclass(frozen=True)
class AgentStep(Step):
    """Run the agent loop with ``prompt``, offering it ``tools`` (names of the app's tools;
    empty: all of them). See the module's documentation."""

    kind: ClassVar[str] = KIND
    prompt: Prompt
    tools: tuple[str, ...] = ()
    name: str = ""

    def resume_payload(self, payload: Any) -> dict[str, Any]:
        """A decision map's shape; the cards it names are checked against the open
        interrupt by the resume (``agent_decisions``) and again when it is applied."""
        return decision_map(payload)

    def render(self, ctx: WorkflowContext) -> str:
        if callable(self.prompt):
            text = self.prompt(ctx)
        else:
            try:
                text = self.prompt.format_map(dict(ctx.state))
            except (KeyError, IndexError, ValueError) as exc:
                raise InvalidInput(
                    f"agent step {self.name!r}: the prompt names {exc} not in the state"
                ) from exc
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput(f"agent step {self.name!r}: the prompt is empty")
        return text


def agent_step(name: str, *, prompt: Prompt, tools: Sequence[Any] = ()) -> AgentStep:
    """An agent step named ``name`` (its result lands in the state under that name).

    ``prompt``: a ``str.format`` template over the run's state, or ``fn(ctx) -> str``.
    ``tools``: the app's tools (or their names) the model is offered in this step;
    empty: every tool of the app. Writes are never executed without a decision."""
    if not name:
        raise ConfigError("an agent step needs a name")
    if name in RESERVED_KEYS:
        raise ConfigError(f"agent step name {name!r} is owned by the workflow engine")
    if not (callable(prompt) or (isinstance(prompt, str) and prompt.strip())):
        raise ConfigError(f"agent step {name!r}: prompt must be a non-empty str or a function")
    names = tuple(t if isinstance(t, str) else str(getattr(t, "name", "")) for t in tools)
    if any(not n for n in names):
        raise ConfigError(f"agent step {name!r}: tools must be tool names or Tool objects")
    return AgentStep(prompt=prompt, tools=names, name=name)


# -- the workflow's thread ---------------------------------------------------------------


def workflow_thread_id(run_id: str) -> str:
    """The thread an agent step of workflow run ``run_id`` talks on: the run's id with the
    UUID version set to 8 (custom). Threads made any other way are version 4, so a worker
    tells a workflow's thread from a chat's without a query (:func:`workflow_of_thread`)."""
    u = uuid.UUID(run_id)
    return str(uuid.UUID(int=(u.int & ~(0xF << 76)) | (0x8 << 76)))


def workflow_of_thread(thread_id: str) -> str | None:
    """The workflow run whose agent steps talk on this thread, or None (a chat's thread)."""
    try:
        u = uuid.UUID(thread_id)
    except ValueError:
        return None
    if u.version != 8:
        return None
    return str(uuid.UUID(int=(u.int & ~(0xF << 76)) | (0x4 << 76)))


def message_id(run_id: str, step: str) -> str:
    """The agent run of a step is derived from this (a second start finds it, I5)."""
    return f"workflow:{run_id}:{step}"


# -- the decision map ---------------------------------------------------------------------


def card_entry(card: Any) -> dict[str, Any]:
    """What the interrupt lists of a pending card (what a UI shows and decides on)."""
    return {
        "id": card.id,
        "tool": card.tool,
        "summary": card.summary,
        "impact": card.impact,
        "snapshot_hash": card.snapshot_hash,
        "editable": list(card.editable),
        "input": {k: card.input.get(k) for k in card.editable},
        "expires_at": card.expires_at.isoformat(),
    }


def decision_schema(cards: Sequence[Any]) -> dict[str, Any]:
    """The JSON schema of a decision map over ``cards``: per card, ``true`` (approve),
    ``false`` (reject) or ``{"edit": {field: value}}`` (its editable fields)."""
    props: dict[str, Any] = {}
    for card in cards:
        edit = {
            "type": "object",
            "properties": {"edit": {"type": "object", "propertyNames": {"enum": card.editable}}},
            "required": ["edit"],
            "additionalProperties": False,
        }
        choices: list[dict[str, Any]] = [{"type": "boolean"}]
        if card.editable:
            choices.append(edit)
        props[card.id] = {"title": card.summary, "description": card.tool, "anyOf": choices}
    return {
        "type": "object",
        "title": "Decisions",
        "properties": props,
        "additionalProperties": False,
        "minProperties": 1,
        CARDS_KEY: [card_entry(c) for c in cards],
    }


def listed_cards(schema: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The cards an agent interrupt's schema lists, by id."""
    return {c["id"]: c for c in schema.get(CARDS_KEY, []) if isinstance(c, dict)}


def decision_map(payload: Any) -> dict[str, Any]:
    """The shape of a decision map (``AgentStep.resume_payload``): a non-empty object whose
    values are ``true``, ``false`` or ``{"edit": {...}}``; ``InvalidInput`` otherwise."""
    payload = msgspec.to_builtins(payload)  # Edit structs -> {"edit": {...}}
    if not isinstance(payload, dict) or not payload:
        raise InvalidInput("a decision map is an object {card_id: true | false | {edit}}")
    out: dict[str, Any] = {}
    for card_id, value in payload.items():
        if isinstance(value, bool):
            out[card_id] = value
            continue
        edits = value.get("edit") if isinstance(value, dict) and len(value) == 1 else None
        if not isinstance(edits, dict) or not edits:
            raise InvalidInput(
                f"card {card_id}: a decision is true, false or {{'edit': {{...}}}}",
                card_id=card_id,
            )
        out[card_id] = {"edit": edits}
    return out


def parse_decisions(payload: Any, schema: Mapping[str, Any]) -> dict[str, Any]:
    """Check a decision map against the interrupt's cards: the JSON to checkpoint.

    ``InvalidInput`` (422, nothing changed) for a map that is not an object, is empty,
    names a card the interrupt does not list, or gives a card anything but ``true``,
    ``false`` or ``{"edit": {...}}`` with only that card's editable fields."""
    out = decision_map(payload)
    cards = listed_cards(schema)
    for card_id, value in out.items():
        card = cards.get(card_id)
        if card is None:
            raise InvalidInput(f"card {card_id} is not pending at this step", card_id=card_id)
        if isinstance(value, bool):
            continue
        edits = value["edit"]
        outside = sorted(set(edits) - set(card.get("editable", [])))
        if outside:
            raise InvalidInput(
                f"card {card_id}: fields not editable: {some_names(outside)}",
                card_id=card_id,
                editable=card.get("editable", []),
            )
    return out


async def agent_decisions(
    store: Any, workflow: Any, run: Any, payload: Any
) -> dict[str, Any] | None:
    """For ``WorkflowService.resume``: the checked decision map when ``run`` waits at an
    agent step's gate (None otherwise: an ordinary human gate). Raises ``InvalidInput``
    (422, nothing changed) for a map that does not fit the open interrupt's cards."""
    steps = workflow.step_list
    if not (0 <= run.step < len(steps) and isinstance(steps[run.step], AgentStep)):
        return None
    opened = [i for i in await store.interrupts(run.id) if i.status == "open"]
    if not opened:
        return None  # not parked: the store answers NotParked
    return parse_decisions(payload, opened[-1].schema)


def _handler(engine: WorkflowEngine) -> StepHandler:
    """The engine's handler of agent steps: :class:`AgentSteps` on its worker (host)."""
    from signoff.runtime.workflows.agent_runner import AgentSteps

    if engine.host is None:  # an engine without a worker: agent steps cannot run there

        async def no_worker(step: Step, ctx: WorkflowContext) -> None:
            raise ConfigError("agent steps run on a worker (this engine has no host)")

        return no_worker
    return AgentSteps.install(engine.host, engine).run


register_step_kind(KIND, _handler)
