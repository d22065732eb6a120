"""The signoff side of ``bench/workflows.py``: one workflow, written with the public API.

``wake``: parks at ``await_event("wake")`` (payload ``{"sent_ns": ...}``), then the
``record`` step writes ``(run_id, sent_ns, step_ns)`` into ``wf_wakes`` through the app's
own asyncpg pool. A step that ran again (at least once) bumps ``executions``.
"""

from __future__ import annotations

import time
from typing import Any

import asyncpg
import msgspec

from signoff import App, Registry, Workflow, WorkflowContext, await_event

TABLE = (
    "CREATE TABLE IF NOT EXISTS wf_wakes (run_id uuid PRIMARY KEY, sent_ns bigint NOT NULL, "
    "step_ns bigint NOT NULL, done_ns bigint NOT NULL, executions int NOT NULL DEFAULT 1)"
)


class Wake(msgspec.Struct):
    sent_ns: int


class Services:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool


_services: list[Services] = []


async def setup(database_url: str) -> Services:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    async with pool.acquire() as conn, conn.transaction():
        # The gateway and the worker start at once: CREATE TABLE IF NOT EXISTS races
        # (pg_type's unique index), so one creates it at a time.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('bench.wf_wakes'))")
        await conn.execute(TABLE)
    services = Services(pool)
    _services.append(services)
    return services


async def teardown() -> None:
    while _services:
        await _services.pop().pool.close()


async def record(ctx: WorkflowContext) -> dict[str, Any]:
    step_ns = time.time_ns()
    services: Services = ctx.services
    await services.pool.execute(
        "INSERT INTO wf_wakes (run_id, sent_ns, step_ns, done_ns) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (run_id) DO UPDATE SET executions = wf_wakes.executions + 1",
        ctx.run_id,
        int(ctx.state["sent_ns"]),
        step_ns,
        time.time_ns(),
    )
    return {"recorded": True}


wake = Workflow("wake", steps=[await_event("wake", schema=Wake), record])

app = App(
    name="bench-workflows", tools=Registry([]), workflows=[wake], setup=setup, teardown=teardown
)
