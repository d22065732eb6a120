"""A workflow resume's decision map over three pending cards (approve, reject, edit),
applied exactly once although the worker applying it is SIGKILLed after the first card
(fault point ``workflow.after_first_decision``): real gateway and worker processes."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.cluster import cluster
from tests.faults.conftest import Invariants
from tests.faults.helpers import bearer, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.agent_wf_app:build"
USER = "ana"


async def test_decision_map_applied_once_when_the_worker_dies_halfway(
    database_url: str, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    with cluster(
        database_url,
        redis_url,
        tmp_path,
        gateways=2,
        workers=0,
        app=APP,
        cwd=ROOT,
        SIGNOFF_LEASE_SECONDS="2",
        SIGNOFF_POLL_SECONDS="0.5",
        SIGNOFF_SWEEP_SECONDS="0.5",
    ) as c:
        invariants.watch_cluster(c)
        doomed = c.add_worker("doomed", SIGNOFF_FAULTS="workflow.after_first_decision")
        gw_a, gw_b = c.gateways
        headers = bearer(c, USER)
        async with (
            httpx.AsyncClient(base_url=gw_a.url, headers=headers, trust_env=False) as a,
            httpx.AsyncClient(base_url=gw_b.url, headers=headers, trust_env=False) as b,
        ):
            r = await a.post("/v1/workflows/approvals/runs", json={})
            assert r.status_code == 201, r.text
            run_id = r.json()["run"]["id"]

            async def gate() -> dict[str, Any] | None:
                body = (await a.get(f"/v1/workflow-runs/{run_id}")).json()
                g = body.get("gate")
                return g if g and len(g["schema"].get("x-signoff-cards", [])) == 3 else None

            opened = await wait_until(gate, what="parked on three cards")
            assert opened is not None
            cards = {c_["summary"]: c_["id"] for c_ in opened["schema"]["x-signoff-cards"]}
            ana, bruno, carla = (
                cards["Pay 10 to ana"],
                cards["Pay 20 to bruno"],
                cards["Pay 30 to carla"],
            )
            c.add_worker("survivor")
            decisions = {ana: True, bruno: False, carla: {"edit": {"amount": 25}}}
            r = await b.post(f"/v1/workflow-runs/{run_id}/resume", json={"payload": decisions})
            assert r.status_code == 200, r.text

            code = await asyncio.to_thread(doomed.wait, 30)
            assert code == -signal.SIGKILL, doomed.output()

            async def completed() -> dict[str, Any] | None:
                run = (await b.get(f"/v1/workflow-runs/{run_id}")).json()["run"]
                return run if run["status"] == "completed" else None

            run = await wait_until(completed, timeout=60, what="completed by the survivor")
            assert run is not None
        assert run["state"]["agent"]["reply"] == "paid: ana=10, carla=25"
        db = await asyncpg.connect(database_url)
        try:
            pays = {
                r["payee"]: (r["amount"], r["executions"])
                for r in await db.fetch(
                    "SELECT p.payee, p.amount, p.executions FROM agent_wf_pays p JOIN cards k "
                    "ON k.operation_id::text = p.operation_id WHERE k.tenant = $1",
                    c.tenant,
                )
            }
            assert pays == {"ana": (10, 1), "carla": (25, 1)}
            rows = await db.fetch(
                "SELECT e.card_id::text AS card, e.to_status, e.actor FROM card_events e "
                "JOIN cards k ON k.id = e.card_id WHERE k.thread_id = "
                "(SELECT thread_id FROM cards WHERE id = $1) ORDER BY e.id",
                ana,
            )
        finally:
            await db.close()
        trail: dict[str, list[str]] = {}
        for row in rows:
            trail.setdefault(row["card"], []).append(row["to_status"])
        assert trail[ana] == ["pending", "approved", "executing", "executed"]
        assert trail[bruno] == ["pending", "rejected"]
        assert trail[carla] == ["pending", "modified"]
        (edited,) = set(trail) - {ana, bruno, carla}
        assert trail[edited] == ["pending", "approved", "executing", "executed"]
        assert {r["actor"] for r in rows if r["to_status"] in ("approved", "rejected")} == {USER}
        log = doomed.output()
        assert "workflow.after_first_decision" in log
