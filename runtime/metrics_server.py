"""The metrics port: prometheus-client's exposition, served apart from the public port.

``signoff gateway``, ``signoff worker`` and ``signoff dev`` serve it on
``SIGNOFF_METRICS_PORT`` (``--metrics-port``; 0, the default: off) at
``SIGNOFF_METRICS_HOST`` (default: the bind address). It answers:

* ``GET /metrics``: the Prometheus text format (``prometheus_client.generate_latest``),
  the process's own series (``process_*``) included;
* ``GET /metrics/decision-latency?after=N``: a worker's raw decision-latency samples (ns)
  recorded after the N-th one (how ``bench/decisions.py`` reads exact percentiles);
* ``GET /metrics/workflow-latency?after=N``: the same for workflow wakes (a gateway
  received a resume or an event -> this worker claimed the run to run its next step);
* ``GET /metrics/spans?after=N``: a worker's per-process spans (``runtime/spans.py``:
  each wake labelled by the path that woke it, timed on this process's monotonic clock);
* ``GET /healthz`` (the process answers: a liveness probe);
* ``GET /readyz`` (a worker: its loops run, it is not stopping, Postgres and Redis answer;
  503 ``{"ok": false, "error": ...}`` otherwise: a readiness probe that sees a worker cut
  off from its stores, which a TCP probe of this port did not).

A tiny Starlette app on its own uvicorn server in the same event loop: no hand-written
HTTP. The gauges of this process's worker and gateway (parked runs, steps in flight,
inbox lag and pending entries, open sockets, decisions in flight) are read when scraped
by collectors registered here, so the hot path keeps nothing up to date for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec
import uvicorn
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from signoff.runtime.errors import ConfigError
from signoff.runtime.metrics import LatencySamples
from signoff.runtime.spans import Spans, after_of, spans_json

log = logging.getLogger("signoff.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Connections the metrics port serves at once (scrapers and a bench): past it, 503.
METRICS_CONNECTIONS = 64
_json = msgspec.json.Encoder()


class Gauges(Collector):
    """Gauges read from live objects when scraped: ``read()`` returns
    ``(name, help, value)`` triples."""

    def __init__(self, read: Callable[[], list[tuple[str, str, float]]]) -> None:
        self._read = read

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # read live: never checked against other collectors' names

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, help_text, value in self._read():
            yield GaugeMetricFamily(name, help_text, value=value)


class InboxStats:
    """The inbox's lag and pending entries, refreshed (at most once a second) before a
    scrape: a Redis round trip the collector itself cannot make (it is synchronous)."""

    def __init__(self, bus: Any) -> None:
        self._bus = bus
        self.lag = 0.0
        self.pending = 0.0
        self._at = 0.0

    async def refresh(self) -> None:
        stats = getattr(self._bus, "inbox_stats", None)
        loop = asyncio.get_running_loop()
        if stats is None or loop.time() - self._at < 1.0:
            return
        self._at = loop.time()
        try:
            self.lag, self.pending = await asyncio.wait_for(stats(), 2.0)
        except Exception as exc:  # a scrape never fails on Redis: the gauges keep their value
            log.debug("inbox stats unavailable: %s", exc)

    def gauges(self) -> list[tuple[str, str, float]]:
        return [
            (
                "signoff_inbox_lag",
                "Inbox entries no worker has read yet (the consumer group's lag; every "
                "worker reports the same value: aggregate with max, not sum).",
                self.lag,
            ),
            (
                "signoff_inbox_pending",
                "Inbox entries read by any worker and not yet acknowledged (every worker "
                "reports the same value: aggregate with max; signoff_turns_in_flight is "
                "this worker's own).",
                self.pending,
            ),
        ]


def worker_gauges(worker: Any) -> list[tuple[str, str, float]]:
    """A :class:`runtime.worker.Worker`'s gauges."""
    return [
        ("signoff_parked_runs", "Runs parked on this worker.", len(worker.waits)),
        ("signoff_parked_cards", "Cards this worker waits on.", len(worker.waits.parked_cards())),
        (
            "signoff_steps_in_flight",
            "Continuations holding a step slot now; SIGNOFF_STEPS_IN_FLIGHT at most.",
            worker._step_slots.size - worker._step_slots.free,
        ),
        (
            "signoff_worker_tasks",
            "Turns, continuations and hints of this worker running or waiting to (0: idle).",
            len(worker.tasks),
        ),
        (
            "signoff_turns_in_flight",
            "Inbox entries (first turns) this worker runs now; SIGNOFF_TURNS_IN_FLIGHT at most.",
            worker.intake.in_flight,
        ),
        (
            "signoff_workflow_runs_in_flight",
            "Workflow runs whose steps run on this worker now (parked ones hold nothing).",
            worker.workflows.in_flight,
        ),
    ]


