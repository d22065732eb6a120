"""An app running in-process against real Postgres, driven by a scripted model.

::

    async with Harness(app) as h:
        card = await h.propose("refund_order", {"order_id": "A-1"})
        assert card.summary == "Refund order A-1"
        done = await h.approve(card)
        assert done.status == "executed"

A :class:`Harness` runs what ``signoff dev`` runs — the worker (agent loop, waits,
sweeper), the decision path and optionally the HTTP/WebSocket gateway — with the real
``anthropic`` client talking to a :class:`~signoff.testing.FakeMessagesServer`. The
model's replies are scripted: :meth:`Harness.propose` sends a message whose reply calls
a tool, and the model answers a tool result with a short text. Decisions go through the
same code path as the HTTP API's, so policy, ownership, hashes and edits are checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import anthropic

from signoff.runtime.app import App
from signoff.runtime.bus import Bus
from signoff.runtime.bus.memory import MemoryBus
from signoff.runtime.cards import Card, Decision
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Decisions, Outcome, Resolution
from signoff.runtime.keys import Keys
from signoff.runtime.models.anthropic_model import AnthropicModel
from signoff.runtime.models.base import Model
from signoff.runtime.models.command import CommandModel
from signoff.runtime.records import CardEvent, Run
from signoff.runtime.worker import Worker
from signoff.runtime.workflows.service import WorkflowService
from signoff.store.postgres import PostgresStore
from signoff.testing import servers
from signoff.testing.fake_messages import FakeMessagesServer, ScriptedReply, reply, tool_use
from signoff.testing.script import Plan, ToolResult, find_result

__all__ = ["DEFAULT_USER", "Harness", "ToolResult"]

DEFAULT_USER = "alice"
_END_RUNS = """WITH agent AS (UPDATE runs SET status = 'superseded'
    WHERE tenant = $1 AND status IN ('running', 'waiting'))
