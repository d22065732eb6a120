"""Operating real gateway and worker processes: the metrics port, start-up banners, JSON
logs, /readyz against Postgres and Redis outages, and back-pressure."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from tests import services
from tests.cluster import Cluster, Proc, cluster
from tests.faults.proxy import Proxy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

TOOL = "create_pix_charge"


@pytest.fixture
def redis_url() -> str:
    return services.redis_url()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics text, parsed by prometheus-client's own parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(c: Cluster, proc: Proc, name: str, **labels: str) -> float:
    return samples(c.scrape(proc)).get((name, tuple(sorted(labels.items()))), 0.0)


async def until(fn: Callable[[], Awaitable[Any]], timeout: float = 30, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await fn()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")


def json_lines(proc: Proc) -> list[dict[str, Any]]:
    out = []
    for line in proc.output().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


async def a_card(c: Cluster, gw: Proc, user: str) -> dict[str, Any]:
    ws = await websockets.connect(gw.ws_url)
    try:
        await ws.send(json.dumps({"type": "auth", "token": c.token(user)}))
        assert json.loads(await ws.recv())["type"] == "ready"
        await ws.send(json.dumps({"type": "message", "text": "cobre 150 do João", "id": "m"}))
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if msg["type"] == "event" and msg["kind"] == "card":
                card: dict[str, Any] = msg["data"]
                return card
    finally:
        await ws.close()


async def test_metrics_port_banners_and_json_logs(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    with cluster(database_url, redis_url, tmp_path, gateways=1, workers=1) as c:
        (gw,), (wk,) = c.gateways, c.workers
        async with httpx.AsyncClient(base_url=gw.url) as http:
            # The public port serves no metrics (design note 27): only the metrics port does.
            assert (await http.get("/metrics")).status_code == 404
            names = {f.name for f in text_string_to_metric_families(c.scrape(gw))}
            assert {"signoff_websockets", "signoff_gateway_in_flight"} <= names
            assert "process_resident_memory_bytes" in names
            names = {f.name for f in text_string_to_metric_families(c.scrape(wk))}
            assert {"signoff_parked_runs", "signoff_inbox_lag", "signoff_inbox_pending"} <= names
            pending0 = value(c, wk, "signoff_card_transitions_total", status="pending", tool=TOOL)
            decided0 = value(c, gw, "signoff_decisions_total", channel="http", outcome="approve")
            executed0 = value(c, wk, "signoff_card_transitions_total", status="executed", tool=TOOL)
            click0 = value(c, wk, "signoff_click_to_executed_seconds_count")

            card = await a_card(c, gw, "ana")
            assert value(c, wk, "signoff_card_transitions_total", status="pending", tool=TOOL) == (
                pending0 + 1
            )
            assert value(c, wk, "signoff_parked_runs") >= 1
            r = await http.post(
                f"/v1/cards/{card['id']}/resolve",
                json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
                headers={"Authorization": f"Bearer {c.token('ana')}"},
            )
            assert r.status_code == 200, r.text
            assert value(c, gw, "signoff_decisions_total", channel="http", outcome="approve") == (
                decided0 + 1
            )
            assert value(c, gw, "signoff_card_transitions_total", status="approved", tool=TOOL) >= 1

            async def executed() -> bool:
                return (
                    value(c, wk, "signoff_card_transitions_total", status="executed", tool=TOOL)
                    == executed0 + 1
                )

            await until(executed, what="the executed series moved")
            assert value(c, wk, "signoff_click_to_executed_seconds_count") == click0 + 1
            assert value(c, wk, "signoff_span_seconds_count", span="execute") >= 1
            assert value(c, gw, "signoff_span_seconds_count", span="resolve") >= 1

        # Banners: what listens where, which app, model and bus.
        gw_out, wk_out = gw.output(), wk.output()
        assert f"signoff gateway listening on http://127.0.0.1:{gw.port}" in gw_out
        assert f"metrics: http://127.0.0.1:{gw.metrics_port}/metrics" in gw_out
        assert "running app payments (signoff.demo:app); model offline-demo; bus redis" in wk_out
        assert f"metrics: http://127.0.0.1:{wk.metrics_port}/metrics" in wk_out
        # JSON log lines, one per event, with the ids of what they tell as fields.
        decided = [x for x in json_lines(gw) if x.get("card_id") == card["id"]]
        assert [x["message"] for x in decided] == ["card decided"]
        assert decided[0]["run_id"] == card["run_id"] and decided[0]["role"] == "gateway"
        told = {x["message"]: x for x in json_lines(wk) if x.get("card_id") == card["id"]}
        assert {"card proposed", "card executed"} <= set(told)
        for line in told.values():
            assert line["thread_id"] == card["thread_id"] and line["run_id"] == card["run_id"]
            assert line["worker_id"] == wk.name and line["role"] == "worker"


async def test_the_metrics_port_bounds_slow_requests_and_odd_cursors(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The hostile prober's repro: a request whose headers never end held a metrics-port
    connection (and a descriptor of the gateway's process) for ever, where the public port
    answers 408; ``?after=²`` (a Unicode digit) answered 500."""
    with cluster(
        database_url,
        redis_url,
        tmp_path,
        gateways=1,
        workers=1,
        SIGNOFF_HEADER_TIMEOUT_SECONDS="1",
    ) as c:
        (gw,), (wk,) = c.gateways, c.workers
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.metrics_port)
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-a: b\r\n")
            await writer.drain()
            t0 = time.monotonic()
            answer = await asyncio.wait_for(reader.read(), 10)
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert time.monotonic() - t0 < 5
        finally:
            writer.close()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{wk.metrics_port}") as http:
            for path in ("/metrics/spans", "/metrics/decision-latency"):
                for cursor in ("\u00b2", "9" * 5000, "-3", "x"):
                    r = await http.get(path, params={"after": cursor})
                    assert r.status_code == 200, (path, cursor, r.text)
                    assert "server" not in r.headers


