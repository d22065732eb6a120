"""The event loop the ``signoff`` processes run on (``SIGNOFF_EVENT_LOOP``).

``auto`` (the default) runs on uvloop when it is installed (it is a dependency on
Linux and macOS) and on asyncio's own loop otherwise — and on asyncio's loop with a
Redis Cluster bus: under uvloop a cluster node connection redis-py had closed raised
``RuntimeError`` (uvloop's closed-transport error) instead of a connection error,
which redis-py's cluster client does not retry (seen as 500s in
``tests/e2e/test_redis_cluster.py``); ``uvloop`` insists on it;
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


def loop_factory(
    choice: str, redis_url: str | None = None
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for ``asyncio.Runner`` (None: asyncio's default loop)."""
    if choice not in CHOICES:
        raise ConfigError(f"SIGNOFF_EVENT_LOOP must be one of {', '.join(CHOICES)}, not {choice!r}")
    cluster = (redis_url or "").lower().split("://", 1)[0].endswith("+cluster")
    if choice == "asyncio" or (choice == "auto" and cluster):
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("SIGNOFF_EVENT_LOOP=uvloop but uvloop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], choice: str = "auto", redis_url: str | None = None) -> T:
    """``asyncio.run`` on the chosen loop (``redis_url``: the bus, see ``auto``)."""
    with asyncio.Runner(loop_factory=loop_factory(choice, redis_url)) as runner:
        return runner.run(main)
