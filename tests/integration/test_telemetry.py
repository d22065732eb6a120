"""Telemetry in-process: one trace per decision across gateway and worker (carried in the
signal), the span histogram, decision counters, card-transition counters and the JSON log
lines with ids, all on real Postgres."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from signoff.runtime import logs, telemetry
from signoff.runtime.cards import Decision
from signoff.runtime.errors import AlreadyDecided
from signoff.runtime.notify import CardSignal, signal_decoder
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = pytest.mark.anyio


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use(provider)
    try:
        yield exporter
    finally:
        telemetry.use(None)
        provider.shutdown()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_one_trace_spans_the_gateways_resolve_and_the_workers_execution(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        spans.clear()
        done = await h.approve(card)
        assert done.status == "executed"
    finished = spans.get_finished_spans()
    (resolve,) = named(finished, "signoff.resolve")
    (execute,) = [s for s in named(finished, "signoff.execute") if s.attributes]
    assert resolve.attributes is not None and resolve.attributes["card_id"] == card.id
    assert execute.attributes is not None and execute.attributes["card_id"] == card.id
    assert resolve.context is not None and execute.context is not None
    # The worker's execution belongs to the gateway's trace: the worker's continuation
    # task only learnt of it from the signal's payload (its own context is empty).
    assert execute.context.trace_id == resolve.context.trace_id
    (cont,) = [s for s in named(finished, "signoff.continue") if s.parent is not None]
    assert cont.parent is not None and cont.parent.span_id == resolve.context.span_id
    assert execute.parent is not None and execute.parent.span_id == cont.context.span_id


async def test_the_signal_carries_the_traceparent_only_when_tracing(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    assert signal_decoder.decode(b'{"card_id":"c","status":"approved"}').trace == ""
    with telemetry.span("resolve"):
        parent = telemetry.traceparent()
    assert parent.startswith("00-") and len(parent.split("-")) == 4
    telemetry.use(None)
    with telemetry.span("resolve"):
        assert telemetry.traceparent() == ""
    assert CardSignal("c", "approved").trace == ""


async def test_decisions_cards_and_spans_are_counted(database_url: str) -> None:
    tool = "create_pix_charge"
    before = {
        "pending": sample("signoff_card_transitions_total", status="pending", tool=tool),
        "executed": sample("signoff_card_transitions_total", status="executed", tool=tool),
        "approve": sample("signoff_decisions_total", channel="test", outcome="approve"),
        "refused": sample("signoff_decisions_total", channel="test", outcome="already_decided"),
        "execute": sample("signoff_span_seconds_count", span="execute"),
        "click": sample("signoff_click_to_executed_seconds_count"),
    }
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        assert (
            sample("signoff_card_transitions_total", status="pending", tool=tool)
            == before["pending"] + 1
        )
        await h.approve(card)
        with pytest.raises(AlreadyDecided):
            await h.decide(card, Decision.APPROVE)
    assert (
        sample("signoff_card_transitions_total", status="executed", tool=tool)
        == before["executed"] + 1
    )
    assert sample("signoff_decisions_total", channel="test", outcome="approve") == (
        before["approve"] + 1
    )
    assert sample("signoff_decisions_total", channel="test", outcome="already_decided") == (
        before["refused"] + 1
    )
    assert sample("signoff_span_seconds_count", span="execute") == before["execute"] + 1
    assert sample("signoff_click_to_executed_seconds_count") == before["click"] + 1


async def test_json_log_lines_carry_the_ids_of_what_they_tell(database_url: str) -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    logs.setup("json", "info", out, role="worker", worker_id="w-logs")
    try:
        async with harness(database_url, model=Scripted(pix())) as h:
            card = await one_card(h)
            await h.approve(card)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    lines = [json.loads(line) for line in out.getvalue().splitlines()]  # every line is JSON
    by_message = {line["message"]: line for line in lines if line.get("card_id") == card.id}
    for message in ("card proposed", "card decided", "card executed"):
        line = by_message[message]
        assert line["run_id"] == card.run_id, line
        assert line["thread_id"] == card.thread_id, line
        assert line["level"] == "INFO" and line["role"] == "worker", line
        assert line["worker_id"] == "w-logs" and "timestamp" in line, line
    assert by_message["card decided"]["channel"] == "test"


async def test_inbox_lag_and_pending_for_the_metrics_port() -> None:
    """``signoff_inbox_lag`` / ``signoff_inbox_pending`` come from XINFO GROUPS (real Redis)."""
    import secrets

    from signoff.runtime.bus.protocol import Job
    from signoff.runtime.bus.redis import RedisBus
    from signoff.runtime.keys import Keys
    from signoff.runtime.metrics_server import InboxStats
    from tests import services

    keys = Keys(f"so-t-{secrets.token_hex(4)}:")
    bus = RedisBus.from_url(services.redis_url(), keys)
    try:
        assert await bus.inbox_stats() == (0, 0)  # no stream yet
        assert await bus.take("c1", 0.01) == []  # makes the group
        for i in range(3):
            await bus.enqueue(
                Job(
                    tenant="t",
                    thread_id="th",
                    text="x",
                    user="u",
                    channel="http",
                    message_id=f"m{i}",
                )
            )
        assert await bus.inbox_stats() == (3, 0)
        taken = await bus.take("c1", 0.1)
        assert await bus.inbox_stats() == (3 - len(taken), len(taken))
        stats = InboxStats(bus)
        await stats.refresh()
        assert [v for _, _, v in stats.gauges()] == [3 - len(taken), len(taken)]
        await bus.ack(taken[0].id)
        assert await bus.inbox_stats() == (3 - len(taken), len(taken) - 1)
    finally:
        await bus.client.redis.delete(keys.inbox)
        await bus.close()


async def test_the_metrics_server_serves_the_registry_and_refuses_a_taken_port() -> None:
    import socket

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from signoff.runtime.errors import ConfigError
    from signoff.runtime.metrics import LatencySamples
    from signoff.runtime.metrics_server import MetricsServer

    samples = LatencySamples()
    samples.append(2_000_000)
    server = MetricsServer(samples)
    server.add(lambda: [("signoff_test_gauge", "A gauge read when scraped.", 7.0)])
    port = await server.start("127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            r = await http.get("/metrics")
            assert r.headers["content-type"].startswith("text/plain")
            families = {f.name: f for f in text_string_to_metric_families(r.text)}
            assert families["signoff_test_gauge"].samples[0].value == 7.0
            assert "signoff_decision_latency_seconds" in families
            raw = (await http.get("/metrics/decision-latency", params={"after": 0})).json()
            assert raw["samples_ns"][-1] == 2_000_000 and raw["count"] == samples.count
            assert (await http.get("/nothing")).status_code == 404
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            with pytest.raises(ConfigError, match="cannot serve metrics"):
                await MetricsServer().start("127.0.0.1", taken.getsockname()[1])
    finally:
        await server.close()
    # Its gauges leave the registry with it.
    assert REGISTRY.get_sample_value("signoff_test_gauge") is None


async def test_a_workers_readyz_sees_what_a_tcp_probe_did_not(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator probe's #10: a worker's probes were TCP checks of its metrics port, so
    a worker cut off from Postgres, or whose loops had ended, stayed Ready. ``/readyz``
    answers 503 naming why (never the driver's error text), 200 once it is back."""
    import httpx

    from signoff.runtime.errors import Unavailable
    from signoff.runtime.metrics_server import MetricsServer, worker_ready

    async with harness(database_url, model=Scripted(pix())) as h:
        server = MetricsServer()
        server.ready = lambda: worker_ready(h.worker, h.store, h.bus)
        port = await server.start("127.0.0.1", 0)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                assert (await http.get("/readyz")).json() == {"ok": True}
                real = h.store.ping

                async def away() -> None:
                    raise Unavailable("connect to 10.1.2.3:5432 refused")

                monkeypatch.setattr(h.store, "ping", away)
                r = await http.get("/readyz")
                assert (r.status_code, r.json()) == (
                    503,
                    {"ok": False, "error": "postgres unavailable"},
                )
                monkeypatch.setattr(h.store, "ping", real)
                assert (await http.get("/readyz")).status_code == 200
                (sweep,) = [t for t in h.worker.ticks.tasks if t.get_name() == "signoff-sweep"]
                sweep.cancel()
                await asyncio.sleep(0.05)
                r = await http.get("/readyz")
                assert (r.status_code, r.json()["error"]) == (503, "loops ended: signoff-sweep")
                assert (await http.get("/healthz")).status_code == 200  # alive, not ready
        finally:
            await server.close()
