"""Agent steps in workflows, in-process on real Postgres: the agent's writes park the run
with every pending card on the interrupt; one resume decides them all (design note 30)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from signoff import Edit, InvalidInput, NotParked, WorkflowRun
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Card, Decision
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Resolution
from signoff.runtime.errors import Unavailable
from signoff.runtime.keys import Keys
from signoff.runtime.workflows.agent_runner import AgentSteps
from signoff.runtime.workflows.agent_step import CARDS_KEY, AgentStep, workflow_thread_id
from signoff.runtime.workflows.service import WorkflowService
from signoff.testing import Harness
from tests import agent_wf_app, pgbouncer
from tests.integration.wf_kit import OWNER, status_is, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    settings = Settings(lease_seconds=2.0, poll_seconds=0.3, sweep_seconds=0.2)
    async with Harness(
        agent_wf_app.build, database_url=database_url, offline=True, settings=settings
    ) as harness:
        yield harness


async def parked_on_cards(h: Harness) -> tuple[WorkflowRun, list[Card]]:
    run = await h.workflows.start("approvals", tenant=h.tenant, owner=OWNER)
    run = await until(status_is(h, run.id, "awaiting_human"), what="parked on the cards")
    cards = await h.store.pending_cards(workflow_thread_id(run.id))
    return run, sorted(cards, key=lambda c: c.args_snapshot["payee"])


async def executions(h: Harness) -> dict[str, tuple[int, int]]:
    """payee -> (amount, executions) of this test's payments."""
    rows = await h.app.services.fetch(
        "SELECT p.payee, p.amount, p.executions FROM agent_wf_pays p JOIN cards c "
        "ON c.operation_id::text = p.operation_id WHERE c.tenant = $1",
        h.tenant,
    )
    return {r["payee"]: (r["amount"], r["executions"]) for r in rows}


async def test_the_run_parks_with_every_pending_card_on_the_interrupt(h: Harness) -> None:
    run, cards = await parked_on_cards(h)
    assert [c.args_snapshot for c in cards] == [
        {"payee": "ana", "amount": 10},
        {"payee": "bruno", "amount": 20},
        {"payee": "carla", "amount": 30},
    ]
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    gate = interrupts[-1]
    assert gate.status == "open" and gate.kind == "human" and gate.step_name == "agent"
    assert gate.reason == "3 actions proposed by the agent await your decision"
    listed = {c["id"]: c for c in gate.schema[CARDS_KEY]}
    assert gate.detail == {"agent_run_id": cards[0].run_id, "cards": gate.schema[CARDS_KEY]}
    assert set(listed) == {c.id for c in cards} == set(gate.schema["properties"])
    assert listed[cards[0].id]["summary"] == "Pay 10 to ana"
    assert listed[cards[0].id]["snapshot_hash"] == cards[0].snapshot_hash
    assert listed[cards[0].id]["editable"] == ["amount"]
    # the step offered the model only its own tools
    assert agent_wf_app.PayModel.offered[-1] == ["pay"]
    assert run.state.get("agent") is None and await executions(h) == {}


async def test_one_resume_approves_rejects_and_edits_each_exactly_once(h: Harness) -> None:
    run, (a, b, c) = await parked_on_cards(h)
    decisions: dict[str, Any] = {a.id: True, b.id: False, c.id: Edit({"amount": 25})}
    await h.workflows.resume(run.id, decisions, tenant=h.tenant, by=OWNER)
    done = await until(status_is(h, run.id, "completed"), what="completed")
    assert await executions(h) == {"ana": (10, 1), "carla": (25, 1)}
    assert await h.trail(a) == ["pending", "approved", "executing", "executed"]
    assert await h.trail(b) == ["pending", "rejected"]
    assert await h.trail(c) == ["pending", "modified"]
    edited = await h.card((await h.card(c)).superseded_by or "")
    assert edited.args_snapshot == {"payee": "carla", "amount": 25}
    assert edited.snapshot_hash != c.snapshot_hash
    assert await h.trail(edited) == ["pending", "approved", "executing", "executed"]
    for card in (a, b, edited):
        events = await h.events(card)
        assert {e.actor for e in events if e.to_status in ("approved", "rejected")} == {OWNER}
        assert {e.channel for e in events if e.to_status in ("approved", "rejected")} == {
            "workflow"
        }
    assert done.state["agent"]["reply"] == "paid: ana=10, carla=25"
    assert done.state["after_saw"] == "paid: ana=10, carla=25"
    actions = {x["card_id"]: x["status"] for x in done.state["agent"]["actions"]}
    assert actions == {a.id: "executed", b.id: "rejected", c.id: "modified", edited.id: "executed"}
    # the map was checkpointed on the interrupt, with who resumed
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    (gate,) = [i for i in interrupts if i.step_name == "agent"]
    assert gate.status == "resolved" and gate.resolved_by == OWNER
    assert gate.payload == {a.id: True, b.id: False, c.id: {"edit": {"amount": 25}}}


