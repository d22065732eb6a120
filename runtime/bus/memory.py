"""In-process bus: the same protocol as Redis, for one process (``signoff dev``, unit tests)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from signoff.runtime.bus.protocol import Delivery, Job, Subscription


class _Sub:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            yield await self.queue.get()


class MemoryBus:
    """``claim_idle_ms``: when set, unacked jobs of a consumer with no heartbeat go to the
    next ``take`` once idle that long (as on Redis); None keeps no record of taken jobs."""

    def __init__(self, *, claim_idle_ms: int | None = None) -> None:
        self._subs: dict[str, set[_Sub]] = {}
        self._waits: dict[str, tuple[str, float]] = {}
        self._beats: dict[str, float] = {}
        self._inbox: asyncio.Queue[Delivery] = asyncio.Queue()
        self._ids = itertools.count(1)
        self._claim_idle = None if claim_idle_ms is None else claim_idle_ms / 1000
        # delivery id -> (consumer, taken at, delivery), only when claim_idle_ms is set
        self._pending: dict[str, tuple[str, float, Delivery]] = {}

    async def publish(self, channel: str, message: bytes) -> int:
        subs = self._subs.get(channel, set())
        for sub in subs:
            sub.queue.put_nowait(message)
        return len(subs)

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        sub = _Sub()
        self._subs.setdefault(channel, set()).add(sub)
        try:
            yield sub
        finally:
            subs = self._subs.get(channel)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[channel]

    async def set_wait(self, card_id: str, holder: str, ttl_ms: int) -> None:
        self._waits[card_id] = (holder, time.monotonic() + ttl_ms / 1000)

    async def clear_wait(self, card_id: str) -> None:
        self._waits.pop(card_id, None)

    async def clear_waits(self, card_ids: Iterable[str]) -> None:
        for card_id in card_ids:
            self._waits.pop(card_id, None)

    async def wait_holder(self, card_id: str) -> str | None:
        item = self._waits.get(card_id)
        if item is None or item[1] < time.monotonic():
            return None
        return item[0]

    async def heartbeat(self, worker_id: str, ttl_ms: int) -> None:
        self._beats[worker_id] = time.monotonic() + ttl_ms / 1000

    async def claim_owner(self, owner: str, ttl_ms: int) -> str:
        return owner  # one process: nobody else on this bus

    async def alive(self, worker_id: str) -> bool:
        return self._beats.get(worker_id, 0.0) > time.monotonic()

    def gate_inbox(self, confirmed: asyncio.Event) -> None:
        """Nothing to wait for: one process, whose claim is always answered at once."""

    async def enqueue(self, job: Job) -> str:
        delivery = Delivery(str(next(self._ids)), job)
        self._inbox.put_nowait(delivery)
        return delivery.id

    async def take(self, consumer: str, timeout: float, count: int = 16) -> list[Delivery]:
        if self._claim_idle is not None:
            claimed = self._claim(consumer, max(count, 1))
            if claimed:
                return claimed
        try:
            delivery = await asyncio.wait_for(self._inbox.get(), timeout)
        except TimeoutError:
            return []
        if self._claim_idle is not None:
            self._pending[delivery.id] = (consumer, time.monotonic(), delivery)
        return [delivery]

    def _claim(self, consumer: str, count: int) -> list[Delivery]:
        assert self._claim_idle is not None
        now = time.monotonic()
        claimed = []
        for delivery_id, (taker, taken_at, delivery) in list(self._pending.items()):
            dead = taker != consumer and self._beats.get(taker, 0.0) <= now
            if dead and now - taken_at >= self._claim_idle:
                self._pending[delivery_id] = (consumer, now, delivery)
                claimed.append(delivery)
                if len(claimed) >= count:
                    break
        return claimed

    async def ack(self, delivery_id: str) -> None:
        self._pending.pop(delivery_id, None)

    def release(self, delivery: Delivery) -> None:
        # In one process there is nobody to wait for: it goes back in the queue now.
        self._pending.pop(delivery.id, None)
        self._inbox.put_nowait(delivery)

    async def close(self) -> None:
        self._subs.clear()
