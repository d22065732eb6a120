"""The pub/sub multiplexer: one Redis connection per process, routed in-process.

The first local subscriber of a channel sends ``SUBSCRIBE`` and is let in only once
Redis confirmed it (DESIGN.md §9: publish before subscribe loses the message); the
last one out sends ``UNSUBSCRIBE``. The bus owns that connection and its reader
instead of redis-py's ``PubSub``, which reconnects and re-subscribes silently
(messages published in the gap are gone and nobody is told). Here a dropped
connection makes every live subscription's iterator raise :class:`BusDisconnected`;
consumers re-subscribe and re-read Postgres (``runtime.worker``, ``gateway.feed``).
The next ``subscribe`` reconnects, with backoff. The connection always speaks RESP2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from redis import exceptions as rx
from redis.asyncio.connection import AbstractConnection

from signoff.runtime.backoff import doubling
from signoff.runtime.bus.client import Client
from signoff.runtime.bus.protocol import Subscription
from signoff.runtime.errors import Unavailable
from signoff.runtime.metrics import COUNTERS

log = logging.getLogger("signoff.bus")

# Pauses before reconnecting the pub/sub connection after failed attempts (0.2 s, doubling,
# then about every second, jittered so that a pool's processes spread out). A refused
# attempt costs a millisecond (one try a call once Redis is known down, design note 63):
# with a 5 s cap the pauses outgrew the attempts, so a worker started in an outage gave up
# at its 10 s start deadline though Redis was back at 7.6 s, and the fast path came back
# up to 5 s after Redis did (a hostile probe).
RECONNECT_BACKOFF_MAX = 1.0
# The pub/sub reader pings after this much silence; no answer by the next one: dead.
HEALTH_INTERVAL = 15.0
# Redis must confirm a SUBSCRIBE within this long, or the connection is given up.
CONFIRM_TIMEOUT = 10.0
# A local subscriber this far behind is cut off (like Redis's own output buffer limit).
MAX_BACKLOG = 10_000


class BusDisconnected(Unavailable):
    """The pub/sub connection dropped: re-subscribe, then re-read Postgres."""


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

    def __init__(self, conn: AbstractConnection, sharded: bool = False) -> None:
        self.conn = conn
        # Sharded pub/sub (a cluster): SSUBSCRIBE, and "smessage" frames.
        self.message = b"smessage" if sharded else b"message"
        self.acked = (b"ssubscribe", b"sunsubscribe") if sharded else (b"subscribe", b"unsubscribe")
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
        if kind == self.message:
            channel = self.channels.get(reply[1])
            if channel is not None:
                for sub in channel.subs:
                    sub.feed(reply[2])
        elif kind in self.acked:
            waiting = self.acks.get(reply[1])
            if not waiting:
                if kind == b"sunsubscribe":
                    self.dropped(reply[1])
                return
            ack = waiting.popleft()
            if not waiting:
                del self.acks[reply[1]]
            if ack is not None and not ack.done():
                ack.set_result(None)

    def dropped(self, name: bytes) -> None:
        """The server ended a sharded subscription itself (its slot moved to another
        shard): its subscribers fail as on a dropped connection and re-subscribe."""
        channel = self.channels.pop(name, None)
        if channel is None:
            return
        error = BusDisconnected(f"Redis ended the subscription to {name.decode(errors='replace')}")
        for sub in channel.subs:
            sub.fail(error)
        if not channel.ready.done():
            channel.ready.set_result(error)


class PubSub:
    """Subscriptions of one process, multiplexed on one pub/sub connection (on a cluster,
    one per node holding a subscribed channel's slot, with sharded pub/sub)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._sharded = client.sharded
        self._links: dict[str, _Link] = {}  # by node ("" on one server)
        self._link_lock = asyncio.Lock()
        self._readers: set[asyncio.Task[None]] = set()
        self._connect_failures = 0
        self._links_made = 0  # the second and later are reconnects (a metric)
        self._reconnect_at = 0.0
        # Connect attempts made per node, and the last one's refusal (None: it connected).
        # A caller that queued on the lock while an attempt was made is told its outcome
        # instead of making one more: each caller used to sleep out the pause and try in
        # turn, so with N threads followed a new one's first try came N pauses later.
        self._tries: dict[str, int] = {}
        self._refused: dict[str, Unavailable] = {}
        self._closed = False

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        """Subscribe; entered once Redis confirmed. The iterator raises BusDisconnected on a drop."""
        name = channel.encode()
        node = ""  # one server; on a cluster, the node holding the channel's slot
        if self._sharded:
            node = await self._client.call("pub/sub route", lambda: self._client.node_name(channel))
        link = await self._ensure_link(node, channel)
        sub = _Sub()
        state = link.channels.get(name)
        if state is None:
            state = link.channels[name] = _Channel()
            state.subs.add(sub)
            try:
                await self._send(
                    link, "SSUBSCRIBE" if self._sharded else "SUBSCRIBE", name, ack=True
                )
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
                verb = "SUNSUBSCRIBE" if self._sharded else "UNSUBSCRIBE"
                await self._send(link, verb, name, ack=False)

    async def _send(self, link: _Link, *args: bytes | str, ack: bool) -> None:
        # Shielded: a cancelled subscriber must not abort a half-written command,
        # which would make redis-py drop the connection every subscriber shares.
        name = args[1]
        assert isinstance(name, bytes)
        task = asyncio.ensure_future(link.send(*args, channel=name, ack=ack))
        task.add_done_callback(_retrieve)
        await asyncio.shield(task)

    async def _ensure_link(self, node: str, channel: str) -> _Link:
        tries = self._tries.get(node, 0)
        async with self._link_lock:
            if self._closed:
                raise Unavailable("the Redis bus is closed")
            link = self._links.get(node)
            if link is not None and link.error is None:
                return link
            self._links.pop(node, None)
            refused = self._refused.get(node)
            if refused is not None and self._tries.get(node, 0) != tries:
                # An attempt was made while this caller waited for the lock, and failed:
                # that is this caller's answer too (one attempt per pause, not per caller).
                raise Unavailable(refused.message, **refused.detail).said_as(refused.public)
            pause = self._reconnect_at - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            try:
                conn = await self._client.call(
                    "pub/sub connect", lambda: self._connect(node, channel)
                )
            except Unavailable as exc:
                self._tries[node] = self._tries.get(node, 0) + 1
                self._refused[node] = exc
                self._connect_failures += 1
                backoff = doubling(0.1, self._connect_failures, RECONNECT_BACKOFF_MAX)
                self._reconnect_at = time.monotonic() + backoff * random.uniform(0.8, 1.0)
                raise
            self._tries[node] = self._tries.get(node, 0) + 1
            self._refused.pop(node, None)
            self._connect_failures = 0
            if self._closed:  # closed while connecting
                await conn.disconnect()
                raise Unavailable("the Redis bus is closed")
            link = _Link(conn, self._sharded)
            link.reader = asyncio.create_task(self._read(link), name="signoff-bus-pubsub")
            self._readers.add(link.reader)
            link.reader.add_done_callback(self._readers.discard)
            self._links[node] = link
            if self._links_made:
                COUNTERS.inc("signoff_pubsub_reconnects_total")
            self._links_made += 1
            return link

    async def _connect(self, node: str, channel: str) -> AbstractConnection:
        if self._sharded and await self._client.node_name(channel) != node:
            # The slot moved while we retried (a failover): route the subscribe again.
            raise BusDisconnected(f"the shard of {channel} moved; subscribe again")
        # RESP2 on this one connection, whatever the client speaks: pub/sub frames are then
        # plain replies in order, not RESP3 push frames routed through redis-py's handlers.
        connection_class, kwargs = self._client.connection_spec(node)
        conn: AbstractConnection = connection_class(**{**kwargs, "protocol": 2})
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
            self._client.suspect()  # on a cluster: reload the slot table before the next try
            error = BusDisconnected(f"pub/sub connection lost: {exc}")
            error.__cause__ = exc
            link.fail(error)
        finally:
            with contextlib.suppress(Exception):
                await link.conn.disconnect()

    async def close(self) -> None:
        """Fail live subscriptions and stop the reader (its connection closes with it)."""
        if self._closed:
            return
        self._closed = True
        links = list(self._links.values())
        self._links.clear()
        for link in links:
            link.fail(BusDisconnected("the Redis bus is closed"))
        readers = set(self._readers)
        for reader in readers:
            reader.cancel()
        if readers:
            await asyncio.wait(readers)  # (not `await reader`: that would swallow our own cancel)
