"""The bus's client on a Redis Cluster: slot routing, redirects and failovers.

Selected by a ``redis+cluster://host:port[,host:port...]`` URL (``rediss+cluster://``
for TLS; design note 31). Two paths, as on one node:

* the hot commands (``SPUBLISH``, ``GET``, ``SET``, ``DEL``, and ``XADD`` followed by
  ``WAIT``) go through one pipelined connection per node (:mod:`.pipe`), routed by
  the key's slot from redis-py's slot table. A ``MOVED`` reply updates that table and
  is followed; an ``ASK`` reply is followed once with ``ASKING`` on the same
  connection; a dropped connection, ``CLUSTERDOWN`` or ``TRYAGAIN`` reloads the
  topology (``CLUSTER SLOTS``) and is retried;
* everything else goes through redis-py's :class:`~redis.asyncio.cluster.RedisCluster`,
  which follows redirects itself; its own retries are off, ours (longer than on one
  node, to outlast an election) re-run the call after it refreshed its table.

Every retry gives up with :class:`~signoff.runtime.errors.Unavailable`, as on one node.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from redis import exceptions as rx
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot

from signoff.runtime.bus.client import REDIS_UNANSWERED, RETRYABLE, Client
from signoff.runtime.bus.pipe import Arg, Pipe
from signoff.runtime.errors import ConfigError, InvalidInput, Unavailable

log = logging.getLogger("signoff.bus")

T = TypeVar("T")

SCHEMES = ("redis+cluster", "rediss+cluster")
# Waits between tries: ~6 s in all, longer than a replica's election after its master
# died (cluster-node-timeout plus a second or so on a default-configured cluster needs
# a larger node timeout to be covered: see deploy/env.md).
CLUSTER_RETRY_DELAYS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0)
# Cluster answers that pass once the topology settles.
TRANSIENT = ("CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING", "READONLY")
SOCKET_TIMEOUT = 5.0
# redis-py's errors while the topology is changing (no node for a slot, no seed answers).
# (redis-py turns READONLY, LOADING and MASTERDOWN answers into their own classes.)
CLUSTER_RETRYABLE = (
    rx.ClusterError,
    rx.ClusterDownError,
    rx.TryAgainError,
    rx.RedisClusterException,
    rx.ReadOnlyError,
    rx.BusyLoadingError,
    rx.MasterDownError,
)
# Writes an enqueue waits to see on a replica before it is acknowledged (WAIT).
WAIT_TIMEOUT_MS = 1000


class Redirected(rx.ConnectionError):
    """A transient cluster answer (or too many redirects): retry after a topology reload."""


def _closed_under_us(exc: AttributeError) -> bool:
    """redis-py's cluster client closes every node's connections on CLUSTERDOWN, under
    the commands in flight on them, which then fail on a writer or reader that is now
    None: a dropped connection in all but name (retried)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and f"{os.sep}redis{os.sep}" in frames[-1].filename


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SCHEMES


