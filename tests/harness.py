"""An in-process signoff for tests: real Postgres, the demo app, the real anthropic SDK
talking to the fake Messages API server, the worker, the decision path and (optionally)
the gateway served by uvicorn on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anthropic

from signoff.demo.app import build
from signoff.demo.provider import Provider
from signoff.embedded import free_port
from signoff.gateway.auth import Tokens
from signoff.runtime.bus import Bus
from signoff.runtime.bus_memory import MemoryBus
from signoff.runtime.cards import Card, Decision
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Decisions, Resolution
from signoff.runtime.keys import Keys
from signoff.runtime.models.anthropic_model import AnthropicModel
from signoff.runtime.models.base import Model
from signoff.runtime.models.fake_server import FakeMessagesServer
from signoff.runtime.records import Run
from signoff.runtime.worker import Worker
from signoff.store.postgres import PostgresStore

SECRET = "test-secret-" + "x" * 40


@dataclass
class Harness:
    settings: Settings
    store: PostgresStore
    bus: Bus
    worker: Worker
    decisions: Decisions
    provider: Provider
    tenant: str
    fake: FakeMessagesServer | None
    tokens: Tokens
    base_url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    async def thread(self, user: str) -> str:
        return (await self.store.create_thread(self.tenant, user)).id

    async def say(self, thread_id: str, text: str, user: str) -> Run | None:
        return await self.worker.run_message(thread_id, text, user=user)

    async def decide(
        self,
        card: Card,
        decision: Decision,
        user: str | None = None,
        reason: str | None = None,
        snapshot_hash: str | None = None,
        edits: dict[str, Any] | None = None,
    ) -> Any:
        return await self.decisions.resolve(
            card.id,
            Resolution(
                decision=decision,
                snapshot_hash=snapshot_hash or card.snapshot_hash,
                reason=reason,
                edits=edits,
            ),
            principal=user or card.owner,
            channel="test",
        )

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

    async def charges(self) -> int:
        value = await self.provider.pool.fetchval(
            "SELECT count(*) FROM demo_charges WHERE tenant = $1", self.tenant
        )
        return int(value)

    def token(self, user: str) -> str:
        return self.tokens.issue(user, self.tenant)


@asynccontextmanager
async def harness(
    database_url: str,
    *,
    fake: FakeMessagesServer | None = None,
    model: Model | None = None,
    gateway: bool = False,
    worker_id: str | None = None,
    settings: Settings | None = None,
    start_worker: bool = True,
    bus: Bus | None = None,
    leave_runs: bool = False,
) -> AsyncIterator[Harness]:
    """``bus``: the bus to use (default: an in-process one); closed at the end.

    The tests of a session share one database, and a worker adopts any released run: at
    the end, this tenant's runs still active are ended (``superseded``) so that no later
    test's worker continues them with its own model. ``leave_runs``: keep them for
    another harness to adopt (the recovery tests)."""
    tenant = "t-" + secrets.token_hex(4)
    base = settings or Settings()
    s = base.with_(
        database_url=database_url,
        worker_id=worker_id or "w-" + secrets.token_hex(3),
        secret=SECRET,
        tenant=tenant,
        poll_seconds=min(base.poll_seconds, 1.0),
        sweep_seconds=min(base.sweep_seconds, 0.5),
    )
    store = await PostgresStore.connect(database_url, max_size=20)
    bus = bus or MemoryBus()
    app = build((tenant,))
    assert app.setup is not None
    provider = await app.setup(database_url)
    client: anthropic.AsyncAnthropic | None = None
    if model is None:
        assert fake is not None, "give a fake Messages API server or a model"
        client = anthropic.AsyncAnthropic(api_key="test-key", base_url=fake.base_url, max_retries=0)
        model = AnthropicModel(client, "claude-test", stream=True)
    keys = Keys(s.key_prefix)
    worker = Worker(settings=s, store=store, bus=bus, app=app, model=model)
    decisions = Decisions(
        store=store, bus=bus, tools=app.tools, policy=app.policy, keys=keys, services=app.services
    )
    tokens = Tokens(SECRET)
    h = Harness(
        settings=s,
        store=store,
        bus=bus,
        worker=worker,
        decisions=decisions,
        provider=provider,
        tenant=tenant,
        fake=fake,
        tokens=tokens,
    )
    serve: asyncio.Task[None] | None = None
    server: Any = None
    try:
        if start_worker:
            await worker.start()
        if gateway:
            import uvicorn

            from signoff.gateway.app import build_app
            from signoff.gateway.timeouts import http_protocol

            port = free_port()
            asgi = build_app(settings=s, store=store, bus=bus, decisions=decisions, tokens=tokens)
            server = uvicorn.Server(
                uvicorn.Config(
                    asgi,
                    host="127.0.0.1",
                    port=port,
                    ws="wsproto",
                    http=http_protocol(s),
                    lifespan="off",
                    log_level="warning",
                )
            )
            serve = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.01)
            h.base_url = f"http://127.0.0.1:{port}"
        yield h
    finally:
        if server is not None:
            server.should_exit = True
            if serve is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(serve, 5)
            await asgi.state.feeds.close()
        await worker.stop()
        if not leave_runs:
            await store.pool.execute(
                "UPDATE runs SET status = 'superseded' WHERE tenant = $1"
                " AND status IN ('running', 'waiting')",
                tenant,
            )
        await bus.close()
        if client is not None:
            await client.close()
        if app.teardown is not None:
            await app.teardown()
        await store.close()
