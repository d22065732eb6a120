"""Named fault points: inert unless armed through settings (``SIGNOFF_FAULTS``).

A test arms points by name (comma-separated) to SIGKILL the process at a precise
step, or, as ``name=stop``, to freeze it there (SIGSTOP: a process paused by its host,
its lease left to lapse; a test's SIGCONT lets it go on from that very step). The
points, and where they are hit:

* ``inbox.before_ack`` (worker, ``Worker._handle``): the message's step is stored
  (e.g. its card created), the inbox entry not yet acknowledged.
* ``execute.after_start`` (worker, ``Executor.execute``): ``executing`` is recorded,
  the provider not yet called.
* ``execute.after_provider`` (worker, ``Executor.execute``): the provider accepted
  the call, ``executed`` not yet recorded.
* ``decide.before_publish`` (gateway, ``Decisions._notify``): the decision is
  committed with its audit row, not yet published to the worker.
* ``prune.after_batch`` (``signoff prune`` or a worker, ``retention.prune``): one batch
  of threads is deleted and committed, the next not started.
* ``workflow.after_first_decision`` (worker, ``AgentSteps.apply``): the first decision
  of a workflow resume's decision map is applied, the others not yet.

Tests: ``tests/faults/test_crashes.py``, ``tests/e2e/test_pools.py``.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("signoff.faults")

POINTS = frozenset(
    {
        "inbox.before_ack",
        "execute.after_start",
        "execute.after_provider",
        "decide.before_publish",
        "prune.after_batch",
        "workflow.after_first_decision",
    }
)


class Faults:
    def __init__(self, armed: tuple[str, ...] = ()) -> None:
        stops = {a.removesuffix("=stop") for a in armed if a.endswith("=stop")}
        kills = {a for a in armed if not a.endswith("=stop")}
        unknown = (kills | stops) - POINTS
        if unknown:
            from signoff.runtime.errors import ConfigError

            raise ConfigError(f"unknown fault points: {', '.join(sorted(unknown))}")
        self.armed = frozenset(kills)
        self.stops = set(stops)  # each freezes the process once

    def hit(self, point: str) -> None:
        """Die here, at once and uncleanly, if this point is armed (or freeze here, once,
        if it is armed ``=stop``)."""
        if point in self.armed:
            log.error("fault point %s armed: SIGKILL", point)
            os.kill(os.getpid(), signal.SIGKILL)
        if point in self.stops:
            self.stops.discard(point)
            log.error("fault point %s armed: SIGSTOP", point)
            os.kill(os.getpid(), signal.SIGSTOP)
