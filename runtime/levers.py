"""Speed levers that can be switched off for an A/B run (``SIGNOFF_DISABLE``).

Every lever here is on by default and changes no guarantee (I1-I9); each was measured
on and off in one run by ``bench/ab.py`` (``bench/README.md``, levers table; the levers
that did not pay were removed, and are listed there).
``SIGNOFF_DISABLE`` names the ones to switch off, comma-separated; it exists for those
measurements, not as a tuning knob. Unknown names are refused at start-up
(:class:`~signoff.runtime.errors.ConfigError`), so a typo cannot silently measure the
wrong thing.

- ``group-commit``: decisions arriving while a process's deciding statements are all
  busy are written together by one statement (``store/group.py``).
- ``quiet-start``: a user message on a thread with nothing to supersede starts its run in
  one statement (``run_start_quiet``) instead of ``start_run``'s transaction of nine
  round trips, and its hint carries the message (``Runs.start_run``).

"""

from __future__ import annotations

import os
from collections.abc import Mapping

from signoff.runtime.errors import ConfigError

LEVERS = ("group-commit", "quiet-start")


def disabled(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The levers ``SIGNOFF_DISABLE`` switches off."""
    raw = (os.environ if env is None else env).get("SIGNOFF_DISABLE", "")
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = sorted(names - set(LEVERS))
    if unknown:
        raise ConfigError(
            f"SIGNOFF_DISABLE names unknown levers {', '.join(unknown)}; known: {', '.join(LEVERS)}"
        )
    return names


_disabled: frozenset[str] | None = None


def on(name: str) -> bool:
    """Whether lever ``name`` is on in this process (``SIGNOFF_DISABLE`` is read once, at
    first use; ``Settings`` checks it at start-up)."""
    global _disabled
    assert name in LEVERS, name
    if _disabled is None:
        _disabled = disabled()
    return name not in _disabled


def reset() -> None:
    """Read ``SIGNOFF_DISABLE`` again at the next :func:`on` (tests)."""
    global _disabled
    _disabled = None
