"""The event loop the ``signoff`` processes run on (``SIGNOFF_EVENT_LOOP``).

``auto`` (the default) runs on uvloop when it is installed (it is a dependency on
Linux and macOS) and on asyncio's own loop otherwise; ``uvloop`` insists on it;
``asyncio`` keeps the standard loop. uvloop is libuv under asyncio's interface:
nothing in signoff depends on which loop runs it. What it bought is measured in
``bench/README.md`` (levers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from signoff.runtime.errors import ConfigError

T = TypeVar("T")

CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for ``asyncio.Runner`` (None: asyncio's default loop)."""
    if choice not in CHOICES:
        raise ConfigError(f"SIGNOFF_EVENT_LOOP must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("SIGNOFF_EVENT_LOOP=uvloop but uvloop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """``asyncio.run`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
