"""A worker's intake: the inbox entries (users' messages) it takes, at most
``SIGNOFF_TURNS_IN_FLIGHT`` at a time (design note 58).

A worker reads from the inbox only what it has room for: while its first turns fill
the bound, it reads nothing, and new entries stay in the stream for any other worker,
one that starts later included. Without it a worker claimed every entry it was given
(16 per read, read again at once), so a backlog was split among the workers running
when it arrived, a worker added to work it off got none, and thousands of turns
waited on the model and the store's pool at once, in one process.

A turn holds its place until its entry is acked or handed back, however it ends
(the model's replies included: what bounds it is the work one process takes on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from signoff.runtime import logs
from signoff.runtime.bus import Bus, Delivery
from signoff.runtime.errors import SignoffError

log = logging.getLogger("signoff.worker")

READ_WAIT = 1.0  # seconds one inbox read waits for an entry


class Intake:
    def __init__(
        self,
        bus: Bus,
        consumer: str,
        size: int,
        handle: Callable[[Delivery], Coroutine[Any, Any, None]],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self._bus = bus
        self._consumer = consumer
        self.size = max(size, 1)
        self._handle = handle
        self._spawn = spawn
        self.in_flight = 0  # entries taken, not yet acked or handed back
        self._room = asyncio.Event()
        self._room.set()
        self._down = logs.Throttle()  # "inbox unavailable" once per 10 s

    async def run(self, draining: Callable[[], bool]) -> None:
        """Take entries while there is room, until ``draining()``."""
        while not draining():
            await self._room.wait()
            room = self.size - self.in_flight
            try:
                deliveries = await self._bus.take(self._consumer, READ_WAIT, room)
            except SignoffError as exc:
                if (held := self._down.allow()) is not None:
                    log.warning("inbox unavailable: %s%s", exc, logs.left_out(held))
                await asyncio.sleep(0.5)
                continue
            for delivery in deliveries:
                self._enter()
                self._spawn(self._one(delivery))

    async def _one(self, delivery: Delivery) -> None:
        try:
            await self._handle(delivery)
        finally:
            self._leave()

    def _enter(self) -> None:
        self.in_flight += 1
        if self.in_flight >= self.size:
            self._room.clear()

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight < self.size:
            self._room.set()
