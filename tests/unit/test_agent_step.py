"""Agent steps, the pure part: definition checks, the workflow's thread id, the decision
map's schema and its validation (runtime/workflows/agent_step.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from signoff import ConfigError, Edit, InvalidInput, WorkflowContext, agent_step
from signoff.runtime.workflows.agent_step import (
    CARDS_KEY,
    decision_schema,
    parse_decisions,
    workflow_of_thread,
    workflow_thread_id,
)


def card(editable: list[str]) -> Any:
    return SimpleNamespace(
        id=str(uuid.uuid4()),
        tool="pay",
        summary="Pay 10 to ana",
        impact={"amount": 10},
        snapshot_hash="h" * 64,
        editable=editable,
        input={"payee": "ana", "amount": 10},
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )


def test_a_workflow_thread_is_told_apart_from_a_chat_thread_without_a_query() -> None:
    for _ in range(100):
        run_id = str(uuid.uuid4())
        thread = workflow_thread_id(run_id)
        assert uuid.UUID(thread).version == 8 and thread != run_id
        assert workflow_of_thread(thread) == run_id
        assert workflow_of_thread(run_id) is None  # a chat's thread (uuid4)
    assert workflow_of_thread("not-a-uuid") is None


def test_agent_step_definition_is_checked() -> None:
    step = agent_step("risk", prompt="look at {title}", tools=["flag"])
    assert step.kind == "agent" and step.tools == ("flag",) and step.name == "risk"
    ctx = WorkflowContext(
        run_id="r", workflow="w", step="risk", principal="p", tenant="t", state={"title": "X"}
    )
    assert step.render(ctx) == "look at X"
    with pytest.raises(InvalidInput):
        agent_step("risk", prompt="look at {missing}").render(ctx)
    with pytest.raises(ConfigError):
        agent_step("steps", prompt="x")  # an engine-owned state key
    with pytest.raises(ConfigError):
        agent_step("risk", prompt="  ")
    with pytest.raises(ConfigError):
        agent_step("", prompt="x")


def test_the_schema_lists_every_card_and_what_each_accepts() -> None:
    a, b = card(["amount"]), card([])
    schema = decision_schema([a, b])
    assert [c["id"] for c in schema[CARDS_KEY]] == [a.id, b.id]
    assert schema["properties"][a.id]["anyOf"][0] == {"type": "boolean"}
    assert len(schema["properties"][a.id]["anyOf"]) == 2  # editable: an edit too
    assert schema["properties"][b.id]["anyOf"] == [{"type": "boolean"}]
    assert schema["additionalProperties"] is False


def test_a_map_is_checked_against_the_listed_cards() -> None:
    a, b = card(["amount"]), card([])
    schema = decision_schema([a, b])
    assert parse_decisions({a.id: Edit({"amount": 5}), b.id: False}, schema) == {
        a.id: {"edit": {"amount": 5}},
        b.id: False,
    }
    bads: list[Any] = [
        {},
        [],
        {str(uuid.uuid4()): True},
        {a.id: "yes"},
        {a.id: 1},
        {a.id: {"edit": {"payee": "mallory"}}},
        {a.id: {"edit": {}}},
        {a.id: {"edit": {"amount": 1}, "also": 1}},
        {b.id: Edit({"amount": 5})},  # b has no editable field
    ]
    for bad in bads:
        with pytest.raises(InvalidInput):
            parse_decisions(bad, schema)
