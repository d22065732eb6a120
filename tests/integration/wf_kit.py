"""Helpers shared by the workflow tests: wait for a condition, start a run, wait until it
parks (tests/integration/test_workflows*.py, test_agent_steps.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from signoff import WorkflowRun
from signoff.testing import Harness

T = TypeVar("T")
OWNER = "ana"


async def until(fn: Callable[[], Awaitable[T]], timeout: float = 15.0, what: str = "") -> T:
    """``fn()``'s first truthy value, polled every 50 ms for at most ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await fn()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not met within {timeout}s: {what}")
        await asyncio.sleep(0.05)


async def start(h: Harness, name: str, owner: str = OWNER) -> WorkflowRun:
    return await h.workflows.start(name, tenant=h.tenant, owner=owner)


def status_is(h: Harness, run_id: str, *statuses: str) -> Callable[[], Awaitable[Any]]:
    async def check() -> WorkflowRun | None:
        run = await h.store.workflows.get_workflow_run(run_id)
        return run if str(run.status) in statuses else None

    return check


async def parked(h: Harness, name: str = "three") -> WorkflowRun:
    run = await start(h, name)
    return await until(status_is(h, run.id, "awaiting_human", "awaiting_event"), what="park")
