"""Workflows on real Postgres, in-process: recovery (crashes, Redis down, a slow
Postgres, graceful stops, lost hints), the CLI, HTTP, the README example and extension
steps."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from signoff import (
    App,
    Registry,
    Step,
    Workflow,
    WorkflowContext,
)
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.config import Settings
from signoff.runtime.errors import (
    Conflict,
    InvalidInput,
)
from signoff.runtime.keys import Keys
from signoff.runtime.models.command import CommandModel
from signoff.runtime.workflows.engine import STEP_KINDS, register_step_kind
from signoff.runtime.workflows.records import GateOpening
from signoff.runtime.workflows.service import WorkflowService
from signoff.testing import Harness
from tests import pgbouncer
from tests.integration import wf_app
from tests.integration.wf_app import calls, release
from tests.integration.wf_kit import OWNER, parked, start, status_is, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    settings = Settings(lease_seconds=2.0, poll_seconds=0.3, sweep_seconds=0.2)
    async with Harness(
        wf_app.build(), database_url=database_url, model=CommandModel(), settings=settings
    ) as harness:
        yield harness


async def test_redis_down_at_resume_commits_and_the_run_continues(h: Harness) -> None:
    run = await parked(h)
    # The resuming gateway's Redis is gone: the resolution is committed anyway, the hint
    # is lost, and the holder's poll finds the run in Postgres.
    dead = RedisBus.from_url("redis://127.0.0.1:1/0", Keys("so-dead:"))
    try:
        service = WorkflowService.of(h.store.workflows, dead, Keys("so-dead:"), h.app)
        resumed = await service.resume(run.id, {"approved": True}, tenant=h.tenant, by=OWNER)
        assert resumed.status == "running"
    finally:
        await dead.close()
    await until(status_is(h, run.id, "completed"), what="continued through Postgres")
    assert calls(run.id, "pay") == 1 and calls(run.id, "extract") == 1


async def test_a_crash_mid_step_reruns_that_step_only(database_url: str) -> None:
    """A worker killed between a step's side effect and its completion record: the next
    worker runs that step again (at least once); completed steps never run again."""
    settings = Settings(lease_seconds=1.0, poll_seconds=0.3, sweep_seconds=0.2)
    app = wf_app.build()
    async with Harness(
        app, database_url=database_url, model=CommandModel(), settings=settings
    ) as h:
        run = await start(h, "crashy")
        await until(lambda: asyncio.sleep(0, calls(run.id, "held")), what="in the held step")
        assert calls(run.id, "first") == 1
        await h.worker.stop(drain=False, release=False)  # like a crash: no completion
        async with Harness(
            app,
            database_url=database_url,
            model=CommandModel(),
            settings=settings,
            tenant=h.tenant,
            worker_id="w2-" + secrets.token_hex(3),
        ) as h2:
            await until(lambda: asyncio.sleep(0, calls(run.id, "held") == 2), what="adopted")
            release(run.id)
            done = await until(status_is(h2, run.id, "completed"), what="completed")
            assert calls(run.id, "first") == 1 and calls(run.id, "held") == 2
            assert calls(run.id, "last") == 1
            assert [s["name"] for s in done.steps] == ["first", "held", "last"]


async def test_cli_runs_list_and_show(h: Harness) -> None:
    run = await parked(h)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = pgbouncer.child_env()
        env["SIGNOFF_DATABASE_URL"] = h.database_url
        return subprocess.run(
            [sys.executable, "-m", "signoff", "runs", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = await asyncio.to_thread(cli, "list", "--kind", "workflow", "--limit", "500")
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if run.id in x)
    assert line.startswith("workflow") and "awaiting_human" in line
    assert "three: waiting at step 1 after 'extract'" in line
    told = await asyncio.to_thread(cli, "show", run.id)  # text for a person (probe)
    assert told.returncode == 0, told.stderr
    assert told.stdout.startswith(f"workflow run {run.id}\n"), told.stdout
    assert "awaiting_human" in told.stdout and "approve the payout" in told.stdout
    shown = await asyncio.to_thread(cli, "show", run.id, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["kind"] == "workflow" and data["run"]["status"] == "awaiting_human"
    assert data["interrupts"][0]["reason"] == "approve the payout"
    # by a unique prefix, as `signoff cards show` (it answered "no run 2c77faa1")
    by_prefix = await asyncio.to_thread(cli, "show", run.id[:13], "--json")
    assert by_prefix.returncode == 0, by_prefix.stderr
    assert json.loads(by_prefix.stdout)["run"]["id"] == run.id
    missing = await asyncio.to_thread(cli, "show", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode == 2 and "signoff runs: no run id starts with" in missing.stderr
    agents = await asyncio.to_thread(cli, "list", "--kind", "agent")
    assert agents.returncode == 0 and agents.stdout.startswith("KIND")
    # `--json` on a list (a newcomer probe: it printed the text table, as the README
    # promised every field as JSON)
    as_json = await asyncio.to_thread(cli, "list", "--json", "--limit", "500")
    assert as_json.returncode == 0, as_json.stderr
    listed_runs = json.loads(as_json.stdout)
    (mine,) = [r for r in listed_runs if r["id"] == run.id]
    assert mine["kind"] == "workflow" and mine["status"] == "awaiting_human"
    assert mine["where"] == "three: waiting at step 1 after 'extract'" and mine["step"] == 1
    assert mine["owner"] == run.owner and mine["updated_at"]
    stamps = [r["updated_at"] for r in listed_runs]
    assert stamps == sorted(stamps, reverse=True)  # newest first, both kinds together


async def test_resume_signals_the_live_holder_and_parked_runs_hold_no_memory(h: Harness) -> None:
    runs = [await start(h, "three") for _ in range(20)]
    for run in runs:
        await until(status_is(h, run.id, "awaiting_human"))
    await h.worker.idle()
    engine = h.worker.workflows
    # Parked = a row in Postgres: no coroutine, no task, no wait entry in the worker.
    assert not engine._inflight and not h.worker.busy()
    before = len(engine.wake_latency_ns)
    await h.workflows.resume(runs[0].id, {"approved": True}, tenant=h.tenant, by=OWNER)
    await until(status_is(h, runs[0].id, "completed"))
    assert len(engine.wake_latency_ns) == before + 1  # woken by the signal, not the poll


async def test_cancel_while_a_step_runs_stops_the_run(h: Harness) -> None:
    run = await start(h, "crashy")
    await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
    await h.workflows.cancel(run.id, tenant=h.tenant, by=OWNER)
    release(run.id)
    await asyncio.sleep(0.5)
    after = await h.store.workflows.get_workflow_run(run.id)
    assert after.status == "cancelled" and after.step == 1 and calls(run.id, "last") == 0


class Review(Step):
    """An extension step kind: parks the run like a gate, with its own detail."""

    kind = "review"

    def __init__(self, name: str) -> None:
        self.name = name

    def resume_payload(self, payload: Any) -> dict[str, Any]:
        return {str(k): bool(v) for k, v in payload.items()}  # e.g. a decision map


async def test_an_extension_step_kind_parks_with_its_detail(database_url: str) -> None:
    engines: list[Any] = []

    async def review(step: Step, ctx: WorkflowContext) -> GateOpening | dict[str, Any]:
        if ctx.state.get("a_saw") is not None and "reviewed" not in ctx.state:
            answered = await engines[0].resolution(ctx.run_id, 1)
            if answered is not None:  # re-entered after the resume
                return {"reviewed": answered.payload, "by": answered.resolved_by}
        return GateOpening(
            kind="human",
            step_name=step.name,
            reason="review these",
            schema={"type": "object"},
            event=None,
            timeout=None,
            timeout_response=None,
            lookback=None,
            detail={"cards": ["c1", "c2"], "seen": sorted(ctx.state)},
            reenter=True,
        )

    def factory(engine: Any) -> Any:
        engines.append(engine)
        return review

    register_step_kind("review", factory)
    try:
        app = App(
            name="wf-ext-" + secrets.token_hex(3),
            tools=Registry([]),
            workflows=[Workflow("ext", steps=[wf_app.counted("a"), Review("review")])],
        )
        async with Harness(app, database_url=database_url, model=CommandModel()) as h:
            run = await start(h, "ext")
            await until(status_is(h, run.id, "awaiting_human"))
            _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
            assert interrupts[0].detail == {"cards": ["c1", "c2"], "seen": ["a_saw"]}
            await h.workflows.resume(run.id, {"c1": True}, tenant=h.tenant, by=OWNER)
            done = await until(status_is(h, run.id, "completed"))
            assert [s["name"] for s in done.steps] == ["a", "review"]
            # resumed once (the step re-entered with the resolution), then completed
            assert done.state["reviewed"] == {"c1": True} and done.state["by"] == OWNER
            assert "c1" not in done.state  # a re-entered wait merges nothing itself
    finally:
        del STEP_KINDS["review"]


async def test_the_readme_workflow_works_as_written(database_url: str) -> None:
    text = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- workflow-example: begin", 1)[1].split("<!-- workflow-example: end")[0]
    code = block.split("```python\n", 1)[1].rsplit("```", 1)[0]
    namespace: dict[str, Any] = {"__name__": "readme_workflow"}
    exec(compile(code, "README.md", "exec"), namespace)
    app: App = namespace["app"]
    async with Harness(app, database_url=database_url, model=CommandModel()) as h:
        run = await h.workflows.start("payout", tenant=h.tenant, owner=OWNER)
        await until(status_is(h, run.id, "awaiting_human"))
        _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=OWNER)
        assert interrupts[-1].deadline is not None  # the 3-day timeout
        assert interrupts[-1].reason == "Approve the payout of R$ 120"  # from the state
        await h.workflows.resume(run.id, {"approved": True}, tenant=h.tenant, by=OWNER)
        await until(status_is(h, run.id, "awaiting_event"))
        await h.workflows.deliver_event(
            run.id, "payment.confirmed", {"amount": 120}, tenant=h.tenant, by=OWNER
        )
        done = await until(status_is(h, run.id, "completed"))
        assert done.state == {"amount": 120, "approved": True, "note": "", "paid": True}


async def test_the_readme_workflow_http_block_runs_as_written(database_url: str) -> None:
    """A newcomer probe: the block set no ``$RUN``, sent ``<a uuid4>`` as the run id and
    named no app serving ``payout``. It is run here as printed, against a gateway serving
    the README's example, with ``signoff token`` answered by the harness's signer."""
    text = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    example = text.split("<!-- workflow-example: begin", 1)[1].split("<!-- workflow-example: end")[
        0
    ]
    namespace: dict[str, Any] = {"__name__": "readme_workflow"}
    exec(
        compile(example.split("```python\n", 1)[1].rsplit("```", 1)[0], "README.md", "exec"),
        namespace,
    )
    block = text.split("<!-- workflow-http: begin", 1)[1].split("<!-- workflow-http: end")[0]
    script = block.split("```bash\n", 1)[1].rsplit("```", 1)[0]
    async with Harness(
        namespace["app"], database_url=database_url, model=CommandModel(), gateway=True
    ) as h:
        tokens = {
            "demo": h.tokens.issue("demo", h.tenant),
            "payments": h.tokens.issue("payments", h.tenant, role="service"),
        }
        # `signoff token --user U [--role R]`, as `signoff dev`'s folder would answer it
        shim = 'signoff() { eval echo "\\$TOKEN_$3"; }\n'
        env = {
            "PATH": os.environ["PATH"],
            "P": h.base_url.rsplit(":", 1)[1],
            **{f"TOKEN_{user}": token for user, token in tokens.items()},
        }
        done = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-e", "-o", "pipefail", "-c", shim + script],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.stdout.splitlines() == [
        "True",  # listed among the runs waiting for a person
        "running",  # resumed
        "200",  # or 202: the event kept until the run waits for it
        "('completed', True)",
        "not_retriable",
        "run_inactive",
    ], done.stdout


async def test_a_start_whose_hint_is_lost_is_adopted(h: Harness) -> None:
    """Killed (or Redis gone) between the run's insert and its inbox entry: the run is
    running with no holder, and a worker adopts it."""
    dead = RedisBus.from_url("redis://127.0.0.1:1/0", Keys("so-dead:"))
    try:
        service = WorkflowService.of(h.store.workflows, dead, Keys("so-dead:"), h.app)
        run = await service.start("three", tenant=h.tenant, owner=OWNER)
    finally:
        await dead.close()
    assert run.holder is None
    parked_run = await until(status_is(h, run.id, "awaiting_human"), what="adopted")
    assert parked_run.holder == h.worker.worker_id and calls(run.id, "extract") == 1


async def test_a_slow_postgres_at_resume_delays_it_and_changes_nothing_else(
    h: Harness,
) -> None:
    run = await parked(h)
    conn = await pgbouncer.connect(h.database_url)
    try:
        async with conn.transaction():  # a long transaction holds the run's row
            await conn.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR UPDATE", run.id)
            resume = asyncio.create_task(
                h.workflows.resume(run.id, {"approved": True}, tenant=h.tenant, by=OWNER)
            )
            await asyncio.sleep(0.8)
            assert not resume.done()
            still = await h.store.workflows.get_workflow_run(run.id)
            assert still.status == "awaiting_human"
        resumed = await resume
        assert resumed.status == "running"
    finally:
        await conn.close()
    await until(status_is(h, run.id, "completed"))
    await asyncio.sleep(0.2)
    assert calls(run.id, "pay") == 1


async def test_graceful_stop_mid_step_hands_the_run_over(database_url: str) -> None:
    """A stopping worker finishes the step in flight, records it, runs no further step and
    lets go of the run: another worker continues from the next step."""
    settings = Settings(lease_seconds=1.0, poll_seconds=0.3, sweep_seconds=0.2)
    app = wf_app.build()
    async with Harness(
        app, database_url=database_url, model=CommandModel(), settings=settings
    ) as h:
        run = await start(h, "crashy")
        await until(lambda: asyncio.sleep(0, calls(run.id, "held")))
        stopping = asyncio.create_task(h.worker.stop())
        await asyncio.sleep(0.1)
        release(run.id)
        await stopping
        after = await h.store.workflows.get_workflow_run(run.id)
        assert after.step == 2 and after.holder is None and calls(run.id, "last") == 0
        async with Harness(
            app,
            database_url=database_url,
            model=CommandModel(),
            settings=settings,
            tenant=h.tenant,
        ) as h2:
            await until(status_is(h2, run.id, "completed"))
            assert calls(run.id, "held") == 1 and calls(run.id, "last") == 1


async def test_a_start_with_a_client_run_id_is_idempotent_under_a_race(h: Harness) -> None:
    run_id = str(uuid.uuid4())
    runs = await asyncio.gather(
        *(h.workflows.start("three", tenant=h.tenant, owner=OWNER, run_id=run_id) for _ in range(8))
    )
    assert {r.id for r in runs} == {run_id}
    await until(status_is(h, run_id, "awaiting_human"))
    await asyncio.sleep(0.3)
    assert calls(run_id, "extract") == 1
    with pytest.raises(Conflict, match="exists and is another start"):  # the same id
        await h.workflows.start("timed", tenant=h.tenant, owner=OWNER, run_id=run_id)
    # Another person's (a hostile probe: another tenant's) run is not described to them.
    for tenant, owner in ((h.tenant, "eve"), ("other-tenant", OWNER)):
        with pytest.raises(Conflict) as taken:
            await h.workflows.start("three", tenant=tenant, owner=owner, run_id=run_id)
        assert "exists" not in taken.value.message and "cannot be used" in taken.value.message
    with pytest.raises(InvalidInput):
        await h.workflows.start("three", tenant=h.tenant, owner=OWNER, run_id="nope")


async def test_hostile_http_payloads_are_422_and_change_nothing(database_url: str) -> None:
    app = wf_app.build()
    async with Harness(app, database_url=database_url, model=CommandModel(), gateway=True) as h:
        auth = {"Authorization": f"Bearer {h.tokens.issue(OWNER, h.tenant)}"}
        async with httpx.AsyncClient(base_url=h.base_url, headers=auth, timeout=30) as http:
            r = await http.post("/v1/workflows/three/runs", json={})
            assert r.status_code == 201, r.text
            run_id = r.json()["run"]["id"]
            await until(status_is(h, run_id, "awaiting_human"))
            url = f"/v1/workflow-runs/{run_id}/resume"
            bad: list[Any] = [
                {"payload": {"approved": True, "note": "a\u0000b"}},  # Postgres refuses NUL
                {"payload": [True]},
                {"payload": {"approved": True}, "extra": 1},  # the envelope is strict
                {},
            ]
            for body in bad:
                r = await http.post(url, json=body)
                assert r.status_code == 422, (body, r.text)
            r = await http.post(url, content=b"[" * 100_000)
            assert r.status_code == 422, r.text
            r = await http.post(f"/v1/workflow-runs/{run_id}/events", json={"name": ""})
            assert r.status_code == 422, r.text
            r = await http.get("/v1/workflow-runs?status=bogus")
            assert r.status_code == 422, r.text
            r = await http.get("/v1/workflow-runs/not-a-uuid")
            assert r.status_code == 404, r.text
            body = (await http.get(f"/v1/workflow-runs/{run_id}")).json()
            assert body["run"]["status"] == "awaiting_human"
            assert [i["status"] for i in body["interrupts"]] == ["open"]
            assert body["gate"]["schema"]["required"] == ["approved"]
