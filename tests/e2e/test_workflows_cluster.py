"""Workflows across real gateway and worker processes (Redis + Postgres)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests import services
from tests.cluster import Cluster, cluster

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

APP = "tests.e2e.wf_cluster_app:app"


@pytest.fixture
def pools(database_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with cluster(
        database_url,
        services.redis_url(),
        tmp_path,
        gateways=2,
        workers=2,
        app=APP,
        SIGNOFF_LEASE_SECONDS="2",
        SIGNOFF_POLL_SECONDS="1",
    ) as c:
        yield c


def auth(c: Cluster, user: str = "ana") -> dict[str, str]:
    return {"Authorization": f"Bearer {c.token(user)}"}


async def status_of(http: httpx.AsyncClient, c: Cluster, run_id: str) -> dict[str, Any]:
    r = await http.get(f"/v1/workflow-runs/{run_id}", headers=auth(c))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def until_status(
    http: httpx.AsyncClient, c: Cluster, run_id: str, want: str, timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body = await status_of(http, c, run_id)
        if body["run"]["status"] == want:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} is {body['run']['status']}, not {want}")
        await asyncio.sleep(0.1)


async def side_effects(database_url: str, run_id: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT step, count(*) AS n FROM wf_side_effects WHERE run_id = $1 GROUP BY step",
            run_id,
        )
    finally:
        await conn.close()
    return {r["step"]: int(r["n"]) for r in rows}


async def test_parked_run_survives_a_full_restart_and_resumes_on_another_gateway(
    pools: Cluster, database_url: str
) -> None:
    c = pools
    async with httpx.AsyncClient(base_url=c.gateways[0].url, timeout=30) as a:
        r = await a.post("/v1/workflows/payout/runs", json={}, headers=auth(c))
        assert r.status_code == 201, r.text
        run_id = r.json()["run"]["id"]
        body = await until_status(a, c, run_id, "awaiting_human")
        gate = body["gate"]
        assert gate["reason"] == "approve the payout" and gate["kind"] == "human"
        assert gate["schema"]["required"] == ["approved"]
        assert body["run"]["state"] == {"amount": 120}
    assert await side_effects(database_url, run_id) == {"extract": 1}

    # Every process dies at once (no graceful hand-over), then a new set starts.
    for p in c.gateways + c.workers:
        p.signal(signal.SIGKILL)
    for p in c.gateways + c.workers:
        p.wait(10)
        p.stop()  # (closes its log)
    first_gateway = c.gateways[0].url
    c.gateways.clear()
    c.workers.clear()
    c.launch(gateways=2, workers=2)
    b_url = c.gateways[1].url
    assert b_url != first_gateway

    async with httpx.AsyncClient(base_url=b_url, timeout=30) as b:
        body = await status_of(b, c, run_id)
        assert body["run"]["status"] == "awaiting_human"  # still parked after the restart
        r = await b.post(
            f"/v1/workflow-runs/{run_id}/resume",
            json={"payload": {"approved": "yes"}},
            headers=auth(c),
        )
        assert r.status_code == 422, r.text
        assert (await status_of(b, c, run_id))["run"]["status"] == "awaiting_human"
        r = await b.post(
            f"/v1/workflow-runs/{run_id}/resume",
            json={"payload": {"approved": True, "steps": []}},
            headers=auth(c),
        )
        assert r.status_code == 422 and r.json()["error"] == "reserved_key", r.text
        r = await b.post(
            f"/v1/workflow-runs/{run_id}/resume",
            json={"payload": {"approved": True}},
            headers=auth(c, "eve"),
        )
        assert r.status_code == 403, r.text
        r = await b.post(
            f"/v1/workflow-runs/{run_id}/resume",
            json={"payload": {"approved": True, "note": "fine", "undeclared": 1}},
            headers=auth(c),
        )
        assert r.status_code == 200, r.text
        r = await b.post(
            f"/v1/workflow-runs/{run_id}/resume",
            json={"payload": {"approved": False}},
            headers=auth(c),
        )
        assert r.status_code == 409 and r.json()["error"] == "not_parked", r.text
        body = await until_status(b, c, run_id, "completed")
        state = body["run"]["state"]
        assert state == {"amount": 120, "approved": True, "note": "fine", "paid": True}
        resolved = body["interrupts"][-1]
        assert resolved["status"] == "resolved" and resolved["resolved_by"] == "ana"
    await asyncio.sleep(0.5)
    assert await side_effects(database_url, run_id) == {"extract": 1, "pay": 1}


async def test_live_holder_resumes_fast_and_errors_are_typed(
    pools: Cluster, database_url: str
) -> None:
    c = pools
    a_url, b_url = c.gateways[0].url, c.gateways[1].url
    async with (
        httpx.AsyncClient(base_url=a_url, timeout=30) as a,
        httpx.AsyncClient(base_url=b_url, timeout=30) as b,
    ):
        r = await a.post("/v1/workflows/nope/runs", json={}, headers=auth(c))
        assert r.status_code == 404 and r.json()["error"] == "workflow_not_found"
        r = await a.post("/v1/workflows/payout/runs", json={}, headers={})
        assert r.status_code == 401
        r = await a.get("/v1/workflow-runs/00000000-0000-0000-0000-000000000000", headers=auth(c))
        assert r.status_code == 404
        spec = (await a.get("/openapi.json")).json()
        assert "/v1/workflow-runs/{run_id}/resume" in spec["paths"]
        assert "ResumeIn" in spec["components"]["schemas"]

        r = await a.post("/v1/workflows/payout/runs", json={}, headers=auth(c))
        run_id = r.json()["run"]["id"]
        await until_status(a, c, run_id, "awaiting_human")
        # Two resumes race on two gateways: one wins, the other is a 409.
        answers = await asyncio.gather(
            a.post(
                f"/v1/workflow-runs/{run_id}/resume",
                json={"payload": {"approved": True}},
                headers=auth(c),
            ),
            b.post(
                f"/v1/workflow-runs/{run_id}/resume",
                json={"payload": {"approved": False}},
                headers=auth(c),
            ),
        )
        assert sorted(x.status_code for x in answers) == [200, 409], [x.text for x in answers]
        await until_status(a, c, run_id, "completed", timeout=10)
        # The live holder was signalled (not polled): its wake latency was recorded.
        woken = c.latency_samples({}, what="workflow")
        assert len(woken) == 1 and 0 < woken[0] < 5e9, woken
        r = await a.post(f"/v1/workflow-runs/{run_id}/cancel", headers=auth(c))
        assert r.status_code == 409 and r.json()["error"] == "run_inactive"
        r = await a.post(f"/v1/workflow-runs/{run_id}/events", json={"name": "x"}, headers=auth(c))
        assert r.status_code == 409 and r.json()["error"] == "not_parked"
        r = await a.get("/v1/workflow-runs", headers=auth(c))
        assert run_id in [x["id"] for x in r.json()["runs"]]
    await asyncio.sleep(0.5)
    assert await side_effects(database_url, run_id) == {"extract": 1, "pay": 1}


async def test_worker_killed_mid_step_reruns_only_that_step(
    pools: Cluster, database_url: str
) -> None:
    """kill -9 of the worker between a step's side effect and its completion record: the
    other worker adopts the run and runs that step again (at least once); the step before
    it is never run again."""
    c = pools
    async with httpx.AsyncClient(base_url=c.gateways[0].url, timeout=30) as a:
        r = await a.post("/v1/workflows/slow/runs", json={}, headers=auth(c))
        assert r.status_code == 201, r.text
        run_id = r.json()["run"]["id"]
        deadline = time.monotonic() + 30
        while (await side_effects(database_url, run_id)).get("hold") != 1:
            assert time.monotonic() < deadline, "the hold step never started"
            await asyncio.sleep(0.1)
        conn = await asyncpg.connect(database_url)
        try:
            holder = await conn.fetchval(
                "SELECT worker_id FROM workflow_runs WHERE id = $1", run_id
            )
            victim = next(w for w in c.workers if w.name == holder)
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            await conn.execute("INSERT INTO wf_go (run_id) VALUES ($1)", run_id)
        finally:
            await conn.close()
        body = await until_status(a, c, run_id, "completed", timeout=40)
        assert [s["name"] for s in body["run"]["steps"]] == ["extract", "hold", "pay"]
    assert await side_effects(database_url, run_id) == {"extract": 1, "hold": 2, "pay": 1}
