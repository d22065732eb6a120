"""The inbox: user messages to run, on one Redis stream with one consumer group.

Entries delivered to a consumer that has no heartbeat any more (or to this very
consumer name in an earlier life of the process) are claimed by the next ``take``
once idle for ``claim_idle_ms``; ``XCLAIM``'s min-idle-time makes two claimers race
safely. A consumer that is alive but slow keeps its entries. Delivery is at least
once: a redelivered job gets its existing card back (I5). A done entry is acked and
deleted in one ``MULTI`` (design note 9).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from redis import exceptions as rx

from signoff.runtime.bus.client import Client, text
from signoff.runtime.bus.protocol import Delivery, Job
from signoff.runtime.keys import Keys

log = logging.getLogger("signoff.bus")

T = TypeVar("T")

TAKE_COUNT = 16
CLAIM_BATCH = 100  # XPENDING page size
CLAIM_PAGES = 10  # pages looked at per claim round
JOB_FIELD = b"job"

_job_decoder = msgspec.json.Decoder(Job)
_encoder = msgspec.json.Encoder()


class Inbox:
    """The inbox stream; ``alive(consumer)`` tells whether a consumer still has a heartbeat."""

    def __init__(
        self,
        client: Client,
        keys: Keys,
        alive: Callable[[str], Awaitable[bool]],
        *,
        claim_idle_ms: int = 30_000,
        stream: str | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._stream = keys.inbox if stream is None else stream
        self._alive = alive
        self._claim_idle_ms = claim_idle_ms
        self._claim_every = min(5.0, claim_idle_ms / 1000)
        self._next_claim = 0.0
        self._inflight: set[str] = set()  # delivered by this process, not acked yet
        self._group_ready = False
        timeout = client.socket_timeout
        # A BLOCK longer than the socket timeout would read as a dead connection.
        self._max_block_ms = max(int(timeout * 1000) - 500, 1) if timeout else None

    async def enqueue(self, job: Job) -> str:
        """XADD the job; returns the entry id."""
        return text(await self._client.xadd(self._stream, JOB_FIELD, _encoder.encode(job)))

    async def take(self, consumer: str, timeout: float, count: int = TAKE_COUNT) -> list[Delivery]:
        """Up to ``count`` (at most 16) jobs for ``consumer``: claimed ones of dead consumers
        first, else new ones."""
        await self._ensure_group()
        claimed = await self._claim(consumer, count)
        if claimed:
            return claimed
        return await self.read(consumer, timeout, count)

    async def claim(self, consumer: str, count: int = TAKE_COUNT) -> list[Delivery]:
        """One claim round (at most every few seconds) of dead consumers' entries."""
        await self._ensure_group()
        return await self._claim(consumer, count)

    async def read(self, consumer: str, timeout: float, count: int = TAKE_COUNT) -> list[Delivery]:
        """Up to ``count`` (at most 16) new jobs, waiting up to ``timeout`` (capped below the
        socket timeout)."""
        count = min(max(count, 1), TAKE_COUNT)
        await self._ensure_group()
        block_ms: int | None = None
        if timeout > 0:
            block_ms = max(int(timeout * 1000), 1)
            if self._max_block_ms is not None:
                block_ms = min(block_ms, self._max_block_ms)
        inbox, group = self._stream, self._keys.inbox_group

        reply = await self._client.call(
            "XREADGROUP",
            self._grouped(
                lambda: self._client.xreadgroup(inbox, group, consumer, count, block_ms),
                None,
            ),
            blocking=bool(block_ms),
        )
        if not reply:
            return []
        batches = reply.values() if isinstance(reply, dict) else (r[1] for r in reply)
        entries = [entry for batch in batches for entry in batch]
        return await self._deliveries(entries)

    async def ack(self, delivery_id: str) -> None:
        """XACK, then XDEL: a done job leaves the stream (one group, nobody else reads it)."""
        inbox, group = self._stream, self._keys.inbox_group

        async def ack_and_delete() -> None:
            async with self._client.redis.pipeline(transaction=True) as pipe:
                pipe.xack(inbox, group, delivery_id)
                pipe.xdel(inbox, delivery_id)
                await pipe.execute()

        await self._client.call("XACK", ack_and_delete)
        self._inflight.discard(delivery_id)

    async def stats(self) -> tuple[int, int]:
        """(lag, pending): entries no consumer has read yet, and entries read but not acked
        (acked entries are deleted, so the stream's length is their sum)."""
        inbox, group = self._stream, self._keys.inbox_group

        async def info() -> list[dict[str, Any]]:
            try:
                found: list[dict[str, Any]] = await self._client.redis.xinfo_groups(inbox)
            except rx.ResponseError as exc:
                if "no such key" not in str(exc).lower():
                    raise
                return []  # no stream yet: nothing queued
            return found

        groups = await self._client.call("XINFO", info)
        length = await self._client.call("XLEN", lambda: self._client.redis.xlen(inbox))
        for g in groups:
            if text(g.get("name", b"")) == group:
                pending = int(g.get("pending") or 0)
                lag = g.get("lag")
                return (int(lag) if lag is not None else max(length - pending, 0)), pending
        return int(length), 0

    def release(self, delivery: Delivery) -> None:
        """Forget we hold it: our own next claim round takes it back once it is idle for
        ``claim_idle_ms`` (another consumer takes it if we die first)."""
        self._inflight.discard(delivery.id)

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        inbox, group = self._stream, self._keys.inbox_group

        async def create() -> None:
            try:
                # From id 0: jobs enqueued before any worker ran are delivered too.
                await self._client.redis.xgroup_create(inbox, group, id="0", mkstream=True)
            except rx.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        await self._client.call("XGROUP CREATE", create)
        self._group_ready = True

    def _grouped(self, fn: Callable[[], Awaitable[T]], empty: T) -> Callable[[], Awaitable[T]]:
        """``fn``, except that a missing stream or group (flushed, restarted) reads as empty."""

        async def call() -> T:
            try:
                return await fn()
            except rx.ResponseError as exc:
                if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                    raise
                self._group_ready = False  # re-created by the next take
                return empty

        return call

    async def _claim(self, consumer: str, count: int = TAKE_COUNT) -> list[Delivery]:
        """Claim entries idle > claim_idle_ms whose consumer is dead (or is us, in a past life)."""
        now = time.monotonic()
        if now < self._next_claim:
            return []
        self._next_claim = now + self._claim_every
        inbox, group, idle = self._stream, self._keys.inbox_group, self._claim_idle_ms
        alive: dict[str, bool] = {}
        stale: list[Any] = []
        start = "-"
        for _ in range(CLAIM_PAGES):
            page = await self._pending(start, idle)
            for item in page:
                entry_id, taker = text(item["message_id"]), text(item["consumer"])
                if taker == consumer:
                    # Ours, yet not handed out by this process: a past process of this name.
                    if entry_id not in self._inflight:
                        stale.append(entry_id)
                    continue
                if taker not in alive:
                    alive[taker] = await self._alive(taker)
                if not alive[taker]:
                    stale.append(entry_id)
            if stale or len(page) < CLAIM_BATCH:
                break
            start = "(" + text(page[-1]["message_id"])  # the next page, past live consumers'
        if not stale:
            return []
        count = min(max(count, 1), TAKE_COUNT)
        if len(stale) > count:
            stale = stale[:count]
            self._next_claim = 0.0  # more to claim: look again on the next take
        # XCLAIM re-checks the idle time, so of two concurrent claimers only one wins.
        claimed = await self._client.call(
            "XCLAIM", lambda: self._client.redis.xclaim(inbox, group, consumer, idle, stale)
        )
        for entry_id in stale:
            self._inflight.discard(entry_id)
        deliveries = await self._deliveries(claimed)
        if deliveries:
            log.info("claimed %d inbox entries of dead consumers for %s", len(deliveries), consumer)
        return deliveries

    async def _pending(self, start: str, idle_ms: int) -> list[Any]:
        """One page of XPENDING: entries idle at least ``idle_ms``, from ``start`` on."""
        inbox, group = self._stream, self._keys.inbox_group
        none: list[Any] = []
        return await self._client.call(
            "XPENDING",
            self._grouped(
                lambda: self._client.redis.xpending_range(
                    inbox, group, start, "+", CLAIM_BATCH, idle=idle_ms
                ),
                none,
            ),
        )

    async def _deliveries(self, entries: list[Any]) -> list[Delivery]:
        out: list[Delivery] = []
        for raw_id, fields in entries:
            if raw_id is None:
                continue
            entry_id = text(raw_id)
            try:
                job = _job_decoder.decode((fields or {})[JOB_FIELD])
            except (KeyError, msgspec.DecodeError, TypeError) as exc:
                log.warning("dropped inbox entry %s that is not a job: %s", entry_id, exc)
                await self.ack(entry_id)
                continue
            self._inflight.add(entry_id)
            out.append(Delivery(entry_id, job))
        return out
