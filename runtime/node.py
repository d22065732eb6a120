"""Assemble a signoff process: store, bus, app, model, worker and/or gateway.

``signoff dev`` runs all of it in one process on embedded servers;
``signoff gateway`` and ``signoff worker`` run one role each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from signoff.runtime import prefix_owner, presence, retention
from signoff.runtime.app import App
from signoff.runtime.bus import Bus
from signoff.runtime.bus.memory import MemoryBus
from signoff.runtime.config import Settings, data_path
from signoff.runtime.decisions import Decisions
from signoff.runtime.errors import ConfigError
from signoff.runtime.faults import Faults
from signoff.runtime.keys import Keys
from signoff.runtime.models.base import Model
from signoff.runtime.secret_file import read_or_create
from signoff.runtime.worker import Worker
from signoff.runtime.workflows.service import WorkflowService
from signoff.store.postgres import PostgresStore

log = logging.getLogger("signoff")

EMBEDDED_DIR = "embedded"  # under the data folder: the embedded servers' data and passwords
TEARDOWN_SECONDS = 10.0  # an app's teardown, at a stop


@dataclass
class Node:
    settings: Settings
    store: PostgresStore
    bus: Bus
    app: App
    model: Model | None
    worker: Worker | None = None
    decisions: Decisions | None = None
    workflows: WorkflowService | None = None  # what gateways call for workflow runs
    closers: list[Any] = field(default_factory=list)
    # Its hold on the Redis key prefix: ``claim.lost`` set means stop (prefix_owner.py).
    claim: prefix_owner.Claim | None = None


def dev_secret(settings: Settings) -> str:
    """The dev signing key: SIGNOFF_SECRET, or one kept in the data folder (mode 0600)."""
    if settings.secret:
        return settings.secret
    path = data_path(settings) / "secret"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return read_or_create(path, secrets.token_urlsafe(48))[0]


def pick_model(settings: Settings, app: App) -> Model:
    """Claude when a key is configured; otherwise (or with ``SIGNOFF_OFFLINE_MODEL``) the
    app's own offline model, else the generic one that takes ``/tool key=value``
    commands. Both are clearly labelled in what they write."""
    if settings.offline_model or not (settings.anthropic_api_key or settings.anthropic_base_url):
        if app.offline_model is not None:
            return app.offline_model
        from signoff.runtime.models.command import CommandModel

        return CommandModel()
    from signoff.runtime.models.anthropic_model import AnthropicModel

    return AnthropicModel.from_settings(
        settings.anthropic_api_key, settings.anthropic_base_url, settings.model
    )


def embedded_urls(settings: Settings, database: str = "signoff") -> tuple[Settings, list[Any]]:
    """Start embedded Postgres and Valkey under the data folder for what is not configured
    (``database``: the Postgres database to use in it, made on first use).

    Valkey carries the same Redis bus as the pools, so ``signoff dev`` exercises the
    production path; both servers are child processes that die with this one. Both
    demand the passwords kept in the data folder; the returned URLs carry them.
    """
    from signoff.embedded import start_postgres, start_valkey

    root = data_path(settings) / EMBEDDED_DIR
    closers: list[Any] = []
    if settings.database_url is None:
        pg = start_postgres(root, database=database)
        closers.append(pg)
        settings = settings.with_(database_url=pg.url)
    if settings.redis_url is None:
        valkey = start_valkey(root)
        closers.append(valkey)
        settings = settings.with_(redis_url=valkey.url)
    return settings, closers


def make_bus(settings: Settings) -> Bus:
    if settings.redis_url:
        from signoff.runtime.bus.redis import RedisBus

        bus: Bus = RedisBus.from_url(
            settings.redis_url,
            Keys(settings.key_prefix),
            claim_idle_ms=settings.claim_idle_ms,
            max_connections=settings.redis_max_connections,
            pool_timeout=settings.redis_pool_timeout_seconds,
            partitions=settings.inbox_partitions,
        )
        return bus
    return MemoryBus()


@asynccontextmanager
async def running(
    settings: Settings,
    app: App,
    *,
    worker: bool = True,
    gateway: bool = True,
    model: Model | None = None,
    migrate: bool = True,
) -> AsyncIterator[Node]:
    """Everything a process needs, started in order and stopped in reverse."""
    if settings.database_url is None:
        raise ConfigError("no database: set SIGNOFF_DATABASE_URL (or use `signoff dev`)")
    if settings.redis_url is None and not (worker and gateway):
        raise ConfigError("separate gateway and worker processes need SIGNOFF_REDIS_URL")
    retention.Policy.from_settings(settings)  # every role refuses a bad rule, not workers only
    if settings.faults:  # a fault point can stop or kill this process: say so at once
        log.warning("fault points armed (SIGNOFF_FAULTS): %s; for tests only", settings.faults)
    store = await PostgresStore.connect(
        settings.database_url,
        max_size=settings.pool_size,
        timeout=settings.db_timeout_seconds,
        statement_cache_size=settings.db_statement_cache_size,
    )
    bus = make_bus(settings)
    node = Node(settings=settings, store=store, bus=bus, app=app, model=model)
    roles = [r for r, on in ((presence.GATEWAY, gateway), (presence.WORKER, worker)) if on]
    process_id = settings.worker_id if worker else f"gateway-{settings.worker_id}"
    stack = contextlib.AsyncExitStack()
    pruner: asyncio.Task[None] | None = None  # the scheduled prune (retention on)
    try:
        if migrate:
            await store.migrate()
        if worker:  # one process per worker id (a duplicate SIGNOFF_WORKER_ID refuses)
            renews = min(max(settings.lease_seconds / 3, 0.2), 2.0)  # as Worker renews
            await presence.sole_worker(store, settings.worker_id, watch=2 * renews)
        # Refuses to start (AppMismatch) beside live processes serving another version of
        # the app, before the app's own setup touches anything.
        await stack.enter_async_context(
            presence.present(
                store,
                app,
                process_id,
                roles,
                allow_skew=settings.allow_app_skew,
                bus=presence.bus_identity(settings.redis_url, settings.key_prefix),
            )
        )
        # One app, on one database, per key prefix of a Redis (else workers take another
        # app's messages): refused when another holds it.
        node.claim = await stack.enter_async_context(
            prefix_owner.hold(
                bus,
                prefix_owner.owner_of(app.name, await store.installation_id()),
                where=presence.bus_identity(settings.redis_url, settings.key_prefix),
                database=prefix_owner.database_identity(settings.database_url),
                allow_skew=settings.allow_app_skew,
            )
        )
        if app.setup is not None:
            made = await app.setup(settings.database_url)
            if app.services is None:
                app.services = made  # what setup returns is what tools get as ctx.services
        keys = Keys(settings.key_prefix)
        if gateway:
            node.decisions = Decisions(
                store=store,
                bus=bus,
                tools=app.tools,
                policy=app.policy,
                keys=keys,
                services=app.services,
                faults=Faults(settings.faults),
            )
            node.workflows = WorkflowService.of(store.workflows, bus, keys, app, settings)
            node.workflows.check_edit = node.decisions.check_edit
        if worker:
            node.model = model or pick_model(settings, app)
            node.worker = Worker(settings=settings, store=store, bus=bus, app=app, model=node.model)
            await node.worker.start()
            if retention.Policy.from_settings(settings).enabled:
                pruner = asyncio.create_task(
                    retention.prune_loop(store.retention, settings, Faults(settings.faults))
                )
        yield node
    finally:
        if pruner is not None:
            pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pruner
        if node.worker is not None:
            await node.worker.stop()
        if app.teardown is not None:
            try:  # an app's own close must not hold a stop past its grace period
                await asyncio.wait_for(app.teardown(), TEARDOWN_SECONDS)
            except TimeoutError:
                log.warning("the app's teardown took over %ss; going on", TEARDOWN_SECONDS)
            except Exception:
                log.exception("the app's teardown failed")
        close = getattr(node.model, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
        with contextlib.suppress(Exception):
            await stack.aclose()  # the presence row goes last: the worker has let go
        await bus.close()
        await store.close()


async def start_metrics(node: Node) -> Any:
    """Serve the metrics port (``SIGNOFF_METRICS_PORT``) for this process's worker and,
    once :func:`serve_gateway` adds its gauges, its gateway; None when not configured."""
    s = node.settings
    if not s.metrics_port:
        return None
    from signoff.runtime.metrics_server import (
        InboxStats,
        MetricsServer,
        worker_gauges,
        worker_ready,
    )

    worker = node.worker
    server = MetricsServer(
        worker.decision_latency_ns if worker is not None else None,
        worker.workflows.wake_latency_ns if worker is not None else None,
        worker.waits.woken.spans if worker is not None else None,
    )
    if worker is not None:
        server.add(lambda: worker_gauges(worker))
        inbox = InboxStats(node.bus)
        server.add(inbox.gauges)
        server.refreshers.append(inbox.refresh)
        server.ready = lambda: worker_ready(worker, node.store, node.bus, node.claim)
    from signoff.gateway.timeouts import http_protocol

    await server.start(s.metrics_host or s.host, s.metrics_port, http_protocol(s))
    return server


async def serve_gateway(
    node: Node,
    tokens: Any,
    host: str,
    port: int,
    started: asyncio.Event | None = None,
    metrics: Any = None,
) -> None:
    """Serve the gateway with uvicorn until stopped (WebSockets: ``settings.ws_protocol``,
    the websockets library's sans-I/O protocol by default; no per-message compression); a
    SIGTERM drains it first (``gateway/drain.py``). ``metrics``: the process's
    :class:`~signoff.runtime.metrics_server.MetricsServer`, given the gateway's gauges."""
    import uvicorn

    from signoff.gateway.app import build_app
    from signoff.gateway.drain import DrainingServer
    from signoff.gateway.upgrades import protocols

    assert node.decisions is not None
    app = build_app(
        settings=node.settings,
        store=node.store,
        bus=node.bus,
        decisions=node.decisions,
        tokens=tokens,
        workflows=node.workflows,
        hint=node.app.hint,
    )
    if metrics is not None:
        metrics.add(app.state.gauges)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        **protocols(node.settings),  # h11 with deadlines (slowloris); the WebSocket protocol
        lifespan="off",
        log_level="warning",
        log_config=None,  # uvicorn's lines go through signoff's handler (runtime/logs.py)
        access_log=False,
        timeout_graceful_shutdown=30,  # requests in flight get this long after the drain
        ws_per_message_deflate=False,
        # Outlive clients' idle pooled connections (load balancers, httpx: 5-60 s), so a
        # client never sends on a connection the server is closing at the same moment.
        timeout_keep_alive=75,
        ws_max_size=node.settings.max_ws_message_bytes,  # refuse big frames while they stream
        server_header=False,  # no "server: uvicorn" on every answer
    )
    server = DrainingServer(config, app.state, node.settings.drain_seconds)
    task = asyncio.create_task(server.serve())
    # The WhatsApp courier (design note 24) runs beside the server, as long as it does.
    whatsapp = getattr(app.state, "whatsapp", None)
    courier = asyncio.create_task(whatsapp.courier.run()) if whatsapp is not None else None
    task.add_done_callback(lambda _: courier.cancel() if courier is not None else None)
    # Another app or database holding the key prefix (found after start): /readyz fails
    # and the server stops at once, no drain delay (each message taken meanwhile would
    # go to the other app's workers); the command exits non-zero (prefix_owner.py).
    claim = node.claim
    watch = asyncio.create_task(_stop_when_lost(claim, app.state, server)) if claim else None
    task.add_done_callback(lambda _: watch.cancel() if watch is not None else None)
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if started is not None:
        started.set()
    await task
    if claim is not None and claim.lost.is_set():
        raise prefix_owner.PrefixLost(claim.why)


async def _stop_when_lost(claim: prefix_owner.Claim, state: Any, server: Any) -> None:
    await claim.lost.wait()
    state.prefix_lost = True
    server.stop_now()
