"""Fault points are armed by name (SIGKILL) or as name=stop (SIGSTOP, once)."""

from __future__ import annotations

import pytest

from signoff.runtime.errors import ConfigError
from signoff.runtime.faults import Faults


def test_kill_and_stop_points_and_typos_refused() -> None:
    f = Faults(("inbox.before_ack", "execute.after_provider=stop"))
    assert f.armed == {"inbox.before_ack"} and f.stops == {"execute.after_provider"}
    f.hit("decide.before_publish")  # not armed: nothing happens
    for bad in (("execute.after_providr=stop",), ("nowhere",), ("inbox.before_ack=pause",)):
        with pytest.raises(ConfigError):
            Faults(bad)
