"""The Redis bus: the :class:`~signoff.runtime.bus.Bus` for several gateway and worker processes.

A facade over one module per part (DESIGN.md §5): the retrying client and its
pipelined connection (:mod:`.client`, :mod:`.pipe`), the pub/sub multiplexer
(:mod:`.pubsub`), the inbox stream (:mod:`.inbox`), wait tokens and heartbeats
(:mod:`.tokens`) and the per-user quota windows (:mod:`.window`). They share one
redis-py client and one retry policy; this class only wires them and closes them.

Runs on a single Redis (or Valkey) server, which is what the tests exercise. Most
commands name one key, but the pipelined connection talks to one node and follows
no ``MOVED`` redirects, and pub/sub is not sharded: a Redis Cluster is not supported
until a test shows it works.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager

import redis.asyncio as aioredis

from signoff.runtime.bus.client import MAX_CONNECTIONS, POOL_TIMEOUT, Client, redis_from_url
from signoff.runtime.bus.inbox import Inbox
from signoff.runtime.bus.protocol import Delivery, Job, Subscription
from signoff.runtime.bus.pubsub import PubSub
from signoff.runtime.bus.tokens import WaitTokens
from signoff.runtime.bus.window import Window
from signoff.runtime.keys import Keys


class RedisBus:
    """The bus on Redis. The redis-py client must have ``decode_responses=False``."""

    def __init__(self, client: aioredis.Redis, keys: Keys, *, claim_idle_ms: int = 30_000) -> None:
        self.keys = keys
        self.client = Client(client)
        self.pubsub = PubSub(self.client)
        self.tokens = WaitTokens(self.client, keys)
        self.inbox = Inbox(self.client, keys, self.tokens.alive, claim_idle_ms=claim_idle_ms)
        self.window = Window(self.client)
        self._closed = False

    @classmethod
    def from_url(
        cls,
        url: str,
        keys: Keys,
        *,
        claim_idle_ms: int = 30_000,
        max_connections: int = MAX_CONNECTIONS,
        pool_timeout: float = POOL_TIMEOUT,
    ) -> RedisBus:
        """A bus on ``redis://``/``rediss://``/``unix://`` (RESP2, no redis-py retries), its
        pool bounded to ``max_connections`` (:func:`~.client.redis_from_url`)."""
        client = redis_from_url(url, max_connections=max_connections, pool_timeout=pool_timeout)
        return cls(client, keys, claim_idle_ms=claim_idle_ms)

    # -- pub/sub -------------------------------------------------------------------------

    async def publish(self, channel: str, message: bytes) -> int:
        """PUBLISH; the number of Redis subscribers (connections, not local listeners)."""
        return await self.client.publish(channel, message)

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe; entered once Redis confirmed. The iterator raises
        :class:`~signoff.runtime.bus.pubsub.BusDisconnected` on a drop."""
        return self.pubsub.subscribe(channel)

    # -- wait tokens and heartbeats ------------------------------------------------------

    async def set_wait(self, card_id: str, holder: str, ttl_ms: int) -> None:
        await self.tokens.set_wait(card_id, holder, ttl_ms)

    async def clear_wait(self, card_id: str) -> None:
        await self.tokens.clear_wait(card_id)

    async def clear_waits(self, card_ids: Iterable[str]) -> None:
        await self.tokens.clear_waits(card_ids)

    async def wait_holder(self, card_id: str) -> str | None:
        return await self.tokens.wait_holder(card_id)

    async def heartbeat(self, worker_id: str, ttl_ms: int) -> None:
        await self.tokens.heartbeat(worker_id, ttl_ms)

    async def alive(self, worker_id: str) -> bool:
        return await self.tokens.alive(worker_id)

    # -- the inbox -----------------------------------------------------------------------

    async def enqueue(self, job: Job) -> str:
        return await self.inbox.enqueue(job)

    async def take(self, consumer: str, timeout: float) -> list[Delivery]:
        return await self.inbox.take(consumer, timeout)

    async def ack(self, delivery_id: str) -> None:
        await self.inbox.ack(delivery_id)

    def release(self, delivery: Delivery) -> None:
        self.inbox.release(delivery)

    async def inbox_stats(self) -> tuple[int, int]:
        """(lag, pending) of the inbox, for the metrics port."""
        return await self.inbox.stats()

    async def ping(self) -> None:
        """One PING (``/readyz``); raises :class:`Unavailable` when Redis does not answer."""
        await self.client.call("PING", lambda: self.client.redis.ping())

    # -- per-user quota windows (gateway/quotas.py's Ledger) -----------------------------

    async def window_add(self, key: str, member: str, now_ms: int, window_ms: int) -> list[str]:
        return await self.window.window_add(key, member, now_ms, window_ms)

    async def window_remove(self, key: str, members: list[str]) -> None:
        await self.window.window_remove(key, members)

    # -- lifecycle -----------------------------------------------------------------------

    async def close(self) -> None:
        """Fail live subscriptions, stop the reader, close both connections and the pool."""
        if self._closed:
            return
        self._closed = True
        self.client.closed = True  # calls (and retries) in flight give up now
        await self.pubsub.close()
        await self.client.close()
