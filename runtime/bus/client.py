"""The Redis client the bus's parts share: every call retried, hot commands pipelined.

Every Redis call of the bus goes through :meth:`Client.call`, which retries
connection errors and timeouts with backoff, then raises
:class:`~signoff.runtime.errors.Unavailable`. ``PUBLISH``, ``GET``, ``SET`` and ``DEL``
(about eight per decision across the processes) go through one pipelined
connection per process (:mod:`signoff.runtime.bus.pipe`, design note 15); a TLS
client keeps redis-py for them.

The redis-py client must have ``decode_responses=False``; :func:`redis_from_url`
builds one on RESP2 with no retries of its own (redis-py 8 defaults to RESP3 and 10
retries, which would multiply with ours).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis import exceptions as rx
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from signoff.runtime.bus.pipe import Pipe, supported
from signoff.runtime.errors import ConfigError, InvalidInput, Unavailable
from signoff.runtime.metrics import COUNTERS

log = logging.getLogger("signoff.bus")

T = TypeVar("T")

# Waits between tries of one command: 4 tries in all, ~0.6 s before giving up.
RETRY_DELAYS = (0.05, 0.15, 0.4)

RETRYABLE = (rx.ConnectionError, rx.TimeoutError, ConnectionError, TimeoutError)
TIMEOUTS = (rx.TimeoutError, TimeoutError)
# A call that ran out the socket timeout met a Redis that stopped answering (stalled,
# paused, partitioned: not one that refuses connections). Trying it again would wait the
# timeout again, and so would every other call: a decision's three hints after its commit
# took ~65 s. Such a client is "stalled": its calls fail at once (Unavailable) but for one
# probe every STALL_PROBE_SECONDS, bounded by STALL_PROBE_TIMEOUT (plus a read's BLOCK);
# the first answer ends the stall (design note 42).
STALL_PROBE_SECONDS = 0.5
STALL_PROBE_TIMEOUT = 1.0


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def socket_timeout(client: aioredis.Redis) -> float | None:
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


# Pooled connections per process (the pub/sub and pipelined connections are one more each).
MAX_CONNECTIONS = 32
POOL_TIMEOUT = 5.0  # seconds a call waits for a pooled connection before it fails


def redis_from_url(
    url: str, *, max_connections: int = MAX_CONNECTIONS, pool_timeout: float = POOL_TIMEOUT
) -> aioredis.Redis:
    """A redis-py client on ``redis://``/``rediss://``/``unix://`` (hiredis parses when
    installed): RESP2 (redis-py 8 defaults to RESP3) and no retries (ours are in
    :meth:`Client.call`).

    Its pool is bounded: at most ``max_connections`` connections, and a call beyond them
    *waits* (up to ``pool_timeout`` seconds) for one to be released instead of opening
    another (redis-py's default pool is unbounded and never shrinks). A wait that runs
    out is a ``ConnectionError``: retried by :meth:`Client.call`, then ``Unavailable``."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max(max_connections, 1),
        timeout=pool_timeout,
        protocol=2,
        retry=Retry(NoBackoff(), 0),
    )
    return aioredis.Redis.from_pool(pool)


