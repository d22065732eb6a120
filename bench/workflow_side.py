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

APP = "bench.workflow_app:app"
WORKFLOW = "wake"
USER = "bench-wf"


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


async def deliver_all(
    http: httpx.AsyncClient, ids: list[str], rate: float | None, senders: int
) -> dict[str, Any]:
    """Deliver each run's event: open loop at ``rate``/s, or ``senders`` concurrent senders."""
    errors: list[int] = []

    async def one(run_id: str) -> None:
        r = await http.post(
            event_path(run_id), json={"name": "wake", "payload": {"sent_ns": time.time_ns()}}
        )
        if r.status_code >= 300:
            errors.append(r.status_code)

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
    out: dict[str, Any] = {}
    async with client(c) as http:
        for phase, n, rate in (
            ("open", args.latency_wakes, args.rate),
            ("saturation", args.saturation_wakes, None),
        ):
            t = time.monotonic()
            ids = await start_runs(http, n)
            await wait_parked(svc.database_url, ids, args.drain_timeout)
            park_s = round(time.monotonic() - t, 2)
            sent = await deliver_all(http, ids, rate, args.senders)
            rows = await rows_of(svc.database_url, ids, args.drain_timeout)
            out[phase] = {**figures(rows, n), **sent, "park_seconds": park_s}
            log(f"signoff {phase}: {out[phase].get('wake_ms')} {out[phase].get('wakes_per_s')}/s")
    return out


async def memory(c: Cluster, svc: Services, args: Any) -> dict[str, Any]:
    (worker,) = c.workers
    await asyncio.sleep(2)
    base = worker.rss()
    out: dict[str, Any] = {}
    total = 0
    ids: list[str] = []
    async with client(c) as http:
        for n in args.parked:
            t = time.monotonic()
            ids += await start_runs(http, n - total, 32)
            total = n
            await wait_parked(svc.database_url, ids, max(args.drain_timeout, n / 50))
            await asyncio.sleep(2)
            rss = worker.rss()
            out[str(n)] = {
                "parked": n,
                "baseline_rss": base,
                "rss": rss,
                "bytes_per_workflow": round((rss - base) / n, 1),
                "park_seconds": round(time.monotonic() - t, 1),
            }
            log(f"signoff memory: {n} parked: {(rss - base) / n:.0f} B/workflow")
    return out


def run(args: Any, svc: Services, workdir: Path) -> dict[str, Any]:
    c = make_cluster(svc, workdir / "load")
    try:
        out = asyncio.run(load_phases(c, svc, args))
    finally:
        c.stop()
    c = make_cluster(svc, workdir / "memory")
    try:
        out["memory"] = asyncio.run(memory(c, svc, args))
    finally:
        c.stop()
    return out
