"""A stopping worker's drain: what is in flight is waited for, then cancelled.

Its steps get ``DRAIN_SECONDS`` (a model's reply cut there costs nothing: the run is
released and continued by another worker). It starts no card (``Executor.closing``: left
approved for the worker that takes the run over), and a card between ``executing`` and its
recorded outcome gets longer, up to its tool's deadline and a margin from the stop:
cut, its provider call's outcome would be unknown, an operator's to reconcile (a hostile
probe's SIGTERM cut a 12 s call at the drain's 10 s). The deploy files' grace periods
leave room for both (``deploy/``).

Its runs parked with nothing in flight are handed back when the stop begins
(:func:`hand_over_idle`): it no longer hears their decisions, and another worker takes
them at its next lease tick instead of once the drain is over. The runs still in flight
stay held, their lease renewed while they drain: before, the lease lapsed during a long
drain and another worker took them over under the steps still running (design note 62)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from signoff.runtime.config import Settings
from signoff.runtime.errors import SignoffError
from signoff.runtime.execution import Executor

if TYPE_CHECKING:
    from signoff.runtime.worker import Worker

log = logging.getLogger("signoff.worker")

DRAIN_SECONDS = 10.0  # every step in flight
RECORD_MARGIN_SECONDS = 5.0  # past a tool's deadline: its outcome recorded
STOP_GRACE_SECONDS = 5.0  # a stopping worker lets each periodic loop end its tick
LEASE_LOOPS = ("lease", "heartbeat")  # the loops that go on while a worker drains
HAND_OVER_EVERY = 0.5  # seconds between two hand-overs of the runs a drain let go of


async def stop(w: Worker, *, drain: bool, release: bool) -> None:
    """Stop worker ``w`` (``Worker.stop``): take no more work, drain what is in flight
    (``drain``), then hand its runs over (``release``; else left as a crash would)."""
    w.draining, began = True, time.monotonic()  # adopts nothing from now on
    w.agent.accepting, w.agent.executor.closing = False, True  # nor starts a card
    w.workflows.stop()  # takes no more wakes; its runs are released below
    for task in w.loops:  # these wait on Redis (listen, inbox): cancelled at once
        task.cancel()
    for task in w.loops:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    w.loops.clear()
    # Each loop's tick ends whole (ticks.py). The lease's and the heartbeat's go on while
    # the drain lasts (the lease tick adopts nothing once draining): the runs in flight
    # stay this worker's, and its inbox entries are not claimed under it.
    kept = LEASE_LOOPS if drain and release else ()
    await w.ticks.stop(STOP_GRACE_SECONDS, keep=kept)
    try:
        if drain:
            handing = None
            if release:  # what no step here continues goes to another worker now
                await hand_over_idle(w)
                handing = asyncio.create_task(_hand_over_while(w), name="signoff-hand-over")
            try:
                await _drain(w.tasks, w.agent.executor, w.settings, began)
            finally:
                if handing is not None:
                    handing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await handing
    finally:  # a stop cancelled midway lets the lease lapse (its runs are adopted)
        await w.ticks.stop(STOP_GRACE_SECONDS)
    for task in list(w.tasks):
        task.cancel()
    parked = w.waits.parked_cards()
    w.waits.drop_all()
    if not release:
        return
    with contextlib.suppress(Exception):
        await w.bus.clear_waits(parked)
    with contextlib.suppress(Exception):
        await w.store.workflows.release_workflow_runs(w.worker_id)
    with contextlib.suppress(Exception):
        await w.store.release_runs(w.worker_id)


async def _drain(
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


async def hand_over_idle(w: Worker) -> list[str]:
    """Release the runs worker ``w`` holds, waiting, that no step here is continuing:
    the ids released, forgotten here (their wait tokens cleared first, so an adopter
    that parks one again keeps its own). A failure leaves them held, for the next call
    or the release once the drain is over."""
    busy = w.agent.locked() | w.agent.approved.busy_runs()
    idle = [run_id for run_id in w.waits.parked_runs() if run_id not in busy]
    with contextlib.suppress(Exception):  # a token left expires by its TTL
        await w.bus.clear_waits([c for run_id in idle for c in w.waits.cards_of(run_id)])
    try:
        released = await w.store.release_idle(w.worker_id, sorted(_ids(busy)))
    except SignoffError as exc:
        log.warning("could not hand idle runs back during the drain (%s): after it", exc)
        return []
    except Exception:  # whatever it is, the stop goes on: its runs are released after it
        log.exception("could not hand idle runs back during the drain: after it")
        return []
    for run_id in released:
        w.waits.drop_run(run_id)
    if released:
        log.info("handed %d run(s) back while draining (nothing of them runs here)", len(released))
    return released


def _ids(keys: set[str]) -> list[str]:
    """The lock keys that are ids (a run's or a thread's), for the statement's uuid[]."""
    out = []
    for key in keys:
        with contextlib.suppress(ValueError):
            out.append(str(uuid.UUID(key)))
    return out


async def _hand_over_while(w: Worker) -> None:
    """While the drain lasts: hand over each run whose step here has ended (one refused
    to start a card since the worker is stopping, say), not at the drain's end."""
    while True:
        await asyncio.sleep(HAND_OVER_EVERY)
        await hand_over_idle(w)
