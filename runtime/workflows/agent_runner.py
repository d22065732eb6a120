"""The worker side of agent steps (``agent_step.py`` says what they are).

:class:`AgentSteps` is installed on a worker with workflows. It registers the ``agent``
step kind with the workflow engine and runs it on the worker's own agent (its locks,
its card waits, its executor), so a card of an agent step is proposed, decided and
executed exactly as a chat's card is. The step is re-entrant: each time the engine runs
it, it

1. starts the step's agent run (once: its id derives from the workflow run and the step),
   or applies the decision map checkpointed on the step's last resolved interrupt (card
   by card, idempotent: a card no longer pending is skipped) and continues the agent run;
2. reports the outcome: the model's reply when its turn ended (merged into the state),
   a :class:`GateOpening` listing every pending card when it waits on a person, or
   ``Unavailable`` (looked at again shortly) while another worker still holds the agent
   run after a crash.

A run's agent run may also be continued outside the step: its cards decided through the
card API, or adopted by another worker after a crash. :meth:`AgentSteps.settled` (called
by the agent after it continued a run, ``Agent.on_settled``) then passes the step's open gate with an empty map
(``system:cards``, automatic) and wakes the workflow run, so it never waits on cards that
are no longer pending.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Coroutine, Mapping
from typing import Any

from signoff.runtime.agent import Agent
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.decisions import Decisions, Resolution, send_all
from signoff.runtime.errors import (
    ConfigError,
    NotFound,
    SignoffError,
    Unavailable,
)
from signoff.runtime.notify import wake_workflow
from signoff.runtime.records import Run, RunStatus
from signoff.runtime.tools import Registry
from signoff.runtime.workflows.agent_step import (
    CARDS_KEY,
    AgentStep,
    decision_schema,
    listed_cards,
    message_id,
    workflow_of_thread,
    workflow_thread_id,
)
from signoff.runtime.workflows.definition import Step, WorkflowContext, WorkflowStatus
from signoff.runtime.workflows.records import GateOpening, WorkflowRun

log = logging.getLogger("signoff.workflows.agent")

CHANNEL = "workflow"
# Armed in tests (SIGNOFF_FAULTS): the worker dies right after applying the first decision
# of a decision map (runtime/faults.py).
FAULT_AFTER_FIRST = "workflow.after_first_decision"


class AgentStepFailed(SignoffError):
    """The agent run of an agent step failed or was superseded: the step fails."""

    code = "agent_step_failed"


class AgentSteps:
    def __init__(self, worker: Any, engine: Any) -> None:
        self.worker = worker
        self.engine = engine
        self.agent: Agent = worker.agent
        self.store = worker.store
        app = worker.app
        self.workflows = app.workflow_map()
        self.decisions = Decisions(
            store=worker.store,
            bus=worker.bus,
            tools=app.tools,
            policy=app.policy,
            keys=worker.keys,
            services=app.services,
            faults=worker.faults,
        )
        self._registries: dict[tuple[str, ...], Registry] = {}
        self._steps: dict[str, AgentStep] = {}  # agent run id -> its step (tools_for's cache)
        for wf in self.workflows.values():
            for step in wf.step_list:
                if isinstance(step, AgentStep):
                    self.registry(step)  # unknown tool names fail at start-up

    @classmethod
    def install(cls, worker: Any, engine: Any) -> AgentSteps:
        """Hook the worker's agent (tools offered per run, settled runs); the engine runs
        the ``agent`` steps with :meth:`run` (``agent_step.py`` registers the kind)."""
        steps = cls(worker, engine)
        worker.agent.tools_for = steps.tools_for
        worker.agent.on_settled = steps.settled
        return steps

    def registry(self, step: AgentStep) -> Registry:
        """The tools the model is offered in ``step`` (all the app's when it names none)."""
        if not step.tools:
            return self.agent.tools
        found = self._registries.get(step.tools)
        if found is None:
            tools = []
            for name in step.tools:
                tool = self.agent.tools.get(name)
                if tool is None:
                    raise ConfigError(f"agent step {step.name!r} names unknown tool {name!r}")
                tools.append(tool)
            found = self._registries[step.tools] = Registry(tools)
        return found

    async def tools_for(self, run: Run) -> Registry:
        """The agent's registry for ``run`` (``Agent.tools_for``): the step's tools for an
        agent step's run, however the run is being continued (here, adopted elsewhere)."""
        if workflow_of_thread(run.thread_id) is None:
            return self.agent.tools
        step = self._steps.get(run.id) or await self._step_of(run)
        return self.agent.tools if step is None else self.registry(step)

    async def _step_of(self, run: Run) -> AgentStep | None:
        wf_id = workflow_of_thread(run.thread_id)
        if wf_id is None:
            return None
        try:
            wf_run = await self.store.workflows.get_workflow_run(wf_id)
        except NotFound:
            return None
        if not _same_principal(wf_run, run):
            return None
        workflow = self.workflows.get(wf_run.workflow)
        for step in workflow.step_list if workflow else ():
            if isinstance(step, AgentStep):
                if Agent.run_id_for(message_id(wf_id, step.name)) == run.id:
                    self._steps[run.id] = step
                    return step
        return None

    # -- the step ----------------------------------------------------------------------------

    async def run(self, step: Step, ctx: WorkflowContext) -> Mapping[str, Any] | GateOpening:
        assert isinstance(step, AgentStep)
        mid = message_id(ctx.run_id, step.name)
        run_id = Agent.run_id_for(mid)
        self._steps[run_id] = step
        try:
            run: Run | None = await self.store.get_run(run_id)
        except NotFound:
            run = None
        if run is None:
            thread_id = await self._thread(ctx)
            run = await self.worker.run_message(
                thread_id, step.render(ctx), user=ctx.principal, channel=CHANNEL, message_id=mid
            )
            if run is None:
                raise AgentStepFailed(f"agent step {step.name!r} could not start its run")
        else:
            await self.apply(ctx, step)
            run = await self.agent.continue_run(run_id) or run
        return await self.outcome(step, run)

    async def _thread(self, ctx: WorkflowContext) -> str:
        """The workflow run's own thread, made on its first agent step. A run id that is
        not a version-4 UUID (a start before they were refused) would share its thread
        with the version-4 run of the same bits, and a thread that is not the run's
        principal's is someone else's: the step fails rather than talk there (I3)."""
        if uuid.UUID(ctx.run_id).version != 4:
            raise AgentStepFailed(
                f"workflow run {ctx.run_id} has no thread of its own for agent steps "
                "(its id is not a version-4 UUID)"
            )
        thread_id = workflow_thread_id(ctx.run_id)
        try:
            thread = await self.store.get_thread(thread_id)
        except NotFound:
            thread = await self.store.create_thread(ctx.tenant, ctx.principal, thread_id=thread_id)
        if (thread.tenant, thread.owner) != (ctx.tenant, ctx.principal):
            raise AgentStepFailed(f"workflow run {ctx.run_id}: its thread is another user's")
        return thread_id

    async def outcome(self, step: AgentStep, run: Run) -> Mapping[str, Any] | GateOpening:
        cards = await self.store.cards_of_run(run.id)
        if run.status is RunStatus.DONE:
            return {step.name: {"reply": await self._reply(run), "actions": _actions(cards)}}
        if run.status in (RunStatus.FAILED, RunStatus.SUPERSEDED):
            raise AgentStepFailed(
                f"agent step {step.name!r}: its run {run.status}: {run.error or 'no reason'}",
                agent_run_id=run.id,
            )
        pending = [c for c in cards if c.status is Status.PENDING]
        if run.status is RunStatus.WAITING and pending:
            n, schema = len(pending), decision_schema(pending)
            return GateOpening(
                kind="human",
                step_name=step.name,
                reason=f"{n} action{'s' if n > 1 else ''} proposed by the agent "
                f"await{'' if n > 1 else 's'} your decision",
                schema=schema,
                detail={"agent_run_id": run.id, "cards": schema[CARDS_KEY]},
                event=None,
                timeout=None,
                timeout_response=None,
                lookback=None,
                reenter=True,  # passing the wait runs this step again, nothing merged
            )
        # Decided, not continued yet: another worker holds the agent run (it was adopted
        # after a crash). Looked at again shortly; `settled` wakes us when it is done.
        raise Unavailable(f"agent run {run.id} is being continued by {run.holder}")

    async def _reply(self, run: Run) -> str:
        for entry in reversed(await self.store.conversation(run.thread_id)):
            if entry.kind == "assistant" and entry.run_id == run.id:
                return "".join(
                    b.get("text", "")
                    for b in entry.body.get("content", [])
                    if b.get("type") == "text"
                )
        return ""

    # -- the decision map --------------------------------------------------------------------

    async def apply(self, ctx: WorkflowContext, step: AgentStep) -> None:
        """Apply the decision map checkpointed on the step's last resolved interrupt. Safe
        to repeat: a card already decided (by this map, or otherwise) is left as it is."""
        index = self.workflows[ctx.workflow].index_of(step.name)
        last = await self.engine.resolution(ctx.run_id, index)
        if last is None or not last.payload:
            return
        listed = listed_cards(last.schema)
        by = last.resolved_by or ctx.principal
        # In the order the model called the cards, the worker told once all are applied:
        # an approved card runs as soon as it is approved (design note 60), so the map's
        # approvals run together, in the model's order.
        run = await self.store.get_run(Agent.run_id_for(message_id(ctx.run_id, step.name)))
        cards = {c.id: c for c in await self.store.cards_of_run(run.id)}
        ids = sorted(
            (c for c in last.payload if c in listed and c in cards),
            key=lambda c: (run.call_position(cards[c]), c),
        )
        hints: list[Coroutine[Any, Any, None]] = []  # sent once the map is applied
        try:
            for i, card_id in enumerate(ids):
                await self._apply_one(card_id, last.payload[card_id], by, hints)
                if i == 0:
                    self.worker.faults.hit(FAULT_AFTER_FIRST)
        finally:
            await send_all(hints)

    async def _apply_one(
        self, card_id: str, value: Any, by: str, hints: list[Coroutine[Any, Any, None]]
    ) -> None:
        card = await self.store.get_card(card_id)
        try:
            if isinstance(value, bool):
                if card.status is Status.PENDING:
                    decision = Decision.APPROVE if value else Decision.REJECT
                    await self._decide(card, decision, by, hints)
                return
            edits: dict[str, Any] = value["edit"]
            if card.status is Status.PENDING:
                outcome = await self.decisions.resolve(
                    card.id,
                    Resolution(
                        decision=Decision.EDIT, snapshot_hash=card.snapshot_hash, edits=edits
                    ),
                    principal=by,
                    channel=CHANNEL,
                    tenant=card.tenant,
                    hints=hints,
                )
                assert outcome.new_card is not None
                card = await self.store.get_card(str(outcome.new_card["id"]))
            else:
                card = await self._successor(card, edits, by)
            if card is not None and card.status is Status.PENDING:
                await self._decide(card, Decision.APPROVE, by, hints)
        except Unavailable:
            # Postgres or Redis away (or an answer lost after a commit): the step is tried
            # again shortly and the map applied again (already decided cards are left, the
            # map's own edit's card found). Swallowed, the edit's card was listed for the
            # person to decide again though the map had approved it.
            raise
        except SignoffError as exc:
            # Expired, refused by policy, edited values the tool rejects: the card stays as
            # it is; a pending one is listed again on the step's next interrupt.
            log.warning("decision on card %s not applied: %s", card_id, exc)

    async def _decide(
        self, card: Card, decision: Decision, by: str, hints: list[Coroutine[Any, Any, None]]
    ) -> None:
        await self.decisions.resolve(
            card.id,
            Resolution(decision=decision, snapshot_hash=card.snapshot_hash),
            principal=by,
            channel=CHANNEL,
            tenant=card.tenant,
            hints=hints,
        )

    async def _successor(self, card: Card, edits: dict[str, Any], by: str) -> Card | None:
        """After a crash between this map's edit of ``card`` and the approval of the card
        it made: that card, or None when ``card`` was decided some other way.

        Only the map's own edit counts: ``card``'s ``modified`` event must be on this
        channel, by the map's resumer, with exactly the map's edits, and only the card it
        made directly is taken. A card the person made by editing in chat (with the same
        values or not), or edited again after the map's edit, is theirs to decide: a
        hostile probe had the map approve a chat edit's card that nobody approved."""
        if card.status is not Status.MODIFIED or not card.superseded_by:
            return None
        mine = any(
            e.to_status == Status.MODIFIED
            and e.channel == CHANNEL
            and e.actor == by
            and e.detail.get("edits") == edits
            for e in await self.store.card_events(card.id)
        )
        return await self.store.get_card(card.superseded_by) if mine else None

    # -- a run continued outside the step ---------------------------------------------------

    async def settled(self, run: Run) -> None:
        """The worker continued ``run`` (a card signal, adoption). If it is an agent step's
        run and it no longer needs the step's open gate, pass the gate and wake the
        workflow run. Never raises (a hint: the workflow's own poll is the fallback)."""
        wf_id = workflow_of_thread(run.thread_id)
        if wf_id is None or run.status is RunStatus.RUNNING:
            return
        try:
            await self._settled(wf_id, run)
        except Exception as exc:
            log.warning("workflow run %s: not woken after its agent run: %s", wf_id, exc)

    async def _settled(self, wf_id: str, run: Run) -> None:
        wf_store = self.store.workflows
        wf_run = await wf_store.get_workflow_run(wf_id)
        workflow = self.workflows.get(wf_run.workflow)
        if workflow is None or wf_run.step >= len(workflow.step_list):
            return
        if not _same_principal(wf_run, run):
            return  # a chat's thread that merely looks like a workflow's: not its run
        step = workflow.step_list[wf_run.step]
        if not isinstance(step, AgentStep):
            return
        if Agent.run_id_for(message_id(wf_id, step.name)) != run.id:
            return
        if wf_run.status is WorkflowStatus.RUNNING:
            if wf_run.holder == self.worker.worker_id:
                self.engine.wake(wf_id)
            return
        if wf_run.status is not WorkflowStatus.AWAITING_HUMAN:
            return
        opened = [i for i in await wf_store.interrupts(wf_id) if i.status == "open"]
        if not opened:
            return
        cards = {c.id: c for c in await self.store.cards_of_run(run.id)}
        listed = listed_cards(opened[-1].schema)
        if any(cards[c].status is Status.PENDING for c in listed if c in cards):
            return  # still waiting on a person for one of them
        passed = await wf_store.resolve_gate(
            wf_id,
            kind="human",
            payload_for=lambda _step: {},
            by="system:cards",
            n_steps=len(workflow.step_list),
            automatic=True,
        )
        holder = passed.run.holder if passed.holder_live else None
        await wake_workflow(
            self.worker.bus,
            self.worker.keys,
            wf_id,
            holder,
            tenant=passed.run.tenant,
            owner=passed.run.owner,
        )


def _actions(cards: list[Card]) -> list[dict[str, Any]]:
    return [
        {"card_id": c.id, "tool": c.tool, "summary": c.summary, "status": str(c.status)}
        for c in sorted(cards, key=lambda c: c.created_at)
    ]


def _same_principal(wf_run: WorkflowRun, run: Run) -> bool:
    """Whether an agent run can be the workflow run's (the same tenant and principal)."""
    return (wf_run.tenant, wf_run.owner) == (run.tenant, run.owner)
