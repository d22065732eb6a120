"""An app with one three-step workflow for the multi-process workflow tests: each step
records its run in ``wf_side_effects`` (what the tests count)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import msgspec

from signoff import App, Registry, Workflow, WorkflowContext, await_human


class Approval(msgspec.Struct):
    approved: bool
    note: str = ""


class Services:
    pool: asyncpg.Pool | None = None


services = Services()


async def setup(database_url: str) -> Services:
    services.pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    await services.pool.execute(
        "CREATE TABLE IF NOT EXISTS wf_side_effects ("
        " run_id text NOT NULL, step text NOT NULL, at timestamptz NOT NULL DEFAULT now())"
    )
    return services


async def teardown() -> None:
    if services.pool is not None:
        await services.pool.close()


async def record(ctx: WorkflowContext) -> None:
    assert services.pool is not None
    await services.pool.execute(
        "INSERT INTO wf_side_effects (run_id, step) VALUES ($1, $2)", ctx.run_id, ctx.step
    )


async def extract(ctx: WorkflowContext) -> dict[str, Any]:
    await record(ctx)
    return {"amount": 120}


async def hold(ctx: WorkflowContext) -> None:
    """Records, then waits until the test inserts the run's row in ``wf_go``."""
    await record(ctx)
    assert services.pool is not None
    await services.pool.execute("CREATE TABLE IF NOT EXISTS wf_go (run_id text PRIMARY KEY)")
    while not await services.pool.fetchval("SELECT 1 FROM wf_go WHERE run_id = $1", ctx.run_id):
        await asyncio.sleep(0.05)


async def pay(ctx: WorkflowContext) -> dict[str, Any]:
    await record(ctx)
    return {"paid": bool(ctx.state.get("approved"))}


app = App(
    name="wf-cluster",
    tools=Registry([]),
    setup=setup,
    teardown=teardown,
    workflows=[
        Workflow(
            "payout", steps=[extract, await_human("approve the payout", schema=Approval), pay]
        ),
        Workflow("slow", steps=[extract, hold, pay]),
    ],
)