class Client:
    """A redis-py client plus the pipelined connection, with one retry policy for both."""

    redis: aioredis.Redis | RedisCluster

    def __init__(self, redis: aioredis.Redis) -> None:
        pool = redis.connection_pool
        if pool.connection_kwargs.get("decode_responses"):
            raise ConfigError("the Redis bus needs a client with decode_responses=False")
        self.redis = redis
        self.closed = False
        self.socket_timeout = socket_timeout(redis)
        # PUBLISH/GET/SET/DEL go through one pipelined connection; a TLS client keeps
        # redis-py for them.
        self._pipe_kwargs = pool.connection_kwargs if supported(pool.connection_class) else None
        self._pipe: Pipe | None = None
        self._pipe_lock = asyncio.Lock()
        self.stalled = False  # a call ran out the socket timeout; no answer since
        self._probing = False
        self._next_probe = 0.0

    # One server: plain pub/sub on one connection (a cluster client shards it).
    sharded = False

    async def node_name(self, channel: str) -> str:
        """The server a channel's subscription lives on ("": the one server)."""
        return ""

    def connection_spec(self, node: str) -> tuple[type[AbstractConnection], dict[str, Any]]:
        """The connection class and settings of a server, for a pub/sub connection."""
        assert isinstance(self.redis, aioredis.Redis)
        pool = self.redis.connection_pool
        return pool.connection_class, pool.connection_kwargs

    def suspect(self) -> None:
        """A connection failed in a way that may mean the topology changed (a cluster
        reloads its slot table before the next call; one server has nothing to reload)."""

    async def call(self, what: str, fn: Callable[[], Awaitable[T]], *, blocks: float = 0.0) -> T:
        """Run one Redis call; retry connection errors, then raise Unavailable. A call that
        timed out is not tried again: the client is stalled until Redis answers a probe
        (``blocks``: seconds the call may wait on the server by design, a read's BLOCK)."""
        if self.closed:
            raise Unavailable("the Redis bus is closed", command=what)
        if not self.stalled:
            return await self._tries(what, fn)
        now = time.monotonic()
        if self._probing or now < self._next_probe:
            raise Unavailable(f"Redis is not answering; {what} not sent", command=what)
        self._probing, self._next_probe = True, now + STALL_PROBE_SECONDS
        try:
            async with asyncio.timeout(STALL_PROBE_TIMEOUT + blocks):
                return await self._tries(what, fn)
        except TimeoutError as exc:
            raise Unavailable(f"Redis is not answering; {what} not sent", command=what) from exc
        finally:
            self._probing = False

    async def _tries(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        for attempt, delay in enumerate((*RETRY_DELAYS, None), start=1):
            try:
                result = await fn()
                self.stalled = False
                return result
            except TIMEOUTS as exc:
                if not self.stalled:
                    log.warning("Redis stopped answering (%s: %s); failing fast", what, exc)
                    self._next_probe = time.monotonic() + STALL_PROBE_SECONDS
                self.stalled = True
                COUNTERS.inc("signoff_redis_errors_total")
                raise Unavailable(f"Redis {what}: no answer ({exc})", command=what) from exc
            except RETRYABLE as exc:
                if delay is None or self.closed:
                    COUNTERS.inc("signoff_redis_errors_total")
                    raise Unavailable(
                        f"Redis {what} failed after {attempt} tries: {exc}", command=what
                    ) from exc
                log.debug("Redis %s failed (%s); retry %d", what, exc, attempt)
                COUNTERS.inc("signoff_redis_retries_total")
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            except rx.RedisError as exc:
                COUNTERS.inc("signoff_redis_errors_total")
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
                    pipe = self._pipe = await Pipe.open(self._pipe_kwargs, self.socket_timeout)
        return await pipe.call(*args)

    # -- the hot commands, retried -------------------------------------------------------

    async def publish(self, channel: str, message: bytes) -> int:
        """PUBLISH; the number of Redis subscribers (connections, not local listeners)."""
        if self._pipe_kwargs is None:
            return await self.call("PUBLISH", lambda: self.redis.publish(channel, message))
        heard: int = await self.call("PUBLISH", lambda: self._fast(b"PUBLISH", channel, message))
        return heard

    async def get(self, key: str) -> bytes | str | None:
        if self._pipe_kwargs is None:
            return await self.call("GET", lambda: self.redis.get(key))
        value: bytes | None = await self.call("GET", lambda: self._fast(b"GET", key))
        return value

    async def set_px(self, key: str, value: str, ttl_ms: int) -> None:
        """SET with an expiry (at least 1 ms)."""
        ttl = max(ttl_ms, 1)
        if self._pipe_kwargs is None:
            await self.call("SET", lambda: self.redis.set(key, value, px=ttl))
            return
        await self.call("SET", lambda: self._fast(b"SET", key, value, b"PX", ttl))

    async def delete(self, key: str) -> None:
        if self._pipe_kwargs is None:
            await self.call("DEL", lambda: self.redis.delete(key))
            return
        await self.call("DEL", lambda: self._fast(b"DEL", key))

    async def xadd(self, key: str, field: bytes, value: bytes) -> bytes | str:
        """XADD one entry with one field; its id."""
        entry: bytes | str = await self.call("XADD", lambda: self.redis.xadd(key, {field: value}))
        return entry

    async def xreadgroup(
        self, stream: str, group: str, consumer: str, count: int, block_ms: int | None
    ) -> Any:
        """XREADGROUP of new entries (``>``) on one stream (not retried: ``call`` does)."""
        return await self.redis.xreadgroup(
            group, consumer, {stream: ">"}, count=count, block=block_ms
        )

    async def close(self) -> None:
        """No more calls (retries in flight give up); close both connections and the pool."""
        self.closed = True
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        await self.redis.aclose()
