"""The Redis bus: pub/sub, wait tokens, heartbeats and the inbox stream (DESIGN.md §5).

Every command here names at most one key (``PUBLISH``, ``SET``/``GET``/``DEL``/
``EXISTS``, ``XADD``/``XREADGROUP``/``XPENDING``/``XCLAIM``/``XACK``/``XDEL`` on the
one inbox stream), so the bus runs unchanged on a Redis Cluster without hash
tags; the one transaction (``XACK`` + ``XDEL`` in ``ack``) touches the inbox alone,
and ``clear_waits`` pipelines one-key ``DEL``s rather than sending a multi-key one.

Pub/sub: one connection per :class:`RedisBus`, multiplexed in-process. The first
local subscriber of a channel sends ``SUBSCRIBE`` and is let in only once Redis
confirmed it (DESIGN.md §9: publish before subscribe loses the message); the last
one out sends ``UNSUBSCRIBE``. The bus owns that connection and its reader
instead of redis-py's ``PubSub``, which reconnects and re-subscribes silently
(messages published in the gap are gone and nobody is told). Here a dropped
connection makes every live subscription's iterator raise :class:`BusDisconnected`;
consumers re-subscribe and re-read Postgres (``runtime.worker``, ``gateway.feed``).
The next ``subscribe`` reconnects, with backoff.

Inbox: a stream with one consumer group. Entries delivered to a consumer that has
no heartbeat any more (or to this very consumer name in an earlier life of the
process) are claimed by the next ``take`` once idle for ``claim_idle_ms``;
``XCLAIM``'s min-idle-time makes two claimers race safely. A consumer that is
alive but slow keeps its entries. Delivery is at least once: a redelivered job
gets its existing card back (I5).

Every Redis call goes through :meth:`RedisBus._call`, which retries connection
errors and timeouts with backoff, then raises :class:`~runtime.errors.Unavailable`.
The client must have ``decode_responses=False``; :meth:`from_url` builds one on RESP2
with no retries of its own (redis-py 8 defaults to RESP3 and 10 retries, which would
multiply with ours). The pub/sub connection always speaks RESP2.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from itertools import islice
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis
from redis import exceptions as rx
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from signoff.runtime.bus import Delivery, Job, Subscription
from signoff.runtime.errors import ConfigError, InvalidInput, Unavailable
from signoff.runtime.keys import Keys
from signoff.runtime.redis_pipe import Pipe, supported

log = logging.getLogger("signoff.bus")

T = TypeVar("T")

# Waits between tries of one command: 4 tries in all, ~0.6 s before giving up.
RETRY_DELAYS = (0.05, 0.15, 0.4)
# Pauses before reconnecting the pub/sub connection after failed attempts.
RECONNECT_BACKOFF_MAX = 5.0
# The pub/sub reader pings after this much silence; no answer by the next one: dead.
HEALTH_INTERVAL = 15.0
# Redis must confirm a SUBSCRIBE within this long, or the connection is given up.
CONFIRM_TIMEOUT = 10.0
# A local subscriber this far behind is cut off (like Redis's own output buffer limit).
MAX_BACKLOG = 10_000
TAKE_COUNT = 16
CLEAR_BATCH = 1000  # wait tokens deleted per pipelined round trip
CLAIM_BATCH = 100  # XPENDING page size
CLAIM_PAGES = 10  # pages looked at per claim round
JOB_FIELD = b"job"

_RETRYABLE = (rx.ConnectionError, rx.TimeoutError, ConnectionError, TimeoutError)
_job_decoder = msgspec.json.Decoder(Job)
_encoder = msgspec.json.Encoder()


class BusDisconnected(Unavailable):
    """The pub/sub connection dropped: re-subscribe, then re-read Postgres."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _socket_timeout(client: aioredis.Redis) -> float | None:
    """The client's read timeout; redis-py leaves its default (5 s in 8.x) out of the kwargs."""
    pool = client.connection_pool
    if "socket_timeout" in pool.connection_kwargs:
        timeout: float | None = pool.connection_kwargs["socket_timeout"]
        return timeout
    for cls in pool.connection_class.__mro__:
        init = vars(cls).get("__init__")
        if init is not None:
            param = inspect.signature(init).parameters.get("socket_timeout")
            if param is not None and param.default is not inspect.Parameter.empty:
                default: float | None = param.default
                return default
    return None


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class _Sub:
    """One local subscriber: an async iterator of payloads, or of one error."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._error: BusDisconnected | None = None

    def feed(self, payload: bytes) -> None:
        if self._error is not None:
            return
        if self._queue.qsize() >= MAX_BACKLOG:
            self.fail(BusDisconnected("subscriber fell too far behind; re-subscribe"))
            return
        self._queue.put_nowait(payload)

    def fail(self, error: BusDisconnected) -> None:
        if self._error is None:
            self._error = error
            self._queue.put_nowait(None)

    def __aiter__(self) -> _Sub:
        return self

    async def __anext__(self) -> bytes:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)  # keep raising if iterated again
            assert self._error is not None
            raise BusDisconnected(self._error.message) from self._error.__cause__
        return item


class _Channel:
    """Local subscribers of one channel; ``ready`` gets None once Redis confirmed, or an error."""

    def __init__(self) -> None:
        self.subs: set[_Sub] = set()
        self.ready: asyncio.Future[BusDisconnected | None] = (
            asyncio.get_running_loop().create_future()
        )


class _Link:
    """One pub/sub connection, its reader task and the channels subscribed on it."""

    def __init__(self, conn: AbstractConnection) -> None:
        self.conn = conn
        self.channels: dict[bytes, _Channel] = {}
        # Per channel, in send order: the future a (UN)SUBSCRIBE reply resolves (None: nothing).
        self.acks: dict[bytes, deque[asyncio.Future[BusDisconnected | None] | None]] = {}
        self.lock = asyncio.Lock()
        self.error: BusDisconnected | None = None
        self.reader: asyncio.Task[None] | None = None

    def fail(self, error: BusDisconnected) -> None:
        """Mark the link dead: subscribers raise, confirmations fail, the reader stops."""
        if self.error is not None:
            return
        self.error = error
        if self.reader is not None and self.reader is not asyncio.current_task():
            self.reader.cancel()  # its finally closes the connection
        for channel in self.channels.values():
            for sub in channel.subs:
                sub.fail(error)
            if not channel.ready.done():
                channel.ready.set_result(error)
        for waiting in self.acks.values():
            for ack in waiting:
                if ack is not None and not ack.done():
                    ack.set_result(error)
        self.channels.clear()
        self.acks.clear()

    async def send(self, *args: bytes | str, channel: bytes, ack: bool) -> None:
        """Send one (UN)SUBSCRIBE, in order; never reconnects (a dead link stays dead)."""
        async with self.lock:
            if self.error is not None:
                raise BusDisconnected(self.error.message) from self.error.__cause__
            if not self.conn.is_connected:
                self.fail(BusDisconnected("pub/sub connection closed"))
                raise BusDisconnected("pub/sub connection closed")
            channel_state = self.channels.get(channel)
            future = channel_state.ready if ack and channel_state is not None else None
            self.acks.setdefault(channel, deque()).append(future)
            try:
                await self.conn.send_command(*args, check_health=False)
            except Exception as exc:
                error = BusDisconnected(f"pub/sub connection lost: {exc}")
                error.__cause__ = exc
                self.fail(error)
                raise error from exc

    def dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or not reply:
            return  # b"PONG" outside subscribed mode
        kind = reply[0]
        if kind == b"message":
            channel = self.channels.get(reply[1])
            if channel is not None:
                for sub in channel.subs:
                    sub.feed(reply[2])
        elif kind in (b"subscribe", b"unsubscribe"):
            waiting = self.acks.get(reply[1])
            if not waiting:
                return
            ack = waiting.popleft()
            if not waiting:
                del self.acks[reply[1]]
            if ack is not None and not ack.done():
                ack.set_result(None)


class RedisBus:
    """The :class:`~runtime.bus.Bus` on Redis, for several gateway and worker processes."""

    def __init__(self, client: aioredis.Redis, keys: Keys, *, claim_idle_ms: int = 30_000) -> None:
        kwargs = client.connection_pool.connection_kwargs
        if kwargs.get("decode_responses"):
            raise ConfigError("the Redis bus needs a client with decode_responses=False")
        self._client = client
        self._keys = keys
        self._claim_idle_ms = claim_idle_ms
        self._claim_every = min(5.0, claim_idle_ms / 1000)
        self._next_claim = 0.0
        self._inflight: set[str] = set()  # delivered by this process, not acked yet
        self._group_ready = False
        timeout = _socket_timeout(client)
        # A BLOCK longer than the socket timeout would read as a dead connection.
        self._max_block_ms = max(int(timeout * 1000) - 500, 1) if timeout else None
        self._link: _Link | None = None
        # PUBLISH/GET/SET/DEL go through one pipelined connection (runtime.redis_pipe);
        # a TLS client keeps redis-py for them.
        pool = client.connection_pool
        self._pipe_kwargs = pool.connection_kwargs if supported(pool.connection_class) else None
        self._pipe_timeout = timeout
        self._pipe: Pipe | None = None
        self._pipe_lock = asyncio.Lock()
        self._readers: set[asyncio.Task[None]] = set()
        self._link_lock = asyncio.Lock()
        self._connect_failures = 0
        self._reconnect_at = 0.0
        self._closed = False

    @classmethod
    def from_url(cls, url: str, keys: Keys, *, claim_idle_ms: int = 30_000) -> RedisBus:
        """A bus on ``redis://``/``rediss://``/``unix://`` (hiredis parses when installed)."""
        # RESP2 (redis-py 8 defaults to RESP3) and no retries in redis-py: ours are in _call.
        client = aioredis.Redis.from_url(url, protocol=2, retry=Retry(NoBackoff(), 0))
        return cls(client, keys, claim_idle_ms=claim_idle_ms)

    # -- the retry helper ---------------------------------------------------------------

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis call; retry connection errors and timeouts, then raise Unavailable."""
        if self._closed:
            raise Unavailable("the Redis bus is closed", command=what)
        for attempt, delay in enumerate((*RETRY_DELAYS, None), start=1):
            try:
                return await fn()
            except _RETRYABLE as exc:
                if delay is None or self._closed:
                    raise Unavailable(
                        f"Redis {what} failed after {attempt} tries: {exc}", command=what
                    ) from exc
                log.debug("Redis %s failed (%s); retry %d", what, exc, attempt)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            except rx.RedisError as exc:
                raise Unavailable(f"Redis {what} failed: {exc}", command=what) from exc
            except UnicodeEncodeError as exc:  # e.g. a str with a lone surrogate
                raise InvalidInput(f"Redis {what}: an argument cannot be encoded") from exc
        raise AssertionError("unreachable")

    async def _fast(self, *args: bytes | str | int) -> Any:
        """One command on the pipelined connection, (re)opened on demand."""
        pipe = self._pipe
        if pipe is None or pipe.closed:
            async with self._pipe_lock:
                pipe = self._pipe
                if pipe is None or pipe.closed:
                    assert self._pipe_kwargs is not None
                    pipe = self._pipe = await Pipe.open(self._pipe_kwargs, self._pipe_timeout)
        return await pipe.call(*args)

    # -- pub/sub -------------------------------------------------------------------------

    async def publish(self, channel: str, message: bytes) -> int:
        """PUBLISH; the number of Redis subscribers (connections, not local listeners)."""
        if self._pipe_kwargs is None:
            return await self._call("PUBLISH", lambda: self._client.publish(channel, message))
        heard: int = await self._call("PUBLISH", lambda: self._fast(b"PUBLISH", channel, message))
        return heard

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        """Subscribe; entered once Redis confirmed. The iterator raises BusDisconnected on a drop."""
        name = channel.encode()
        link = await self._ensure_link()
        sub = _Sub()
        state = link.channels.get(name)
        if state is None:
            state = link.channels[name] = _Channel()
            state.subs.add(sub)
            try:
                await self._send(link, "SUBSCRIBE", name, ack=True)
            except BaseException:
                await self._leave(link, name, state, sub)
                raise
        else:
            state.subs.add(sub)
        try:
            done, _ = await asyncio.wait({state.ready}, timeout=CONFIRM_TIMEOUT)
            if not done:
                link.fail(BusDisconnected(f"Redis did not confirm SUBSCRIBE {channel}"))
            error = state.ready.result() if state.ready.done() else link.error
            if error is not None:
                raise BusDisconnected(error.message) from error.__cause__
        except BaseException:
            await self._leave(link, name, state, sub)
            raise
        try:
            yield sub
        finally:
            await self._leave(link, name, state, sub)

    async def _leave(self, link: _Link, name: bytes, state: _Channel, sub: _Sub) -> None:
        state.subs.discard(sub)
        if state.subs or link.channels.get(name) is not state:
            return
        del link.channels[name]
        if link.error is None:
            with contextlib.suppress(BusDisconnected):
                await self._send(link, "UNSUBSCRIBE", name, ack=False)

    async def _send(self, link: _Link, *args: bytes | str, ack: bool) -> None:
        # Shielded: a cancelled subscriber must not abort a half-written command,
        # which would make redis-py drop the connection every subscriber shares.
        name = args[1]
        assert isinstance(name, bytes)
        task = asyncio.ensure_future(link.send(*args, channel=name, ack=ack))
        task.add_done_callback(_retrieve)
        await asyncio.shield(task)

    async def _ensure_link(self) -> _Link:
        async with self._link_lock:
            if self._closed:
                raise Unavailable("the Redis bus is closed")
            if self._link is not None and self._link.error is None:
                return self._link
            self._link = None
            pause = self._reconnect_at - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            try:
                conn = await self._call("pub/sub connect", self._connect)
            except Unavailable:
                self._connect_failures += 1
                backoff = min(0.1 * 2**self._connect_failures, RECONNECT_BACKOFF_MAX)
                self._reconnect_at = time.monotonic() + backoff
                raise
            self._connect_failures = 0
            if self._closed:  # closed while connecting
                await conn.disconnect()
                raise Unavailable("the Redis bus is closed")
            link = _Link(conn)
            link.reader = asyncio.create_task(self._read(link), name="signoff-bus-pubsub")
            self._readers.add(link.reader)
            link.reader.add_done_callback(self._readers.discard)
            self._link = link
            return link

    async def _connect(self) -> AbstractConnection:
        pool = self._client.connection_pool
        # RESP2 on this one connection, whatever the client speaks: pub/sub frames are then
        # plain replies in order, not RESP3 push frames routed through redis-py's handlers.
        conn: AbstractConnection = pool.connection_class(
            **{**pool.connection_kwargs, "protocol": 2}
        )
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            await conn.disconnect()
            raise
        return conn

    async def _read(self, link: _Link) -> None:
        """The one reader of the pub/sub connection: route replies, ping when quiet."""
        pinged = False
        try:
            while True:
                reply = await link.conn.read_response(
                    timeout=HEALTH_INTERVAL, disconnect_on_error=False
                )
                if reply is None:  # quiet for HEALTH_INTERVAL
                    if pinged:
                        raise rx.TimeoutError("no answer to PING on the pub/sub connection")
                    pinged = True
                    async with link.lock:
                        await link.conn.send_command("PING", check_health=False)
                    continue
                pinged = False
                link.dispatch(reply)
        except asyncio.CancelledError:
            link.fail(BusDisconnected("the Redis bus is closed"))
            raise
        except Exception as exc:
            log.warning("Redis pub/sub connection lost: %s", exc)
            error = BusDisconnected(f"pub/sub connection lost: {exc}")
            error.__cause__ = exc
            link.fail(error)
        finally:
            with contextlib.suppress(Exception):
                await link.conn.disconnect()

    # -- wait tokens and heartbeats ------------------------------------------------------

    async def set_wait(self, card_id: str, worker_id: str, ttl_ms: int) -> None:
        key = self._keys.wait(card_id)
        if self._pipe_kwargs is None:
            await self._call("SET", lambda: self._client.set(key, worker_id, px=max(ttl_ms, 1)))
            return
        await self._call("SET", lambda: self._fast(b"SET", key, worker_id, b"PX", max(ttl_ms, 1)))

    async def clear_wait(self, card_id: str) -> None:
        key = self._keys.wait(card_id)
        if self._pipe_kwargs is None:
            await self._call("DEL", lambda: self._client.delete(key))
            return
        await self._call("DEL", lambda: self._fast(b"DEL", key))

    async def clear_waits(self, card_ids: Iterable[str]) -> None:
        """Pipelined single-key DELs, ``CLEAR_BATCH`` per round trip; stops at the first
        batch that fails after retries (the tokens left expire by their TTL)."""
        ids = iter(card_ids)
        while batch := [self._keys.wait(card_id) for card_id in islice(ids, CLEAR_BATCH)]:

            async def delete(keys: list[str] = batch) -> None:
                async with self._client.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.delete(key)
                    await pipe.execute()

            await self._call("DEL", delete)

    async def wait_owner(self, card_id: str) -> str | None:
        key = self._keys.wait(card_id)
        if self._pipe_kwargs is None:
            owner = await self._call("GET", lambda: self._client.get(key))
        else:
            owner = await self._call("GET", lambda: self._fast(b"GET", key))
        return None if owner is None else _text(owner)

    async def heartbeat(self, worker_id: str, ttl_ms: int) -> None:
        key = self._keys.worker(worker_id)
        await self._call("SET", lambda: self._client.set(key, "1", px=max(ttl_ms, 1)))

    async def alive(self, worker_id: str) -> bool:
        """Whether the worker's heartbeat key is still there."""
        key = self._keys.worker(worker_id)
        return bool(await self._call("EXISTS", lambda: self._client.exists(key)))

    # -- the inbox -----------------------------------------------------------------------

    async def enqueue(self, job: Job) -> str:
        """XADD the job; returns the entry id."""
        fields: dict[Any, Any] = {JOB_FIELD: _encoder.encode(job)}
        entry = await self._call("XADD", lambda: self._client.xadd(self._keys.inbox, fields))
        return _text(entry)

    async def take(self, consumer: str, timeout: float) -> list[Delivery]:
        """Up to 16 jobs for ``consumer``: claimed ones of dead consumers first, else new ones."""
        await self._ensure_group()
        claimed = await self._claim(consumer)
        if claimed:
            return claimed
        block_ms: int | None = None
        if timeout > 0:
            block_ms = max(int(timeout * 1000), 1)
            if self._max_block_ms is not None:
                block_ms = min(block_ms, self._max_block_ms)
        inbox, group = self._keys.inbox, self._keys.inbox_group

        reply = await self._call(
            "XREADGROUP",
            self._grouped(
                lambda: self._client.xreadgroup(
                    group, consumer, {inbox: ">"}, count=TAKE_COUNT, block=block_ms
                ),
                None,
            ),
        )
        if not reply:
            return []
        batches = reply.values() if isinstance(reply, dict) else (r[1] for r in reply)
        entries = [entry for batch in batches for entry in batch]
        return await self._deliveries(entries)

    async def ack(self, delivery_id: str) -> None:
        """XACK, then XDEL: a done job leaves the stream (one group, nobody else reads it)."""
        inbox, group = self._keys.inbox, self._keys.inbox_group

        async def ack_and_delete() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.xack(inbox, group, delivery_id)
                pipe.xdel(inbox, delivery_id)
                await pipe.execute()

        await self._call("XACK", ack_and_delete)
        self._inflight.discard(delivery_id)

    def release(self, delivery: Delivery) -> None:
        """Forget we hold it: our own next claim round takes it back once it is idle for
        ``claim_idle_ms`` (another consumer takes it if we die first)."""
        self._inflight.discard(delivery.id)

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        inbox, group = self._keys.inbox, self._keys.inbox_group

        async def create() -> None:
            try:
                # From id 0: jobs enqueued before any worker ran are delivered too.
                await self._client.xgroup_create(inbox, group, id="0", mkstream=True)
            except rx.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        await self._call("XGROUP CREATE", create)
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

    async def _claim(self, consumer: str) -> list[Delivery]:
        """Claim entries idle > claim_idle_ms whose consumer is dead (or is us, in a past life)."""
        now = time.monotonic()
        if now < self._next_claim:
            return []
        self._next_claim = now + self._claim_every
        inbox, group, idle = self._keys.inbox, self._keys.inbox_group, self._claim_idle_ms
        alive: dict[str, bool] = {}
        stale: list[Any] = []
        start = "-"
        for _ in range(CLAIM_PAGES):
            page = await self._pending(start, idle)
            for item in page:
                entry_id, owner = _text(item["message_id"]), _text(item["consumer"])
                if owner == consumer:
                    # Ours, yet not handed out by this process: a past process of this name.
                    if entry_id not in self._inflight:
                        stale.append(entry_id)
                    continue
                if owner not in alive:
                    alive[owner] = await self.alive(owner)
                if not alive[owner]:
                    stale.append(entry_id)
            if stale or len(page) < CLAIM_BATCH:
                break
            start = "(" + _text(page[-1]["message_id"])  # the next page, past live consumers'
        if not stale:
            return []
        if len(stale) > TAKE_COUNT:
            stale = stale[:TAKE_COUNT]
            self._next_claim = 0.0  # more to claim: look again on the next take
        # XCLAIM re-checks the idle time, so of two concurrent claimers only one wins.
        claimed = await self._call(
            "XCLAIM", lambda: self._client.xclaim(inbox, group, consumer, idle, stale)
        )
        for entry_id in stale:
            self._inflight.discard(entry_id)
        deliveries = await self._deliveries(claimed)
        if deliveries:
            log.info("claimed %d inbox entries of dead consumers for %s", len(deliveries), consumer)
        return deliveries

    async def _pending(self, start: str, idle_ms: int) -> list[Any]:
        """One page of XPENDING: entries idle at least ``idle_ms``, from ``start`` on."""
        inbox, group = self._keys.inbox, self._keys.inbox_group
        none: list[Any] = []
        return await self._call(
            "XPENDING",
            self._grouped(
                lambda: self._client.xpending_range(
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
            entry_id = _text(raw_id)
            try:
                job = _job_decoder.decode((fields or {})[JOB_FIELD])
            except (KeyError, msgspec.DecodeError, TypeError) as exc:
                log.warning("dropped inbox entry %s that is not a job: %s", entry_id, exc)
                await self.ack(entry_id)
                continue
            self._inflight.add(entry_id)
            out.append(Delivery(entry_id, job))
        return out

    # -- lifecycle -----------------------------------------------------------------------

    async def close(self) -> None:
        """Fail live subscriptions, stop the reader, close both connections and the pool."""
        if self._closed:
            return
        self._closed = True
        link, self._link = self._link, None
        if link is not None:
            link.fail(BusDisconnected("the Redis bus is closed"))
        readers = set(self._readers)
        for reader in readers:
            reader.cancel()
        if readers:
            await asyncio.wait(readers)  # (not `await reader`: that would swallow our own cancel)
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        await self._client.aclose()

    # -- per-user quota windows (gateway/quotas.py) --------------------------------------

    _window_script: Any = None  # redis-py's AsyncScript (EVALSHA, EVAL on NOSCRIPT), made once

    async def window_add(self, key: str, member: str, now_ms: int, window_ms: int) -> list[str]:
        """Drop the members of sorted set ``key`` older than ``window_ms``, add ``member``
        at ``now_ms`` and return every member left (``member`` among them). One script on
        one key: of concurrent adds on any gateway, each sees all the adds before it."""
        script = self._window_script
        if script is None:
            script = self._window_script = self._client.register_script(_WINDOW_ADD)
        members = await self._call(
            "EVALSHA", lambda: script(keys=[key], args=[member, now_ms, max(window_ms, 1)])
        )
        return [_text(m) for m in members]

    async def window_remove(self, key: str, members: list[str]) -> None:
        """ZREM ``members`` from the sorted set ``key`` (a refused or settled entry)."""
        if members:
            await self._call("ZREM", lambda: self._client.zrem(key, *members))


# KEYS[1] a sorted set; ARGV: member, now (ms), window (ms). The key expires a window after
# its last add, so an idle user leaves nothing behind.
_WINDOW_ADD = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""