async def test_readyz_fails_with_postgres_or_redis_down_and_recovers(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    pg_port = int(database_url.split("@")[-1].split("/")[0].rsplit(":", 1)[1])
    redis_port = int(redis_url.split("//")[1].split("/")[0].rsplit(":", 1)[1])
    with (
        Proxy(pg_port) as pg,
        Proxy(redis_port) as rd,
        cluster(database_url, redis_url, tmp_path, gateways=0, workers=0) as c,
    ):
        gw = c.add_gateway(
            SIGNOFF_DATABASE_URL=pg.url_for(database_url),
            SIGNOFF_REDIS_URL=rd.url_for(redis_url),
            SIGNOFF_DB_TIMEOUT_SECONDS="1",
        )
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as http:

            async def status(want: int) -> bool:
                return (await http.get("/readyz")).status_code == want

            assert await status(200)
            for proxy, what in ((rd, "redis"), (pg, "postgres")):
                proxy.refuse(True)
                proxy.reset()
                await until(lambda: status(503), what=f"/readyz 503 with {what} down")
                r = await http.get("/readyz")
                body = r.json()
                assert r.status_code == 503, (r.status_code, body)
                # the dependency named, its address not (the probe is unauthenticated)
                assert body == {"ok": False, "error": f"{what} unavailable"}, body
                assert (await http.get("/healthz")).status_code == 200  # alive, not ready
                proxy.heal()
                await until(lambda: status(200), what=f"/readyz 200 once {what} is back")
        assert value(c, gw, "signoff_redis_errors_total") >= 1
        assert value(c, gw, "signoff_postgres_errors_total") >= 1


async def test_an_overloaded_gateway_answers_typed_503s_and_counts_them(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Postgres slowed down: past SIGNOFF_MAX_IN_FLIGHT requests at once, the gateway refuses
    the rest at once with 503 `overloaded` and Retry-After, instead of queueing them."""
    pg_port = int(database_url.split("@")[-1].split("/")[0].rsplit(":", 1)[1])
    with (
        Proxy(pg_port) as pg,
        cluster(database_url, redis_url, tmp_path, gateways=0, workers=0) as c,
    ):
        gw = c.add_gateway(SIGNOFF_DATABASE_URL=pg.url_for(database_url), SIGNOFF_MAX_IN_FLIGHT="4")
        headers = {"Authorization": f"Bearer {c.token('ol')}"}
        async with httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=30) as http:
            thread = (await http.post("/v1/threads")).json()["thread"]["id"]
            ws = await websockets.connect(gw.ws_url)
            await ws.send(json.dumps({"type": "auth", "token": c.token("ol")}))
            assert json.loads(await ws.recv())["type"] == "ready"
            pg.delay(up=0.5)
            t0 = time.monotonic()
            gets = asyncio.gather(*(http.get(f"/v1/threads/{thread}") for _ in range(12)))
            await asyncio.sleep(0.25)  # four requests hold the four slots now
            frame = {"type": "message", "id": "w", "thread_id": thread, "text": "saldo"}
            await ws.send(json.dumps(frame))
            refusal = json.loads(await asyncio.wait_for(ws.recv(), 10))
            answers = await gets
            pg.heal()
            # A WebSocket write is refused the same way, as an error frame; the socket stays.
            assert refusal["type"] == "error" and refusal["id"] == "w", refusal
            assert (refusal["status"], refusal["error"]) == (503, "overloaded"), refusal
            assert refusal["detail"]["retry_after"] == 1
            await ws.close()
            codes = sorted(r.status_code for r in answers)
            assert codes.count(200) >= 4, codes
            refused = [r for r in answers if r.status_code == 503]
            assert refused, codes
            for r in refused:
                assert r.json()["error"] == "overloaded", r.text
                assert r.headers["retry-after"] == "1"
            assert time.monotonic() - t0 < 20
            counted = value(c, gw, "signoff_overload_refusals_total", reason="in_flight")
            assert counted == len(refused) + 1  # and the WebSocket frame
            # Back under the limit: answered again.
            assert (await http.get(f"/v1/threads/{thread}")).status_code == 200
            # Slow clients (bodies still arriving) hold no slot: others are still served.
            slow = []
            for _ in range(6):
                _, writer = await asyncio.open_connection("127.0.0.1", gw.port)
                writer.write(
                    f"POST /v1/threads/{thread}/messages HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: {headers['Authorization']}\r\n"
                    "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
                )
                await writer.drain()
                slow.append(writer)
            await asyncio.sleep(0.5)
            assert (await http.get(f"/v1/threads/{thread}")).status_code == 200
            assert value(c, gw, "signoff_gateway_in_flight") == 0
            for writer in slow:
                writer.close()
