"""Named fault points: inert unless armed through settings (``SIGNOFF_FAULTS``).

A test arms a point by name (comma-separated list) to SIGKILL the process at a
precise step, e.g. ``inbox.before_ack`` (a card was created, the inbox entry
not yet acknowledged) or ``execute.after_provider`` (the provider accepted,
``executed`` not yet recorded).
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("signoff.faults")

POINTS = frozenset({"inbox.before_ack", "execute.after_provider", "decide.before_publish"})


class Faults:
    def __init__(self, armed: tuple[str, ...] = ()) -> None:
        unknown = set(armed) - POINTS
        if unknown:
            from runtime.errors import ConfigError

            raise ConfigError(f"unknown fault points: {', '.join(sorted(unknown))}")
        self.armed = frozenset(armed)

    def hit(self, point: str) -> None:
        """Die here, at once and uncleanly, if this point is armed."""
        if point in self.armed:
            log.error("fault point %s armed: SIGKILL", point)
            os.kill(os.getpid(), signal.SIGKILL)