async def test_a_map_is_applied_in_the_models_order(h: Harness) -> None:
    """The map is applied in the order the model called the cards, not in the order of
    their ids (which matched the model's in 1 run of 6: two runs here), and each card
    runs once."""
    for _ in range(2):
        run, cards = await parked_on_cards(h)
        agent_run = await h.store.get_run(cards[0].run_id)
        in_model_order = sorted(cards, key=agent_run.call_position)
        decisions = {c.id: True for c in reversed(in_model_order)}
        await h.workflows.resume(run.id, decisions, tenant=h.tenant, by=OWNER)
        await until(status_is(h, run.id, "completed"), what="completed")
        approved = {}
        for card in cards:
            (event,) = [e for e in await h.events(card) if e.to_status == "approved"]
            approved[card.id] = event.id
            assert [e.to_status for e in await h.events(card)].count("executing") == 1
        assert sorted(approved, key=approved.__getitem__) == [c.id for c in in_model_order]


async def test_applying_the_map_again_changes_nothing(h: Harness) -> None:
    """What a worker that adopts the run after a crash does: the map applied again."""
    run, (a, b, c) = await parked_on_cards(h)
    await h.workflows.resume(
        run.id, {a.id: True, b.id: False, c.id: Edit({"amount": 5})}, tenant=h.tenant, by=OWNER
    )
    done = await until(status_is(h, run.id, "completed"), what="completed")
    steps: AgentSteps = h.worker.workflows.handlers["agent"].__self__  # type: ignore[attr-defined]
    workflow = h.app.workflow_map()["approvals"]
    step = workflow.step_list[1]
    assert isinstance(step, AgentStep)
    await steps.apply(h.worker.workflows._context(workflow, done, step), step)
    await h.settle()
    assert await executions(h) == {"ana": (10, 1), "carla": (5, 1)}
    assert await h.trail(b) == ["pending", "rejected"]
    assert len(await h.store.cards_of_run(a.run_id)) == 4


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"00000000-0000-4000-8000-000000000000": True},
        "yes",
        {"FIRST": "approve"},
        {"FIRST": {"edit": {"payee": "mallory"}}},
        {"FIRST": {"edit": {}}},
        # Values the tool rejects (the hostile probe: 200, then silently dropped) ...
        {"FIRST": {"edit": {"amount": "extreme"}}},
        {"FIRST": {"edit": {"amount": 1.5}}},
        # ... with another card approved in the same map: nothing of it is applied.
        {"OTHER": True, "FIRST": {"edit": {"amount": "lots"}}},
    ],
)
async def test_an_invalid_map_is_refused_and_the_run_stays_parked(h: Harness, bad: Any) -> None:
    run, (a, b, _) = await parked_on_cards(h)
    if isinstance(bad, dict) and "FIRST" in bad:
        bad = {(b.id if k == "OTHER" else a.id): v for k, v in bad.items()}
    with pytest.raises(InvalidInput):
        await h.workflows.resume(run.id, bad, tenant=h.tenant, by=OWNER)
    still = await h.store.workflows.get_workflow_run(run.id)
    assert still.status == "awaiting_human"
    assert [c.status for c in await h.store.cards_of_run(a.run_id)] == ["pending"] * 3


async def test_two_racing_resumes_apply_one_map(h: Harness) -> None:
    run, (a, b, c) = await parked_on_cards(h)
    maps = [{a.id: True, b.id: True, c.id: True}, {a.id: False, b.id: False, c.id: False}]
    results = await asyncio.gather(
        *(h.workflows.resume(run.id, m, tenant=h.tenant, by=OWNER) for m in maps),
        return_exceptions=True,
    )
    assert sum(isinstance(r, NotParked) for r in results) == 1, results
    await until(status_is(h, run.id, "completed"), what="completed")
    statuses = {str((await h.card(x)).status) for x in (a, b, c)}
    assert statuses in ({"executed"}, {"rejected"})


