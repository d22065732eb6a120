"""The signoff side of ``bench/workflows.py``: real gateway and worker processes.

Runs of ``bench/workflow_app.py``'s ``wake`` workflow are started over HTTP and park
at their event gate on the worker; the bench then delivers each one's event over
HTTP (``POST /v1/workflow-runs/{id}/events``) from this process and reads the rows the
woken step wrote. Memory: a fresh cluster, its worker's RSS before and after N runs
park, divided by N.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.common import QUOTAS_OFF, Cluster, Services, gather_limited, log, summarize_ms
from bench.dbos_side import phases
from bench.rawhttp import RawClient

APP = "bench.workflow_app:app"
WORKFLOW = "wake"
USER = "bench-wf"
WARM_UP = 32


def start_path() -> str:
    return f"/v1/workflows/{WORKFLOW}/runs"


def event_path(run_id: str) -> str:
    return f"/v1/workflow-runs/{run_id}/events"


def make_cluster(svc: Services, workdir: Path, **env: str) -> Cluster:
    from bench.common import ROOT

    c = Cluster(
        database_url=svc.database_url,
        redis_url=svc.redis_url,
        workdir=workdir,
        env_extra={**QUOTAS_OFF, **env},
        cwd=ROOT,
        services=svc,
        app=APP,
    )
    c.launch(gateways=1, workers=1)
    return c


async def start_runs(http: httpx.AsyncClient, n: int, limit: int = 16) -> list[str]:
    async def one(_: int) -> str:
        r = await http.post(start_path(), json={"input": None})
        if r.status_code not in (200, 201, 202):
            raise RuntimeError(f"start answered {r.status_code}: {r.text[:300]}")
        body = r.json()
        run = body.get("run", body)
        return str(run["id"])

    return list(await gather_limited([one(i) for i in range(n)], limit))


async def wait_parked(database_url: str, ids: list[str], timeout: float) -> float:
    conn = await asyncpg.connect(database_url)
    t = time.monotonic()
    try:
        while time.monotonic() - t < timeout:
            parked = await conn.fetchval(
                "SELECT count(*) FROM workflow_runs WHERE id = ANY($1::uuid[]) "
                "AND status = 'awaiting_event'",
                ids,
            )
            if parked >= len(ids):
                return time.monotonic() - t
            await asyncio.sleep(0.2)
        raise RuntimeError(f"only {parked} of {len(ids)} runs parked after {timeout}s")
    finally:
        await conn.close()


def server_samples(c: Cluster, after: int | None) -> list[int]:
    """The worker's wake samples (ns) after the ``after``-th; with None, ``[count]``."""
    import json
    import urllib.request

    (worker,) = c.workers
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics/workflow-latency?after="
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url + (str(10**15) if after is None else str(after)), timeout=10) as r:
        data = json.loads(r.read())
    return [int(data["count"])] if after is None else [int(x) for x in data["samples_ns"]]


def raw_client(c: Cluster, size: int) -> RawClient:
    (gw,) = c.gateways
    return RawClient(gw.url, {"Authorization": f"Bearer {c.token(USER)}"}, size=max(size, 8))


async def deliver_all(
    raw: RawClient, ids: list[str], rate: float | None, senders: int
) -> dict[str, Any]:
    """Deliver each run's event over HTTP (``bench/rawhttp.py``, keep-alive connections):
    open loop at ``rate``/s, or ``senders`` concurrent senders (saturation)."""
    errors: list[int] = []

    async def one(run_id: str) -> None:
        body = {"name": "wake", "payload": {"sent_ns": time.time_ns()}}
        status, _ = await raw.post(event_path(run_id), body)
        if status >= 300:
            errors.append(status)

    t0 = time.monotonic()
    if rate is None:
        await gather_limited([one(i) for i in ids], senders)
    else:
        tasks = []
        for i, run_id in enumerate(ids):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(run_id)))
        await asyncio.gather(*tasks)
    return {"send_seconds": round(time.monotonic() - t0, 3), "send_errors": len(errors)}


async def rows_of(database_url: str, ids: list[str], timeout: float) -> list[dict[str, int]]:
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            rows = await conn.fetch("SELECT * FROM wf_wakes WHERE run_id = ANY($1::uuid[])", [*ids])
            if len(rows) >= len(ids) or time.monotonic() > deadline:
                return [dict(r) for r in rows]
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


def figures(rows: list[dict[str, Any]], offered: int) -> dict[str, Any]:
    if not rows:
        return {"woken": 0, "offered": offered}
    first = min(r["sent_ns"] for r in rows)
    last = max(r["done_ns"] for r in rows)
    return {
        "offered": offered,
        "woken": len(rows),
        "wake_ms": summarize_ms([r["step_ns"] - r["sent_ns"] for r in rows]),
        "wakes_per_s": round(len(rows) / max((last - first) / 1e9, 1e-9), 1),
        "step_executions_over_one": sum(int(r["executions"]) - 1 for r in rows),
    }


def client(c: Cluster) -> httpx.AsyncClient:
    (gw,) = c.gateways
    return httpx.AsyncClient(
        base_url=gw.url,
        headers={"Authorization": f"Bearer {c.token(USER)}"},
        trust_env=False,
        timeout=60,
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
    )