def cluster_from_url(url: str, *, max_connections: int = 2**31) -> RedisCluster:
    """A redis-py cluster client on the URL's seed nodes: RESP2, no retries of its own, at
    most ``max_connections`` connections per node."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise ConfigError(f"not a Redis Cluster URL: {parts.scheme}://")
    hosts = parts.netloc.rsplit("@", 1)[-1]
    seeds: list[ClusterNode] = []
    for host_port in filter(None, hosts.split(",")):
        host, _, port = host_port.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()):
            raise ConfigError(f"a Redis Cluster seed must be host:port, not {host_port!r}")
        seeds.append(ClusterNode(host.strip("[]"), int(port)))
    if not seeds:
        raise ConfigError("a Redis Cluster URL needs at least one host:port")
    path = parts.path.strip("/")
    if path not in ("", "0"):
        raise ConfigError("a Redis Cluster has one database, 0")
    return RedisCluster(
        startup_nodes=seeds,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        ssl=parts.scheme.lower() == "rediss+cluster",
        protocol=2,
        retry=Retry(NoBackoff(), 0),
        # MOVED patches the slot table; no full reload (and no closing of every node's
        # connections under the commands in flight) every few MOVEDs: ours reload it.
        reinitialize_steps=0,
        max_connections=max(max_connections, 1),
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        client_name=_query(parts.query, "client_name"),
    )


def _query(query: str, name: str) -> str | None:
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if key == name:
            return unquote(value)
    return None


class ClusterClient(Client):
    """:class:`~.client.Client` on a cluster: one pipelined connection per node."""

    cluster: RedisCluster

    def __init__(self, cluster: RedisCluster) -> None:
        kwargs = cluster.get_connection_kwargs()
        if kwargs.get("decode_responses"):
            raise ConfigError("the Redis bus needs a client with decode_responses=False")
        self.redis = cluster
        self.cluster = cluster
        self.closed = False
        self.socket_timeout = kwargs.get("socket_timeout")
        # TLS keeps redis-py for the hot commands too.
        self._pipe_kwargs = None if kwargs.get("ssl") or kwargs.get("connection_class") else kwargs
        self._pipes: dict[str, Pipe] = {}
        self._pipe_lock = asyncio.Lock()
        self._refresh_lock = asyncio.Lock()
        self._stale = False  # the slot table may be wrong: reload before the next try
        self._refreshed_at = 0.0

    async def call(self, what: str, fn: Callable[[], Awaitable[T]], *, blocking: bool = False) -> T:
        """Run one call; retry drops, timeouts and transient cluster answers (reloading the
        topology first) for ~6 s, then raise Unavailable (a cluster rides a failover this
        way; one server's client fails fast once it stalls instead, ``Client.call``)."""
        if self.closed:
            raise Unavailable("the Redis bus is closed", command=what)
        sent = False  # an attempt failed after its command may have gone out (client.py)
        for attempt, delay in enumerate((*CLUSTER_RETRY_DELAYS, None), start=1):
            try:
                if self._stale:
                    await self.refresh()
                return await fn()
            except (*RETRYABLE, *CLUSTER_RETRYABLE, AttributeError) as exc:
                if isinstance(exc, AttributeError) and not _closed_under_us(exc):
                    raise
                self._stale = True
                if delay is None or self.closed:
                    raise (
                        Unavailable(
                            f"Redis {what} failed after {attempt} tries: {exc}", command=what
                        )
                        .said_as(REDIS_UNANSWERED)
                        .unanswered()
                    ) from exc
                # A cluster's own refusal (MOVED, TRYAGAIN, CLUSTERDOWN) applied nothing.
                sent = sent or not isinstance(exc, CLUSTER_RETRYABLE)
                log.debug("Redis %s failed (%s); retry %d", what, exc, attempt)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            except rx.ResponseError as exc:
                if not str(exc).startswith(TRANSIENT) or delay is None or self.closed:
                    raise _failed(what, exc, sent) from exc
                self._stale = True
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            except rx.RedisError as exc:
                raise _failed(what, exc, sent) from exc
            except UnicodeEncodeError as exc:
                raise InvalidInput(f"Redis {what}: an argument cannot be encoded") from exc
        raise AssertionError("unreachable")

    async def refresh(self) -> None:
        """Reload the slot table (at most every 100 ms) and drop pipes to dead nodes."""
        async with self._refresh_lock:
            if not self._stale:
                return
            if time.monotonic() - self._refreshed_at > 0.1:
                await self.cluster.nodes_manager.initialize()
                self._refreshed_at = time.monotonic()
            self._stale = False
            for name, pipe in list(self._pipes.items()):
                if pipe.closed:
                    del self._pipes[name]

    sharded = True

    async def node_name(self, channel: str) -> str:
        await self.ready()
        return self.node_of(channel).name

    def connection_spec(self, node: str) -> tuple[type[AbstractConnection], dict[str, Any]]:
        found = self.cluster.get_node(node_name=node)
        if found is None:  # gone from the slot table since it was routed to
            self._stale = True
            raise rx.ConnectionError(f"Redis Cluster node {node} is gone")
        return found.connection_class, found.connection_kwargs

    def suspect(self) -> None:
        self._stale = True

    def node_of(self, key: str | bytes) -> ClusterNode:
        """The primary that holds ``key``'s slot (a sharded channel's too)."""
        raw = key.encode() if isinstance(key, str) else key
        try:
            return self.cluster.nodes_manager.get_node_from_slot(key_slot(raw))
        except (KeyError, IndexError, rx.RedisClusterException) as exc:
            self._stale = True
            raise Redirected(f"no node holds the slot of {raw!r} now") from exc

    async def ready(self) -> None:
        """Load the slot table once (redis-py does it on its first command)."""
        await self.cluster.initialize()

    async def _pipe_to(self, host: str, port: int) -> Pipe:
        name = f"{host}:{port}"
        pipe = self._pipes.get(name)
        if pipe is None or pipe.closed:
            async with self._pipe_lock:
                pipe = self._pipes.get(name)
                if pipe is None or pipe.closed:
                    assert self._pipe_kwargs is not None
                    kwargs = {**self._pipe_kwargs, "host": host, "port": port}
                    pipe = self._pipes[name] = await Pipe.open(kwargs, self.socket_timeout)
        return pipe

    async def on_key(self, key: str, *commands: tuple[Arg, ...]) -> list[Any]:
        """``commands`` back to back on the pipe of ``key``'s node; redirects followed."""
        await self.ready()
        node = self.node_of(key)
        pipe = await self._pipe_to(node.host, int(node.port))
        asking = False
        for _ in range(3):
            try:
                if asking:
                    return (await pipe.call_many((b"ASKING",), *commands))[1:]
                if len(commands) == 1:
                    return [await pipe.call(*commands[0])]
                return await pipe.call_many(*commands)
            except rx.ResponseError as exc:
                message = str(exc)
                if message.startswith(("MOVED ", "ASK ")):
                    kind, _, target = message.partition(" ")
                    if kind == "MOVED":
                        await self.cluster.nodes_manager.move_slot(rx.MovedError(target))
                    host, _, port = target.split(" ", 1)[1].rpartition(":")
                    pipe = await self._pipe_to(host, int(port))
                    asking = kind == "ASK"
                    continue
                if message.startswith(TRANSIENT):
                    raise Redirected(message) from exc
                raise
        raise Redirected(f"too many redirects for {key}")

    # -- the hot commands, retried -------------------------------------------------------

    async def publish(self, channel: str, message: bytes) -> int:
        """SPUBLISH: sharded pub/sub, heard on the channel's shard only."""
        if self._pipe_kwargs is None:
            return await self.call("SPUBLISH", lambda: self.cluster.spublish(channel, message))
        [heard] = await self.call(
            "SPUBLISH", lambda: self.on_key(channel, (b"SPUBLISH", channel, message))
        )
        return int(heard)

    async def get(self, key: str) -> bytes | str | None:
        if self._pipe_kwargs is None:
            return await self.call("GET", lambda: self.cluster.get(key))
        [value] = await self.call("GET", lambda: self.on_key(key, (b"GET", key)))
        return value  # type: ignore[no-any-return]

    async def set_px(self, key: str, value: str, ttl_ms: int) -> None:
        ttl = max(ttl_ms, 1)
        if self._pipe_kwargs is None:
            await self.call("SET", lambda: self.cluster.set(key, value, px=ttl))
            return
        await self.call("SET", lambda: self.on_key(key, (b"SET", key, value, b"PX", ttl)))

    async def delete(self, key: str) -> None:
        if self._pipe_kwargs is None:
            await self.call("DEL", lambda: self.cluster.delete(key))
            return
        await self.call("DEL", lambda: self.on_key(key, (b"DEL", key)))

    async def xadd(self, key: str, field: bytes, value: bytes) -> bytes | str:
        """XADD, then (when the slot has a replica) WAIT for one replica on the same
        connection: an acknowledged entry then survives its master being killed, whose
        replication is asynchronous otherwise. A replica that does not confirm within
        ``WAIT_TIMEOUT_MS`` is logged; the entry stands (it is on the master)."""
        if self._pipe_kwargs is None:
            return await self.call("XADD", lambda: self.cluster.xadd(key, {field: value}))
        add: tuple[Arg, ...] = (b"XADD", key, b"*", field, value)

        async def add_and_wait() -> list[Any]:
            await self.ready()
            if not self._has_replica(key):
                return await self.on_key(key, add)
            return await self.on_key(key, add, (b"WAIT", 1, WAIT_TIMEOUT_MS))

        replies = await self.call("XADD", add_and_wait)
        if len(replies) == 2 and not replies[1]:
            log.warning("inbox entry %s not confirmed by a replica in time", replies[0])
        entry: bytes = replies[0]
        return entry

    async def xreadgroup(
        self, stream: str, group: str, consumer: str, count: int, block_ms: int | None
    ) -> Any:
        """Sent to the stream's node: redis-py would otherwise ask a node for the keys of
        every XREADGROUP (``COMMAND GETKEYS``, its keys are not at a fixed position)."""
        await self.ready()
        args: list[Any] = ["XREADGROUP", "GROUP", group, consumer, "COUNT", count]
        if block_ms is not None:
            args += ["BLOCK", block_ms]
        args += ["STREAMS", stream, ">"]
        return await self.cluster.execute_command(*args, target_nodes=self.node_of(stream))

    def _has_replica(self, key: str) -> bool:
        nodes = self.cluster.nodes_manager.slots_cache.get(key_slot(key.encode()), [])
        return len(nodes) > 1

    async def close(self) -> None:
        self.closed = True
        for pipe in self._pipes.values():
            pipe.close()
        self._pipes.clear()
        await self.cluster.aclose()


def _failed(what: str, exc: Exception, sent: bool) -> Unavailable:
    """A refusal Redis answered; "may have been applied" when an earlier attempt of the
    same call failed after its command may have gone out."""
    error = Unavailable(f"Redis {what} failed: {exc}", command=what).said_as(REDIS_UNANSWERED)
    return error.unanswered() if sent else error