async def test_cards_decided_through_the_card_api_let_the_run_go_on(h: Harness) -> None:
    """The same cards decided one by one where a chat's are: the step's gate is passed
    (automatic, ``system:cards``) and the run completes."""
    run, cards = await parked_on_cards(h)
    for card, decision in zip(
        cards, (Decision.APPROVE, Decision.REJECT, Decision.APPROVE), strict=True
    ):
        await h.decisions.resolve(
            card.id,
            Resolution(decision=decision, snapshot_hash=card.snapshot_hash),
            principal=OWNER,
            channel="http",
            tenant=h.tenant,
        )
    done = await until(status_is(h, run.id, "completed"), what="completed")
    assert done.state["agent"]["reply"] == "paid: ana=10, carla=30"
    _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
    (gate,) = [i for i in interrupts if i.step_name == "agent"]
    assert gate.resolved_by == "system:cards" and gate.automatic


async def test_a_partial_map_parks_again_on_the_cards_left(h: Harness) -> None:
    run, (a, b, c) = await parked_on_cards(h)
    await h.workflows.resume(run.id, {a.id: True}, tenant=h.tenant, by=OWNER)

    async def reparked() -> Any:
        _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
        opened = [i for i in interrupts if i.status == "open"]
        return opened[-1] if opened else None

    gate = await until(reparked, what="parked again")
    assert {x["id"] for x in gate.schema[CARDS_KEY]} == {b.id, c.id}
    assert gate.reason == "2 actions proposed by the agent await your decision"
    await h.workflows.resume(run.id, {b.id: True, c.id: False}, tenant=h.tenant, by=OWNER)
    done = await until(status_is(h, run.id, "completed"), what="completed")
    assert done.state["agent"]["reply"] == "paid: ana=10, bruno=20"


async def test_redis_down_at_resume_commits_the_map_and_the_run_continues(h: Harness) -> None:
    """The resuming gateway's Redis is gone: the map is checkpointed anyway, the hint is
    lost, and the holder's poll finds the run in Postgres and applies the map."""
    run, (a, b, c) = await parked_on_cards(h)
    dead = RedisBus.from_url("redis://127.0.0.1:1/0", Keys("so-dead:"))
    try:
        service = WorkflowService.of(h.store.workflows, dead, Keys("so-dead:"), h.app)
        resumed = await service.resume(
            run.id, {a.id: True, b.id: False, c.id: True}, tenant=h.tenant, by=OWNER
        )
        assert resumed.status == "running"
    finally:
        await dead.close()
    done = await until(status_is(h, run.id, "completed"), what="continued through Postgres")
    assert done.state["agent"]["reply"] == "paid: ana=10, carla=30"
    assert await executions(h) == {"ana": (10, 1), "carla": (30, 1)}


async def test_a_slow_postgres_at_resume_delays_the_map_and_changes_nothing_else(
    h: Harness,
) -> None:
    run, (a, b, c) = await parked_on_cards(h)
    conn = await pgbouncer.connect(h.database_url)
    try:
        async with conn.transaction():  # a long transaction holds the run's row
            await conn.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR UPDATE", run.id)
            resume = asyncio.create_task(
                h.workflows.resume(
                    run.id, {a.id: True, b.id: True, c.id: True}, tenant=h.tenant, by=OWNER
                )
            )
            await asyncio.sleep(0.8)
            assert not resume.done()
            assert [str(x.status) for x in await h.store.cards_of_run(a.run_id)] == ["pending"] * 3
        assert (await resume).status == "running"
    finally:
        await conn.close()
    await until(status_is(h, run.id, "completed"), what="completed")
    assert await executions(h) == {"ana": (10, 1), "bruno": (20, 1), "carla": (30, 1)}


async def test_cards_that_expire_before_the_resume_let_the_run_go_on(h: Harness) -> None:
    """The cards keep their policy's TTL: expired (database clock), the model is told, and
    the step's gate passes by itself (``system:cards``)."""
    run, cards = await parked_on_cards(h)
    conn = await pgbouncer.connect(h.database_url)
    try:
        await conn.execute(
            "UPDATE cards SET expires_at = now() - interval '1 second' WHERE run_id = $1",
            cards[0].run_id,
        )
    finally:
        await conn.close()
    done = await until(status_is(h, run.id, "completed"), what="completed after expiry")
    assert done.state["agent"]["reply"] == "paid: nothing"
    assert {x["status"] for x in done.state["agent"]["actions"]} == {"expired"}
    assert await executions(h) == {}


