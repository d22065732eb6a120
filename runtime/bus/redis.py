"""The Redis bus: the :class:`~signoff.runtime.bus.Bus` for several gateway and worker processes.

A facade over one module per part (DESIGN.md §5): the retrying client and its
pipelined connection (:mod:`.client`, :mod:`.pipe`), the pub/sub multiplexer
(:mod:`.pubsub`), the inbox stream (:mod:`.inbox`), wait tokens and heartbeats
(:mod:`.tokens`) and the per-user quota windows (:mod:`.window`). They share one
redis-py client and one retry policy; this class only wires them and closes them.

On a Redis Cluster (a ``redis+cluster://`` URL, :mod:`.cluster`) the hot commands are
routed per slot over one pipelined connection per node, worker and thread channels
use sharded pub/sub (``SSUBSCRIBE``/``SPUBLISH``) and the inbox is split into
partitions spread over the masters (:mod:`.partitions`; design note 31).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from signoff.runtime.bus.client import MAX_CONNECTIONS, POOL_TIMEOUT, Client, redis_from_url
from signoff.runtime.bus.cluster import ClusterClient, cluster_from_url, is_cluster_url
from signoff.runtime.bus.inbox import TAKE_COUNT, Inbox
from signoff.runtime.bus.partitions import PartitionedInbox
from signoff.runtime.bus.protocol import Delivery, Job, Subscription
from signoff.runtime.bus.pubsub import PubSub
from signoff.runtime.bus.tokens import WaitTokens
from signoff.runtime.bus.window import Window
from signoff.runtime.errors import ConfigError, Unavailable
from signoff.runtime.keys import Keys

# Inbox streams on a cluster unless configured (SIGNOFF_INBOX_PARTITIONS).
CLUSTER_PARTITIONS = 8
# How long an enqueue waits for the key prefix to be confirmed this app's (a process
# started while Redis was away confirms it within a second of Redis answering).
GATE_WAIT_SECONDS = 2.0


class RedisBus:
    """The bus on Redis. The redis-py client must have ``decode_responses=False``."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        keys: Keys,
        *,
        claim_idle_ms: int = 30_000,
        partitions: int = 0,
    ) -> None:
        """``partitions``: inbox streams (0: one on a server, ``CLUSTER_PARTITIONS`` on a
        cluster)."""
        self.keys = keys
        self._gate: asyncio.Event | None = None  # gate_inbox
        if partitions < 0:
            raise ConfigError("inbox partitions must be 0 (the default) or more")
        if isinstance(client, RedisCluster):
            if "{" in keys.prefix or "}" in keys.prefix:
                raise ConfigError("on a Redis Cluster the key prefix must not contain { or }")
            self.client: Client = ClusterClient(client)
            partitions = partitions or CLUSTER_PARTITIONS
        else:
            self.client = Client(client)
            partitions = partitions or 1
        self.pubsub = PubSub(self.client)
        self.tokens = WaitTokens(self.client, keys)
        self.inbox: Inbox | PartitionedInbox
        if partitions > 1:
            self.inbox = PartitionedInbox(
                self.client,
                keys,
                self.tokens.alive,
                partitions=partitions,
                claim_idle_ms=claim_idle_ms,
            )
        else:
            self.inbox = Inbox(self.client, keys, self.tokens.alive, claim_idle_ms=claim_idle_ms)
        self.window = Window(self.client)
        self._closed = False

    @property
    def cluster(self) -> bool:
        return isinstance(self.client, ClusterClient)

    @classmethod
    def from_url(
        cls,
        url: str,
        keys: Keys,
        *,
        claim_idle_ms: int = 30_000,
        partitions: int = 0,
        max_connections: int = MAX_CONNECTIONS,
        pool_timeout: float = POOL_TIMEOUT,
    ) -> RedisBus:
        """A bus on ``redis://``/``rediss://``/``unix://`` (RESP2, no redis-py retries), its
        pool bounded to ``max_connections`` (:func:`~.client.redis_from_url`), or on a Redis
        Cluster: ``redis+cluster://host:port[,host:port...]`` (``rediss+cluster`` for TLS;
        ``max_connections`` per node, a call beyond it retried, then ``Unavailable``);
        ``partitions`` inbox streams (0: the default)."""
        client = (
            cluster_from_url(url, max_connections=max_connections)
            if is_cluster_url(url)
            else redis_from_url(url, max_connections=max_connections, pool_timeout=pool_timeout)
        )
        return cls(client, keys, claim_idle_ms=claim_idle_ms, partitions=partitions)

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

    async def claim_owner(self, owner: str, ttl_ms: int) -> str:
        return await self.tokens.claim_owner(owner, ttl_ms)

    # -- the inbox -----------------------------------------------------------------------

    def gate_inbox(self, confirmed: asyncio.Event) -> None:
        self._gate = confirmed

    async def _gate_open(self, seconds: float) -> bool:
        """Whether the inbox may be used: the prefix confirmed this app's, or no gate."""
        gate = self._gate
        if gate is None or gate.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await gate.wait()
        return gate.is_set()

    async def enqueue(self, job: Job) -> str:
        if not await self._gate_open(GATE_WAIT_SECONDS):
            raise Unavailable(  # a plain refusal: nothing was sent
                "the Redis key prefix is not confirmed this app's yet (Redis just came "
                "back?); nothing was queued",
                command="XADD",
            )
        return await self.inbox.enqueue(job)

    async def take(self, consumer: str, timeout: float, count: int = TAKE_COUNT) -> list[Delivery]:
        if not await self._gate_open(timeout):
            return []  # another app's messages are not ours to take (prefix_owner.py)
        return await self.inbox.take(consumer, timeout, count)

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
        if isinstance(self.inbox, PartitionedInbox):
            await self.inbox.close()
        await self.client.close()
