"""The agent loop: Claude tool use where every write waits for a person.

``start`` runs a new user message; ``continue_run`` resumes a parked run from the store.
The live path (a decision arrives on the bus) and the recovery path (another process
adopts the run) both call ``continue_run``, which re-reads Postgres and never trusts the
message that woke it. Tools are called by :mod:`signoff.runtime.execution`; every hint
goes through the worker's :class:`~signoff.runtime.notify.Notifier`. Locks: a thread's,
then a run's, then a step slot (``step_slot``), never the other way round."""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
import weakref
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from signoff.runtime import approved, outcomes, replies, slots
from signoff.runtime.bus import Bus
from signoff.runtime.cards import Card, Status, latest
from signoff.runtime.conversation import SYSTEM_PROMPT, build_messages, messages_and_open_calls
from signoff.runtime.errors import RunInactive, SignoffError, ToolValidationError, Unavailable
from signoff.runtime.execution import Executor
from signoff.runtime.faults import Faults
from signoff.runtime.keys import Keys
from signoff.runtime.models.base import Model
from signoff.runtime.notify import Notifier
from signoff.runtime.policy import Policy, Verdict
from signoff.runtime.proposal import new_card
from signoff.runtime.records import ACTIVE_RUN, Entry, Run, RunStatus
from signoff.runtime.store import Store
from signoff.runtime.telemetry import span
from signoff.runtime.tools import Registry, ToolContext, label_text

log = logging.getLogger("signoff.agent")

MAX_MODEL_CALLS = 12
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The log kinds the model sees (runtime.conversation.build_messages).
CONVERSATION = frozenset({"user", "assistant", "tool_results"})
_RUN_NS = uuid.UUID("8f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b")