def sibling(run_id: str, version: int) -> str:
    """``run_id`` with another UUID version: the same thread under the old mapping."""
    u = uuid.UUID(run_id)
    return str(uuid.UUID(int=(u.int & ~(0xF << 76)) | (version << 76)))


async def test_a_run_id_that_is_not_a_version_4_uuid_is_refused(h: Harness) -> None:
    """The hostile prober's repro: a victim's run id with version 5 named the victim's
    thread, and an agent step of another tenant's run talked, read and charged there."""
    victim = await h.workflows.start("approvals", tenant=h.tenant, owner=OWNER)
    for version in (1, 5, 8):
        with pytest.raises(InvalidInput, match="version 4"):
            await h.workflows.start(
                "approvals", tenant="other", owner="mallory", run_id=sibling(victim.id, version)
            )
    mine = str(uuid.uuid4())
    run = await h.workflows.start("approvals", tenant=h.tenant, owner=OWNER, run_id=mine)
    assert run.id == mine  # a client-chosen version-4 id is taken


async def test_an_agent_step_never_talks_on_another_principals_thread(h: Harness) -> None:
    """A run stored before non-version-4 ids were refused (made here through the store),
    and a thread squatted at a run's thread id: the agent step fails; the victim's thread,
    cards and run are untouched, and nothing is executed for anyone."""
    victim, cards = await parked_on_cards(h)
    thread = workflow_thread_id(victim.id)
    before = await h.store.entries_after(thread, 0, 500)
    wf = h.store.workflows
    legacy, _ = await wf.create_run(
        sibling(victim.id, 5),
        tenant="other-" + h.tenant,
        owner="mallory",
        app=h.app.name,
        workflow="approvals",
        input=None,
    )
    await h.workflows._hint(legacy)
    failed = await until(status_is(h, legacy.id, "failed"), what="the legacy run failed")
    assert "version-4" in str(failed.error)

    squat_target = str(uuid.uuid4())
    await h.store.create_thread(h.tenant, "mallory", thread_id=workflow_thread_id(squat_target))
    squatted = await h.workflows.start(
        "approvals", tenant=h.tenant, owner=OWNER, run_id=squat_target
    )
    failed = await until(status_is(h, squatted.id, "failed"), what="the squatted run failed")
    assert "another user's" in str(failed.error)

    assert await h.store.entries_after(thread, 0, 500) == before
    still = await h.store.pending_cards(thread)
    assert sorted(c.id for c in still) == sorted(c.id for c in cards)
    assert str((await wf.get_workflow_run(victim.id)).status) == "awaiting_human"
    assert await executions(h) == {}


async def test_a_workflows_thread_takes_no_messages(database_url: str) -> None:
    """The hostile probe: the agent step's thread is listed in the chat, and one message
    there superseded the step's run and its pending cards; the workflow stayed parked on
    cards nobody could decide, and its next resume answered 200 and then failed the run.
    A message there is refused (409 workflow_thread, over HTTP and WebSocket) and changes
    nothing; the cards are still decided there as anywhere."""
    import json

    import httpx
    import websockets

    settings = Settings(lease_seconds=2.0, poll_seconds=0.3, sweep_seconds=0.2)
    async with Harness(
        agent_wf_app.build,
        database_url=database_url,
        offline=True,
        settings=settings,
        gateway=True,
    ) as h:
        run, cards = await parked_on_cards(h)
        thread = workflow_thread_id(run.id)
        headers = {"Authorization": f"Bearer {h.token(OWNER)}"}
        async with httpx.AsyncClient() as c:
            r = await c.post(
                f"{h.base_url}/v1/threads/{thread}/messages",
                headers=headers,
                json={"text": "pay mallory=999"},
            )
        assert r.status_code == 409 and r.json()["error"] == "workflow_thread", r.text
        async with websockets.connect(h.base_url.replace("http", "ws") + "/v1/ws") as ws:
            await ws.send(json.dumps({"type": "auth", "token": h.token(OWNER)}))
            frame = {"type": "message", "id": "m1", "thread_id": thread, "text": "hi"}
            await ws.send(json.dumps(frame))
            while (reply := json.loads(await asyncio.wait_for(ws.recv(), 10))).get("id") != "m1":
                pass
            assert reply["type"] == "error" and reply["error"] == "workflow_thread", reply
        await asyncio.sleep(0.5)  # a message that had been accepted would be running now
        assert sorted(c.id for c in await h.store.pending_cards(thread)) == sorted(
            c.id for c in cards
        )
        assert (await h.store.workflows.get_workflow_run(run.id)).status == "awaiting_human"
        await h.workflows.resume(run.id, {c.id: True for c in cards}, tenant=h.tenant, by=OWNER)
        await until(status_is(h, run.id, "completed"), what="completed")