UPDATE workflow_runs SET status = 'cancelled', worker_id = NULL
WHERE tenant = $1 AND status IN ('running', 'awaiting_human', 'awaiting_event')"""


class Harness:
    """An app in-process on real Postgres: worker, decisions, optional gateway.

    ``app``: an :class:`~signoff.App` or a zero-argument factory returning one.

    ``database_url``: a database to use as it is (migrated at start, kept at the end);
    by default a fresh database is made on :func:`~signoff.testing.servers.postgres_server`
    (``$SIGNOFF_TEST_DATABASE_URL`` or an embedded Postgres) and dropped at the end.

    ``tenant``: the tenant of every thread (default: a fresh ``t-<hex>``).
    ``offline``: drive the app with the model ``signoff dev`` uses without an API key —
    its own ``App.offline_model``, else signoff's generic ``/tool key=value`` one — so
    :meth:`say` takes plain messages as that model understands them (no fake server).
    ``model``: any :class:`Model`; by default the real ``anthropic`` client (streaming
    when ``stream``) against ``fake``, a :class:`FakeMessagesServer` (default: one of the
    harness's own). Replies added with :meth:`script` are served first, in order;
    otherwise the harness's own fake answers from what :meth:`propose`, :meth:`call` and
    :meth:`reply_to` planned (a fake you give answers only from its script).
    ``gateway``: also serve the HTTP/WebSocket API on a free port (:attr:`base_url`,
    :meth:`token`). ``start_worker=False``: the worker is built but not started.
    ``bus``: default an in-process one. ``settings``: a base :class:`Settings`.
    ``leave_runs``: on a shared database, keep this tenant's active runs at the end (by
    default they are ended so no later worker continues them).
    """

    settings: Settings
    store: PostgresStore
    bus: Bus
    worker: Worker
    decisions: Decisions
    workflows: WorkflowService  # start, resume, deliver events (as the HTTP API does)
    tokens: Any
    database_url: str
    base_url: str

    def __init__(
        self,
        app: App | Callable[[], App],
        *,
        database_url: str | None = None,
        tenant: str | None = None,
        offline: bool = False,
        model: Model | None = None,
        fake: FakeMessagesServer | None = None,
        stream: bool = True,
        gateway: bool = False,
        settings: Settings | None = None,
        start_worker: bool = True,
        bus: Bus | None = None,
        worker_id: str | None = None,
        secret: str | None = None,
        leave_runs: bool = False,
    ) -> None:
        self.app = app if isinstance(app, App) else app()
        self.tenant = tenant or "t-" + secrets.token_hex(4)
        if offline and (model is not None or fake is not None):
            raise ValueError("offline=True runs the app's offline model: no model or fake too")
        if offline:
            model = self.app.offline_model or CommandModel()
        self._fake = fake
        self._given_database = database_url
        self._model = model
        self._stream = stream
        self._gateway = gateway
        self._base_settings = settings or Settings()
        self._start_worker = start_worker
        self._bus = bus
        self._worker_id = worker_id
        self._secret = secret or "signoff-testing-" + secrets.token_hex(24)
        self._leave_runs = leave_runs
        self._own_fake = False  # a fake (or model) that is given answers on its own
        self._plan = Plan()
        self._cleanup: list[Callable[[], Awaitable[Any]]] = []
        self.base_url = ""
        self.asgi: Any = None  # the gateway's Starlette app (gateway=True): its state, for tests

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Harness:
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop()

    async def _start(self) -> None:
        from signoff.gateway.auth import Tokens

        if self._given_database is None:
            self.database_url = await servers.create_database()
            url = self.database_url
            self._cleanup.append(lambda: servers.drop_database(url))
        else:
            self.database_url = self._given_database
        base = self._base_settings
        self.settings = base.with_(
            database_url=self.database_url,
            worker_id=self._worker_id or "w-" + secrets.token_hex(3),
            secret=self._secret,
            tenant=self.tenant,
            poll_seconds=min(base.poll_seconds, 1.0),
            sweep_seconds=min(base.sweep_seconds, 0.5),
        )
        self.store = await PostgresStore.connect(self.database_url, max_size=20)
        self._cleanup.append(self.store.close)
        if self._given_database is not None:
            await self.store.migrate()
        self.bus = self._bus or MemoryBus()
        self._cleanup.append(self.bus.close)
        model = self._model
        if model is None:
            if self._fake is None:
                self._fake = FakeMessagesServer(responder=self._plan.respond)
                self._fake.start()
                self._own_fake = True
                self._cleanup.append(_async(self._fake.stop))
            client = anthropic.AsyncAnthropic(
                api_key="test-key", base_url=self._fake.base_url, max_retries=0
            )
            self._cleanup.append(client.close)
            model = AnthropicModel(client, "claude-test", stream=self._stream)
        if self.app.setup is not None:
            made = await self.app.setup(self.database_url)
            if self.app.services is None:
                self.app.services = made  # as in production: what setup returns, tools get
        if self.app.teardown is not None:
            self._cleanup.append(self.app.teardown)
        self.worker = Worker(
            settings=self.settings, store=self.store, bus=self.bus, app=self.app, model=model
        )
        keys = Keys(self.settings.key_prefix)
        app = self.app
        self.decisions = Decisions(
            store=self.store, bus=self.bus, tools=app.tools, policy=app.policy, keys=keys
        )
        self.decisions.services = app.services
        wf = self.store.workflows
        self.workflows = WorkflowService.of(wf, self.bus, keys, self.app, self.settings)
        self.workflows.check_edit = self.decisions.check_edit
        self.tokens = Tokens(self._secret)
        if self._start_worker:
            await self.worker.start()
        self._cleanup.append(self._end_runs)
        self._cleanup.append(self.worker.stop)
        if self._gateway:
            await self._serve_gateway()

    async def _serve_gateway(self) -> None:
        import uvicorn

        from signoff.gateway.app import build_app
        from signoff.gateway.upgrades import protocols
        from signoff.runtime.metrics_server import QuietServer

        asgi = build_app(
            settings=self.settings,
            store=self.store,
            bus=self.bus,
            decisions=self.decisions,
            tokens=self.tokens,
            workflows=self.workflows,
            hint=self.app.hint,
        )
        self.asgi = asgi
        server = QuietServer(  # a Ctrl-C of the test run reaches pytest, not this server
            uvicorn.Config(
                asgi,
                host="127.0.0.1",
                port=(port := servers.free_port()),
                **protocols(self.settings),
                lifespan="off",
                log_level="warning",
            )
        )
        serve = asyncio.create_task(server.serve())

        async def stop() -> None:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(serve, 5)
            await asgi.state.feeds.close()

        self._cleanup.append(stop)
        while not server.started:
            if serve.done():
                await serve
                raise RuntimeError("the gateway did not start")
            await asyncio.sleep(0.01)
        self.base_url = f"http://127.0.0.1:{port}"

    async def _end_runs(self) -> None:
        # On a shared database a later harness's worker would adopt this tenant's runs and
        # workflow runs still active and continue them with its own model: end them.
        if self._given_database is not None and not self._leave_runs:
            await self.store.pool.execute(_END_RUNS, self.tenant)

    async def _stop(self) -> None:
        errors: list[BaseException] = []
        while self._cleanup:
            step = self._cleanup.pop()
            try:
                await step()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- the scripted model ------------------------------------------------------------

    def reply_to(self, message: str, *replies: ScriptedReply) -> None:
        """Script the model's replies for the turn that answers user message ``message``,
        one per model call (e.g. a read tool's call, then a write tool's). After them the
        model answers a tool result with ``Done.``. Needs the harness's own fake server."""
        if not self._own_fake:
            raise RuntimeError("reply_to, propose and call script the harness's own fake server")
        self._plan.add(message, *replies)

    @property
    def fake(self) -> FakeMessagesServer:
        """The fake Messages API the model talks to (``.requests``: every request body)."""
        if self._fake is None:
            raise RuntimeError("this harness runs a model of its own, not the fake server")
        return self._fake

    def script(self, *replies: ScriptedReply) -> None:
        """Append replies the model gives next, in order, whatever the message (they come
        before anything :meth:`reply_to` planned)."""
        self.fake.add(*replies)

    # -- driving the app ---------------------------------------------------------------

    async def thread(self, user: str = DEFAULT_USER) -> str:
        """A new thread of ``user`` (in the harness's tenant); returns its id."""
        return (await self.store.create_thread(self.tenant, user)).id

    async def say(self, thread_id: str, message: str, user: str = DEFAULT_USER) -> Run | None:
        """Run ``message`` as ``user``'s turn in the thread, to its end or its park."""
        return await self.worker.run_message(thread_id, message, user=user)

    async def propose(
        self,
        tool: str,
        input: Mapping[str, Any],
        *,
        user: str = DEFAULT_USER,
        thread: str | None = None,
    ) -> Card:
        """Have the model call ``tool`` with ``input``; return the pending card it made.

        Fails (``AssertionError``, with the tool result the model got) when no card was
        made: a policy refusal, an invalid input, a read tool."""
        (card,) = await self.propose_many([(tool, input)], user=user, thread=thread)
        return card

    async def propose_many(
        self,
        calls: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        user: str = DEFAULT_USER,
        thread: str | None = None,
    ) -> list[Card]:
        """Have the model call several tools in one reply (parallel tool use); return
        their cards in call order."""
        thread_id, uses = await self._turn(calls, user=user, thread=thread)
        pending = {c.tool_use_id: c for c in await self.store.pending_cards(thread_id)}
        cards: list[Card] = []
        for use in uses:
            card = pending.get(use["id"])
            if card is None:
                got = await self._find_result(thread_id, use["id"])
                raise AssertionError(
                    f"{use['name']} made no card; the model got: "
                    + (repr(got.content) if got else "nothing")
                )
            cards.append(card)
        return cards

    async def call(
        self,
        tool: str,
        input: Mapping[str, Any],
        *,
        user: str = DEFAULT_USER,
        thread: str | None = None,
    ) -> ToolResult:
        """Have the model call ``tool``; return the tool result it got at once (a read
        tool's answer, a policy refusal, an invalid input). Fails if a card was made."""
        thread_id, (use,) = await self._turn([(tool, input)], user=user, thread=thread)
        for card in await self.store.pending_cards(thread_id):
            if card.tool_use_id == use["id"]:
                raise AssertionError(f"{tool} made card {card.id} ({card.summary!r})")
        got = await self._find_result(thread_id, use["id"])
        if got is None:
            raise AssertionError(f"the model got no tool result for {tool}")
        return got

    async def _turn(
        self, calls: Sequence[tuple[str, Mapping[str, Any]]], *, user: str, thread: str | None
    ) -> tuple[str, list[dict[str, Any]]]:
        """One user message whose scripted reply makes these calls; (thread id, the calls)."""
        uses = [tool_use(name, dict(input)) for name, input in calls]
        message = self._plan.message("call " + ", ".join(name for name, _ in calls))
        self.reply_to(message, reply(*uses))
        thread_id = thread or await self.thread(user)
        await self.say(thread_id, message, user)
        await self.settle()
        return thread_id, uses

    # -- deciding ----------------------------------------------------------------------

    async def decide(
        self,
        card: Card,
        decision: Decision | str,
        user: str | None = None,
        reason: str | None = None,
        snapshot_hash: str | None = None,
        edits: dict[str, Any] | None = None,
    ) -> Outcome:
        """Decide ``card`` as ``user`` (default its owner), exactly as the HTTP API does;
        raises the API's typed errors (``NotOwner``, ``StaleCard``, ``AlreadyDecided``, ...).
        Does not wait for the run to go on (see :meth:`settle`)."""
        return await self.decisions.resolve(
            card.id,
            Resolution(
                decision=Decision(decision),
                snapshot_hash=snapshot_hash or card.snapshot_hash,
                reason=reason,
                edits=edits,
            ),
            principal=user or card.owner,
            channel="test",
        )

    async def approve(self, card: Card, *, user: str | None = None) -> Card:
        """Approve; wait until the run went on; return the card as it ended (``executed``,
        ``invalidated`` when ``revalidate`` refused, ``failed``)."""
        await self.decide(card, Decision.APPROVE, user=user)
        await self.settle()
        return await self.card(card)

    async def reject(
        self, card: Card, reason: str | None = None, *, user: str | None = None
    ) -> Card:
        """Reject (with an optional reason for the model); return the card once settled."""
        await self.decide(card, Decision.REJECT, user=user, reason=reason)
        await self.settle()
        return await self.card(card)

    async def edit(
        self, card: Card, changes: Mapping[str, Any], *, user: str | None = None
    ) -> Card:
        """Edit the card's editable fields; return the new pending card (the old one is
        ``modified``)."""
        outcome = await self.decide(card, Decision.EDIT, user=user, edits=dict(changes))
        await self.settle()
        assert outcome.new_card is not None
        return await self.store.get_card(str(outcome.new_card["id"]))

    # -- looking -----------------------------------------------------------------------

    async def card(self, card: Card | str) -> Card:
        """The card as it is now."""
        return await self.store.get_card(card if isinstance(card, str) else card.id)

    async def events(self, card: Card | str) -> list[CardEvent]:
        """The card's audit trail: every transition with actor, channel and hash seen."""
        return await self.store.card_events(card if isinstance(card, str) else card.id)

    async def trail(self, card: Card | str) -> list[str]:
        """The statuses the card went through (``["pending", "approved", ...]``)."""
        return [str(e.to_status) for e in await self.events(card)]

    async def pending(self, thread_id: str) -> list[Card]:
        """The thread's pending cards."""
        return await self.store.pending_cards(thread_id)

    async def last_reply(self, thread_id: str) -> str:
        """The text of the model's last reply in the thread (its text blocks, joined with
        spaces; ``""`` when it has not replied yet). Call after the turn settled."""
        for entry in reversed(await self.store.conversation(thread_id)):
            if entry.kind == "assistant":
                blocks = entry.body.get("content", [])
                return " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        return ""

    async def tool_result(self, call: Card | str, *, thread: str | None = None) -> ToolResult:
        """The tool result the model got for a card's call (once the run went on), or for
        the call with this ``tool_use`` id in ``thread``."""
        await self.settle()
        if isinstance(call, Card):
            thread, use_id = call.thread_id, call.tool_use_id
        else:
            assert thread is not None, "a tool_use id needs its thread"
            use_id = call
        got = await self._find_result(thread, use_id)
        if got is None:
            state = (
                f"card {call.id} is {(await self.card(call)).status}"
                if isinstance(call, Card)
                else use_id
            )
            raise AssertionError(f"the model got no tool result yet ({state})")
        return got

    async def _find_result(self, thread_id: str, tool_use_id: str) -> ToolResult | None:
        return find_result(await self.store.conversation(thread_id), tool_use_id)

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until the worker is quiet: no step in flight and no signal undelivered,
        seen on three consecutive ticks (signals hop through the bus before a step starts)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        quiet = 0
        while quiet < 3:
            if loop.time() > deadline:
                raise TimeoutError("worker did not settle")
            await asyncio.sleep(0.01)
            if self.worker.busy():
                quiet = 0
                await self.worker.idle(max(deadline - loop.time(), 0.1))
            else:
                quiet += 1

    def token(self, user: str = DEFAULT_USER) -> str:
        """A bearer token for ``user`` in the harness's tenant (for :attr:`base_url`)."""
        token: str = self.tokens.issue(user, self.tenant)
        return token


def _async(fn: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        await asyncio.to_thread(fn)

    return run
