"""A stopping worker's drain: what is in flight is waited for, then cancelled.

Its steps get ``DRAIN_SECONDS`` (a model's reply cut there costs nothing: the run is
released and continued by another worker). It starts no card (``Executor.closing``: left
approved for the worker that takes the run over), and a card between ``executing`` and its
recorded outcome gets longer, up to its tool's deadline and a margin from the stop:
cut, its provider call's outcome would be unknown, an operator's to reconcile (a hostile
probe's SIGTERM cut a 12 s call at the drain's 10 s). The deploy files' grace periods
leave room for both (``deploy/``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from signoff.runtime.config import Settings
from signoff.runtime.execution import Executor

DRAIN_SECONDS = 10.0  # every step in flight
RECORD_MARGIN_SECONDS = 5.0  # past a tool's deadline: its outcome recorded


async def drain(
    tasks: set[asyncio.Task[Any]], executor: Executor, settings: Settings, began: float
) -> None:
    """Wait for ``tasks`` (the stop ``began``, ``time.monotonic()``): all of them up to
    :data:`DRAIN_SECONDS`, then, while the executor has cards between ``executing`` and
    their recorded outcome (it starts none once stopping: ``Executor.closing``), up to
    the tool deadline and :data:`RECORD_MARGIN_SECONDS`."""
    if tasks:
        await asyncio.wait(list(tasks), timeout=max(began + DRAIN_SECONDS - time.monotonic(), 0))
    deadline = settings.tool_timeout_seconds + RECORD_MARGIN_SECONDS
    until = began + max(DRAIN_SECONDS, deadline)
    while tasks and executor.executing() and time.monotonic() < until:
        await asyncio.wait(list(tasks), timeout=min(0.1, until - time.monotonic()))