async def _stopped_and_resumed(
    h: Harness, edit: dict[str, Any]
) -> tuple[WorkflowRun, Card, AgentSteps, AgentStep]:
    """Parked on three cards; the worker stopped (so nothing applies the map yet); a resume
    editing carla's card saved."""
    run, (_, _, c) = await parked_on_cards(h)
    await h.worker.stop()
    await h.workflows.resume(run.id, {c.id: Edit(edit)}, tenant=h.tenant, by=OWNER)
    steps: AgentSteps = h.worker.workflows.handlers["agent"].__self__  # type: ignore[attr-defined]
    step = h.app.workflow_map()["approvals"].step_list[1]
    assert isinstance(step, AgentStep)
    return await h.store.workflows.get_workflow_run(run.id), c, steps, step


async def test_a_map_never_approves_a_card_the_person_made_by_editing_in_chat(
    h: Harness,
) -> None:
    """A hostile probe: the map said "edit carla's card to 25"; before a worker applied it,
    the person edited that card in chat (to 25 as well), making a card of their own to
    decide. The map found carla's card already edited, followed the chain to the person's
    card, saw amount 25 and approved it: a card nobody approved ran. Only the card the
    map's own edit made (a crash between that edit and its approval) is the map's."""
    run, c, steps, step = await _stopped_and_resumed(h, {"amount": 25})
    mine = await h.decide(c, Decision.EDIT, user=OWNER, edits={"amount": 25})  # in chat
    assert mine.new_card is not None
    theirs = await h.card(str(mine.new_card["id"]))
    workflow = h.app.workflow_map()["approvals"]
    await steps.apply(h.worker.workflows._context(workflow, run, step), step)
    assert await h.trail(theirs) == ["pending"]  # the person's own decision to make
    assert await h.trail(c) == ["pending", "modified"]


async def test_a_map_whose_edit_was_made_before_a_crash_approves_that_edits_card(
    h: Harness,
) -> None:
    """The case the chain is followed for: the map's own edit committed, then the worker
    died before approving the card it made; the map applied again approves that card."""
    run, c, steps, step = await _stopped_and_resumed(h, {"amount": 25})
    outcome = await h.decisions.resolve(
        c.id,
        Resolution(decision=Decision.EDIT, snapshot_hash=c.snapshot_hash, edits={"amount": 25}),
        principal=OWNER,
        channel="workflow",
        tenant=h.tenant,
    )
    assert outcome.new_card is not None
    made = await h.card(str(outcome.new_card["id"]))
    workflow = h.app.workflow_map()["approvals"]
    await steps.apply(h.worker.workflows._context(workflow, run, step), step)
    assert await h.trail(made) == ["pending", "approved"]


async def test_a_map_whose_edit_answer_was_lost_is_applied_again_not_dropped(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code review: the map's edit committed but its answer was lost (Unavailable);
    the map logged "not applied" and went on, so the edit's card was listed for the person
    to decide again though the map had approved it. The step is tried again instead, and
    the map, applied again, approves the card its own edit made."""
    run, c, steps, step = await _stopped_and_resumed(h, {"amount": 25})
    real = steps.decisions.resolve
    lost = [True]

    async def answer_lost(*args: Any, **kwargs: Any) -> Any:
        outcome = await real(*args, **kwargs)  # committed
        if lost and lost.pop():
            raise Unavailable("the connection dropped after COMMIT")
        return outcome

    monkeypatch.setattr(steps.decisions, "resolve", answer_lost)
    workflow = h.app.workflow_map()["approvals"]
    ctx = h.worker.workflows._context(workflow, run, step)
    with pytest.raises(Unavailable):
        await steps.apply(ctx, step)
    await steps.apply(ctx, step)  # the engine's retry
    made = await h.card((await h.card(c)).superseded_by or "")
    assert await h.trail(made) == ["pending", "approved"]