class Agent:
    def __init__(
        self,
        *,
        store: Store,
        bus: Bus,
        tools: Registry,
        policy: Policy,
        model: Model,
        worker_id: str,
        keys: Keys,
        services: Any = None,
        system: str = SYSTEM_PROMPT,
        lease_seconds: float = 10.0,
        wait_grace_ms: int = 30_000,
        park: Callable[[Run, list[Card]], Awaitable[None]] | None = None,
        unpark: Callable[[str], None] | None = None,
        faults: Faults | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.tools = tools
        self.policy = policy
        self.model = model
        self.worker_id = worker_id
        self.keys = keys
        self.services = services
        self.system = system
        self.lease_seconds = lease_seconds
        self.wait_grace_ms = wait_grace_ms
        self.faults = faults or Faults()
        self._park = park
        self._unpark = unpark
        self.tools_for: Callable[[Run], Awaitable[Registry]] | None = None
        self.on_settled: Callable[[Run], Awaitable[None]] | None = None  # both: agent steps
        # A continuation's slot (the worker's), taken under its run's lock: one queued on
        # the lock holds none that the lock's holder, back from the model, would wait for.
        self.step_slot: Callable[[], slots.Slot] = slots.unbounded
        self.accepting = True  # False once the worker stops: no continuation starts
        # The one publisher of this worker's hints (thread, deltas, signals, wait tokens).
        self.notify = Notifier(bus, keys, store)
        self.executor = Executor(
            store=store,
            tools=tools,
            notify=self.notify,
            actor=f"worker:{worker_id}",
            faults=self.faults,
        )
        self.approved = approved.Approved(self.executor, tools, self._ctx, worker_id)
        # A lock per thread or run while one holds or waits on it (weak: idle ones go).
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @staticmethod
    def run_id_for(message_id: str) -> str:
        """The run a message starts: derived from its id, so a redelivery finds it (I5)."""
        return str(uuid.uuid5(_RUN_NS, message_id))

    def lock(self, key: str) -> asyncio.Lock:  # a thread's or a run's (ids never collide)
        return self._locks.get(key) or self._locks.setdefault(key, asyncio.Lock())

    def locked(self) -> set[str]:  # the threads and runs a step holds here
        return {key for key, lock in list(self._locks.items()) if lock.locked()}

    def _ctx(self, run: Run) -> ToolContext:
        return ToolContext.of(run, self.services)

    # -- a new user message ----------------------------------------------------

    async def start(
        self,
        thread_id: str,
        text: str,
        *,
        user: str,
        role: str = "user",
        channel: str = "http",
        message_id: str = "",
    ) -> Run:
        """Run a user message: supersede what was pending in the thread, then step.

        A message seen before (same ``message_id``) is not run twice: its run is left to
        whoever holds it, or continued from the store if that is us (an earlier attempt
        stopped mid-step; no lease lapses to hand it on)."""
        run_id = self.run_id_for(message_id) if message_id else None
        async with self.lock(thread_id):
            logged: list[Entry] = []
            run, superseded, old_runs, created = await self.store.start_run(
                thread_id,
                owner=user,
                role=role,
                holder=self.worker_id,
                lease_seconds=self.lease_seconds,
                content=[{"type": "text", "text": text}],
                actor=user,
                channel=channel,
                run_id=run_id,
                logged=logged,
            )
            if created:
                for old in old_runs:
                    if self._unpark is not None:
                        self._unpark(old.id)
                for card in superseded:
                    # The holder of a superseded run may be another worker: it lets go.
                    await self.notify.card(card)
                await self.notify.thread(thread_id, logged)  # none after a supersede
                return await self._step(run)
            log.info("message %s was delivered again; run %s exists", message_id, run.id)
            if run.holder != self.worker_id or run.status not in ACTIVE_RUN:
                return run
            # Under the thread's lock (then the run's: one order): nothing supersedes it now.
            return await self.continue_run(run.id) or run

    # -- the loop ----------------------------------------------------------------

    async def _step(
        self,
        run: Run,
        conversation: list[Entry] | None = None,
        pending: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> Run:
        """Call the model until it ends its turn or parks on cards.

        ``conversation``: the thread's conversation as just read, plus what this run
        appended since. (It cannot have grown otherwise: a new user message supersedes
        the run first, and then this run's next conditional write fails.)

        ``pending``: tool results the model is shown now, written with this step's next
        write (one statement, not two); derived from the cards and the run's state in
        Postgres, so a crash before that write loses nothing."""
        todo = list(pending or ())
        tools = self.tools if self.tools_for is None else await self.tools_for(run)
        try:
            for _ in range(MAX_MODEL_CALLS):
                if conversation is None:
                    entries = await self.store.conversation(run.thread_id)
                else:
                    entries, conversation = conversation, None
                # Deltas carry the log position they stream after, so a gateway can drop
                # those that arrive after the assistant entry they belong to.
                position = entries[-1].seq if entries else 0
                shown = entries + [
                    Entry(
                        thread_id=run.thread_id,
                        seq=position,
                        run_id=run.id,
                        kind=kind,
                        body=body,
                        created_at=_EPOCH,
                    )
                    for kind, body in todo
                ]
                # Calls an earlier run left without a result (superseded): what became of
                # their cards, read only then, so the model is told the truth about them.
                messages, open_calls = messages_and_open_calls(shown)
                if open_calls:
                    told = await self.store.tool_use_outcomes(run.thread_id, open_calls)
                    messages = build_messages(shown, told)

                async def on_text(delta: str, _run: Run = run, _pos: int = position) -> None:
                    await self.notify.delta(_run.thread_id, _pos, delta, _run.id)

                with span("model", run_id=run.id):
                    reply = await slots.outside(  # the worker's step slot let go meanwhile
                        self.model.respond(
                            system=self.system,
                            messages=messages,
                            tools=tools.specs(),
                            on_text=on_text,
                        )
                    )
                # Each call's id its own (else not run): the API refuses shared ids.
                earlier = (e.body.get("content", []) for e in entries if e.kind == "assistant")
                content, refused = replies.checked(reply.content, replies.used_ids(earlier))
                uses = [b for b in content if b.get("type") == "tool_use"]
                assistant = ("assistant", {"content": content})
                if not uses:
                    # The results, the reply and the end of the turn: one statement, one hint.
                    done = ("run", {"status": str(RunStatus.DONE), "error": None})
                    written, run = await self.store.run_step(
                        run.id,
                        run.thread_id,
                        [*todo, assistant, done],
                        str(RunStatus.DONE),
                        {},
                        holder=self.worker_id,
                    )
                    await self.notify.thread(run.thread_id, written)
                    return run
                if todo:
                    written, run = await self.store.run_step(
                        run.id,
                        run.thread_id,
                        [*todo, assistant],
                        str(RunStatus.RUNNING),
                        {},
                        holder=self.worker_id,
                    )
                    todo = []
                else:
                    written = [
                        await self.store.append(
                            run.thread_id, *assistant, run.id, holder=self.worker_id
                        )
                    ]
                await self.notify.thread(run.thread_id, written)
                results = {**outcomes.beyond_the_limit(uses), **refused}
                handle = functools.partial(self._handle_tool_use, run, tools=tools)
                proposed = await replies.answer(uses, results, handle)
                order = [u["id"] for u in uses]
                if proposed:
                    waiting = {use_id: card.id for use_id, card in proposed.items()}
                    state = {"order": order, "results": results, "waiting": waiting}
                    run = await self.store.set_run(
                        run.id, RunStatus.WAITING, state, holder=self.worker_id
                    )
                    return await self._settle(run, list(proposed.values()))
                # Reads only: their results go with the next write.
                todo = [("tool_results", {"content": [results[i] for i in order]})]
                conversation = [*entries, *(e for e in written if e.kind in CONVERSATION)]
            return await self._finish(
                run, RunStatus.FAILED, "too many model calls in one turn", todo
            )
        except RunInactive:
            log.info("run %s stopped stepping: superseded, or held by another worker", run.id)
            return await self.store.get_run(run.id)

    async def _finish(
        self,
        run: Run,
        status: RunStatus,
        error: str | None = None,
        pending: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> Run:
        end = ("run", {"status": str(status), "error": error})
        written, run = await self.store.run_step(
            run.id,
            run.thread_id,
            [*(pending or ()), end],
            str(status),
            {},
            error,
            holder=self.worker_id,
        )
        await self.notify.thread(run.thread_id, written)
        return run

    async def _handle_tool_use(
        self, run: Run, use: dict[str, Any], tools: Registry | None = None
    ) -> Card | dict[str, Any]:
        """One tool call: a finished tool_result block, or the card it waits on."""
        use_id: str = use["id"]
        if tools is None:  # recovering a run: the tools its step offers
            tools = self.tools if self.tools_for is None else await self.tools_for(run)
        tool = tools.get(use.get("name", ""))
        if tool is None:
            return outcomes.tool_result(use_id, f"Unknown tool {use.get('name')!r}.", error=True)
        ctx = self._ctx(run)
        try:
            data = tool.parse(use.get("input") or {})
            raw: dict[str, Any] = msgspec.to_builtins(data)
            if not tool.is_write:
                verdict = self.policy.evaluate(tool, raw, tenant=run.tenant, role=run.role)
                if verdict.verdict is Verdict.DENY:
                    return outcomes.tool_result(
                        use_id, f"Denied by policy: {label_text(verdict.reason)}", error=True
                    )
                return outcomes.tool_result(use_id, await self.executor.read(tool, raw, ctx))
            prepared = await self.executor.prepare(tool, data, ctx)
        except ToolValidationError as exc:
            return outcomes.tool_result(use_id, exc.message, error=True)
        except Unavailable:
            raise  # the store or the bus: the step is tried again, not answered
        except SignoffError as exc:
            return outcomes.tool_result(use_id, exc.message, error=True)
        except Exception as exc:  # a tool's own bug (or input it did not expect) must not
            # wedge the run: the model is told the call failed, the log has the traceback.
            log.exception("tool %s failed on run %s", tool.name, run.id)
            return outcomes.tool_result(
                use_id, f"The tool failed ({type(exc).__name__}); nothing was done.", error=True
            )
        verdict = self.policy.evaluate(tool, prepared.args, tenant=run.tenant, role=run.role)
        if verdict.verdict is Verdict.DENY:
            why = label_text(verdict.reason)
            return outcomes.tool_result(use_id, f"Denied by policy: {why}", error=True)
        if verdict.verdict is Verdict.ALLOW:
            op = f"{run.id}:{use_id}"
            try:
                return outcomes.tool_result(
                    use_id, await self.executor.allowed(tool, prepared.args, op, ctx)
                )
            except Exception as exc:
                log.warning("allowed write %s failed on run %s: %s", tool.name, run.id, exc)
                failed = outcomes.failed_result(exc)["error"]  # no driver's words to the model
                return outcomes.tool_result(use_id, f"Not done: {failed}", error=True)
        card, entry = await self.store.propose(
            new_card(
                tool,
                prepared,
                thread_id=run.thread_id,
                run_id=run.id,
                tenant=run.tenant,
                owner=run.owner,
                tool_use_id=use_id,
                raw_input=raw,
                ttl=verdict.card_ttl(tool),
            )
        )
        if entry is not None:
            ids = {"card_id": card.id, "run_id": run.id, "thread_id": run.thread_id}
            log.info("card proposed", extra={**ids, "tool": card.tool})
            await self.notify.thread(run.thread_id, [entry])
        elif card.status is Status.REJECTED:
            return outcomes.refused_again(use_id, card)
        return card

    # -- waiting and continuing ------------------------------------------------

    async def _settle(
        self,
        run: Run,
        known: list[Card] | None = None,
        conversation: list[Entry] | None = None,
        early: list[Card] | None = None,
        was_busy: bool = False,
    ) -> Run:
        """Look at the run's cards in Postgres: park on the pending ones or go on. ``known``:
        the run's cards as just read or written, if they tell all (an edited card sends us
        to Postgres for its successor). ``early``: approved cards to run while others are
        pending are claimed into it, for the caller to run outside the run's lock."""
        if known is None or any(c.status is Status.MODIFIED for c in known):
            known = await self.store.cards_of_run(run.id)
        cards = {c.id: c for c in known}
        waiting = latest(run.state.get("waiting", {}), cards)
        if waiting != run.state.get("waiting", {}):
            run = await self.store.set_run(
                run.id, RunStatus.WAITING, {**run.state, "waiting": waiting}, holder=self.worker_id
            )
        pending = [cards[c] for c in waiting.values() if cards[c].status is Status.PENDING]
        busy = was_busy or self.approved.busy(run.id)  # a card runs in a continuation here
        ours = early is not None and run.holder == self.worker_id  # only ours start early
        if pending or busy or (ours and self.approved.apart(run, waiting, cards)):
            # Approved siblings do not wait for these (design note 60), nor for one
            # another: the continuation that ran the last of them goes on. Parked first:
            # an adopted run waits on nothing here yet, and a decision meanwhile is heard.
            if pending and self._park is not None:
                await self._park(run, pending)
            if ours and early is not None:
                early.extend(self.approved.claim(run, waiting, cards))
            return run
        if run.holder != self.worker_id:  # released: nothing of it can be written from
            return run  # here (run_step is refused); the worker that adopts it goes on
        return await self._resume(run, waiting, cards, conversation)

    async def continue_run(self, run_id: str) -> Run | None:
        """Continue a parked run from the store (live path and recovery path alike), from
        one read of the run and its cards under the run's lock; then ``on_settled`` (an
        agent step's run wakes its workflow run). Other processes are kept apart by
        Postgres alone: every step is conditional on the run being active and held."""
        run = await self._continue(run_id)
        if run is None or self.on_settled is None:
            return run
        if run.status is not RunStatus.WAITING or not self.approved.busy(run.id):
            await self.on_settled(run)  # else the continuation running its card goes on
        return run

    async def _continue(self, run_id: str) -> Run | None:
        while self.accepting:  # a stopping worker starts nothing: its runs go to others
            early: list[Card] = []
            async with self.lock(run_id), self.step_slot():
                # before the read: a claim let go while it is on its way leaves a snapshot
                # older than the claimed card's outcome (its claimant reads again after us)
                was_busy = self.approved.busy(run_id)
                run, cards, conversation = await self.store.run_with_cards(run_id)
                if run.status is RunStatus.RUNNING and run.holder == self.worker_id:
                    run = await self._recover_running(run, early)
                elif run.status is not RunStatus.WAITING:
                    return run
                elif run.holder not in (None, self.worker_id):  # adopted while our lease
                    # lapsed: the holder goes on; here the model and the provider would be
                    # called for a run whose writes are then refused (I4, I5).
                    log.warning("run %s is held by %s now: left to it", run_id, run.holder)
                    self.executor.elsewhere.forget(run_id)
                    return run
                else:
                    try:
                        cards = await self._expire_overdue(cards)
                        run = await self._settle(run, cards, conversation, early, was_busy)
                    except RunInactive:
                        return await self.store.get_run(run_id)
                if not early:
                    return run
            # Outside the run's lock, so that a sibling approved meanwhile runs at once
            # too, in its own continuation; then the run is read again (design note 60),
            # unless none of them could start (the run was taken over meanwhile).
            if not await self.approved.run_claimed(run, early, self.step_slot):
                return run
        return None

    async def _expire_overdue(self, cards: list[Card]) -> list[Card]:
        """Pending cards past their deadline expire now (the database clock decides, I7)."""
        now = datetime.now(UTC)
        out = []
        for card in cards:
            if card.status is Status.PENDING and card.expires_at <= now:
                card = await self.notify.moved(await self.store.expire(card.id)) or card
            out.append(card)
        return out

    async def _recover_running(self, run: Run, early: list[Card]) -> Run:
        """A run that was mid-step when its process died: step again from the log.
        Proposals are idempotent (request_key): a repeated call finds the same cards."""
        entries = await self.store.conversation(run.thread_id)
        if entries and entries[-1].kind == "assistant" and entries[-1].run_id == run.id:
            uses = [b for b in entries[-1].body.get("content", []) if b.get("type") == "tool_use"]
            if uses:
                results = {**outcomes.beyond_the_limit(uses), **replies.refused_in(uses)}
                cards = await replies.answer(uses, results, lambda u: self._handle_tool_use(run, u))
                waiting = {use_id: card.id for use_id, card in cards.items()}
                state = {"order": [u["id"] for u in uses], "results": results, "waiting": waiting}
                run = await self.store.set_run(
                    run.id, RunStatus.WAITING, state, holder=self.worker_id
                )
                return await self._settle(run, early=early)
            return await self._finish(run, RunStatus.DONE)
        return await self._step(run)

    async def _resume(
        self,
        run: Run,
        waiting: dict[str, str],
        cards: dict[str, Card],
        conversation: list[Entry] | None = None,
    ) -> Run:
        """Every card is decided: execute the approved ones not run yet, tell the model,
        step on. Nothing runs while an approved card's tool is not served here
        (``approved.check_served``) or a card is found `executing`, for a while
        (``Executor.settle_elsewhere``)."""
        results: dict[str, dict[str, Any]] = dict(run.state.get("results", {}))
        calls = approved.open_calls(run, waiting)
        self.approved.check_served(run, waiting, cards)
        await self.executor.settle_elsewhere(run.id, [cards[waiting[u]] for u in calls])
        await self.approved.execute(run, waiting, cards)
        if not self.accepting:  # stopping: the worker taking the run over tells the model
            return run
        for use_id in calls:
            card = cards[waiting[use_id]]
            results[use_id] = outcomes.card_outcome(use_id, card)
            await self.notify.clear_wait(card.id)
        blocks = [results[i] for i in run.state.get("order", [])]
        # The results are written with the step's next write (see _step).
        return await self._step(run, conversation, [("tool_results", {"content": blocks})])