async def load_phases(c: Cluster, svc: Services, args: Any) -> dict[str, Any]:
    """Each phase: park n + a warm-up of 32 runs; the warm-up's events open the sender's
    connections (not measured), then the n events are sent at the phase's pace."""
    out: dict[str, Any] = {}
    async with client(c) as http:
        for _, phase, n, rate in phases(args):
            t = time.monotonic()
            ids = await start_runs(http, n + WARM_UP)
            await wait_parked(svc.database_url, ids, args.drain_timeout)
            park_s = round(time.monotonic() - t, 2)
            raw = raw_client(c, args.senders)
            try:
                await deliver_all(raw, ids[:WARM_UP], None, args.senders)
                await rows_of(svc.database_url, ids[:WARM_UP], args.drain_timeout)
                ids = ids[WARM_UP:]
                before = await asyncio.to_thread(server_samples, c, None)
                sent = await deliver_all(raw, ids, rate, args.senders)
            finally:
                await raw.close()
            rows = await rows_of(svc.database_url, ids, args.drain_timeout)
            server = await asyncio.to_thread(server_samples, c, int(before[0]))
            figs = {
                **figures(rows, n),
                # the server's own span: the gateway received the event -> the worker
                # claimed the run (/metrics/workflow-latency); the rest is HTTP and the step
                "server_wake_ms": summarize_ms(server),
                **sent,
                "park_seconds": park_s,
            }
            out.setdefault(phase, []).append(figs)
            log(f"signoff {phase}: {figs.get('wake_ms')} {figs.get('wakes_per_s')}/s")
    return out


CLONE = """
WITH g AS (
  SELECT i, md5($2 || ':w:' || i)::uuid AS rid, md5($2 || ':i:' || i)::uuid AS iid
  FROM generate_series($3::int, $4::int) i
), r AS (
  INSERT INTO workflow_runs (id, tenant, owner, app, workflow, status, step, state, input,
                             steps, worker_id)
  SELECT g.rid, w.tenant, w.owner, w.app, w.workflow, w.status, w.step, w.state, w.input,
         w.steps, w.worker_id
  FROM g, workflow_runs w WHERE w.id = $1
)
INSERT INTO interrupts (id, run_id, step, step_name, kind, reason, schema, event, deadline,
                        timeout_response, status, detail)
SELECT g.iid, g.rid, x.step, x.step_name, x.kind, x.reason, x.schema, x.event, x.deadline,
       x.timeout_response, 'open', x.detail
FROM g, interrupts x WHERE x.run_id = $1 AND x.status = 'open'
"""


async def clone(database_url: str, template: str, start: int, end: int, salt: str) -> list[str]:
    """Runs parked like ``template`` (its row and its open interrupt) for i in start..end."""
    conn = await asyncpg.connect(database_url)
    try:
        for lo in range(start, end + 1, 10_000):
            hi = min(lo + 9_999, end)
            await conn.execute(CLONE, template, salt, lo, hi, timeout=600)
        rows = await conn.fetch(
            "SELECT md5($1 || ':w:' || i)::uuid::text AS id FROM generate_series($2::int, $3::int) i",
            salt,
            start,
            end,
        )
        return [r["id"] for r in rows]
    finally:
        await conn.close()


async def memory(c: Cluster, svc: Services, args: Any) -> dict[str, Any]:
    """RSS of the worker before and after N runs are parked. The first size is parked
    through the worker (started over HTTP: the worker runs to the gate and opens it); a
    larger size is reached by cloning a parked run in Postgres (a parked run is a row and
    its open interrupt), and a sample of the clones is then woken to show they are live."""
    (worker,) = c.workers
    await asyncio.sleep(2)
    base = worker.rss()
    out: dict[str, Any] = {}
    ids: list[str] = []
    async with client(c) as http:
        for n in args.parked:
            t = time.monotonic()
            if not ids:
                ids = await start_runs(http, n, 32)
                await wait_parked(svc.database_url, ids, max(args.drain_timeout, n / 20))
                how = "through the worker"
            else:
                ids += await clone(svc.database_url, ids[0], len(ids), n - 1, svc.dbname)
                how = f"{len(ids) - args.parked[0]} cloned in Postgres"
            # a few of the worker's ticks (poll, adoption, sweeper) over the parked runs
            await asyncio.sleep(max(3.0, 2 * args.poll))
            rss = worker.rss()
            out[str(n)] = {
                "parked": n,
                "how": how,
                "baseline_rss": base,
                "rss": rss,
                "bytes_per_workflow": round((rss - base) / n, 1),
                "park_seconds": round(time.monotonic() - t, 1),
            }
            log(f"signoff memory: {n} parked ({how}): {(rss - base) / n:.0f} B/workflow")
        sample = ids[-args.sample :]
        raw = raw_client(c, 8)
        try:
            await deliver_all(raw, sample, None, 8)
        finally:
            await raw.close()
        rows = await rows_of(svc.database_url, sample, args.drain_timeout)
        out["sample_woken"] = {"offered": len(sample), "woken": len(rows)}
    return out


def run(args: Any, svc: Services, workdir: Path) -> dict[str, Any]:
    c = make_cluster(svc, workdir / "load")
    try:
        out = asyncio.run(load_phases(c, svc, args))
    finally:
        c.stop()
    c = make_cluster(svc, workdir / "memory", SIGNOFF_POLL_SECONDS=str(args.poll))
    try:
        out["memory"] = asyncio.run(memory(c, svc, args))
    finally:
        c.stop()
    return out