async def worker_ready(
    worker: Any, store: Any, bus: Any, claim: Any = None, timeout: float = 2.0
) -> str | None:
    """Why ``worker`` cannot take work now (its Redis key prefix held by another app,
    stopping, a loop of it ended, Postgres or Redis not answering within ``timeout``), or
    None. Dependencies are named, never their errors' text (hosts, ports): the log has
    that."""
    if claim is not None and claim.lost.is_set():
        return "key prefix held by another app"
    if worker.draining:
        return "draining"
    ended = sorted(t.get_name() for t in (*worker.loops, *worker.ticks.tasks) if t.done())
    if ended:
        return f"loops ended: {', '.join(ended)}"

    async def postgres() -> None:  # a worker that cannot write can do nothing
        await store.ping(writable=True)

    checks: list[tuple[str, Callable[[], Awaitable[None]]]] = [("postgres", postgres)]
    if getattr(bus, "ping", None) is not None:
        checks.append(("redis", bus.ping))
    for name, check in checks:
        try:
            await asyncio.wait_for(check(), timeout)
        except Exception as exc:
            log.warning("/readyz: %s: %s: %s", name, type(exc).__name__, exc)
            return f"{name} unavailable"
    return None


class MetricsServer:
    """Serve the registry (and extra collectors) on ``host:port`` until :meth:`close`."""

    def __init__(
        self,
        samples: LatencySamples | None = None,
        workflow_samples: LatencySamples | None = None,
        spans: Spans | None = None,
    ) -> None:
        self.samples = samples
        self.workflow_samples = workflow_samples
        self.spans = spans
        # Why this process cannot take work now, or None (no check: always ready).
        self.ready: Callable[[], Awaitable[str | None]] | None = None
        self.collectors: list[Collector] = []
        self.refreshers: list[Callable[[], Any]] = []
        self.port = 0
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    def add(self, read: Callable[[], list[tuple[str, str, float]]]) -> None:
        collector = Gauges(read)
        REGISTRY.register(collector)
        self.collectors.append(collector)

    def app(self) -> Starlette:
        async def metrics(request: Request) -> Response:
            for refresh in self.refreshers:
                await refresh()
            return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE)

        def serve_samples(samples: LatencySamples | None, request: Request) -> Response:
            if samples is None:
                return JSONResponse({"error": "not_found"}, 404)
            after = after_of(request.query_params.get("after", "0"))
            body = {"count": samples.count, "samples_ns": samples.after(after)}
            return Response(_json.encode(body), media_type="application/json")

        async def latency(request: Request) -> Response:
            return serve_samples(self.samples, request)

        async def workflow_latency(request: Request) -> Response:
            return serve_samples(self.workflow_samples, request)

        async def spans(request: Request) -> Response:
            if self.spans is None:
                return JSONResponse({"error": "not_found"}, 404)
            body = spans_json(self.spans, request.url.query)
            return Response(body, media_type="application/json")

        async def healthz(request: Request) -> Response:
            return JSONResponse({"ok": True})

        async def readyz(request: Request) -> Response:
            why = await self.ready() if self.ready is not None else None
            if why is None:
                return JSONResponse({"ok": True})
            return JSONResponse({"ok": False, "error": why}, 503)

        return Starlette(
            routes=[
                Route("/metrics", metrics),
                Route("/metrics/decision-latency", latency),
                Route("/metrics/workflow-latency", workflow_latency),
                Route("/metrics/spans", spans),
                Route("/healthz", healthz),
                Route("/readyz", readyz),
            ]
        )

    async def start(self, host: str, port: int, http: type[Any] | None = None) -> int:
        """Listen; the port bound (useful with 0 in tests). ``http``: uvicorn's HTTP
        protocol class (the gateway's, with header and body deadlines: a client that never
        finishes its request must not hold a connection, and the process's descriptors,
        for ever; the composition root passes it)."""
        config = uvicorn.Config(
            self.app(),
            host=host,
            port=port,
            http=http or "auto",
            limit_concurrency=METRICS_CONNECTIONS,
            server_header=False,
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
        )
        try:  # bound here, so a taken port is a clear error (uvicorn would sys.exit)
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            sock = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
        server = QuietServer(config)
        self._server = server
        self._task = asyncio.create_task(server.serve([sock]), name="signoff-metrics")
        while not server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            await self._task  # raises what failed (e.g. the port is taken)
            raise OSError(f"metrics server on {host}:{port} stopped at once")
        self.port = sock.getsockname()[1]
        return self.port

    async def close(self) -> None:
        for collector in self.collectors:
            with contextlib.suppress(KeyError):
                REGISTRY.unregister(collector)
        self.collectors.clear()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 5)


class QuietServer(uvicorn.Server):
    """Never takes SIGTERM/SIGINT: the process's own server or loop does (and a test
    run's Ctrl-C reaches pytest instead of stopping one in-process server)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
