"""What an application hands signoff: its tools, its policy, its own services."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from signoff.runtime.policy import Policy
from signoff.runtime.tools import Registry


@dataclass
class App:
    """An agent application: tools + policy (+ opaque services the tools use)."""

    name: str
    tools: Registry
    policy: Policy = field(default_factory=Policy)
    services: Any = None
    system: str | None = None
    # Called with the store's Postgres URL at start-up (e.g. to create the app's own tables).
    setup: Callable[[str], Awaitable[Any]] | None = None
    teardown: Callable[[], Awaitable[None]] | None = None
