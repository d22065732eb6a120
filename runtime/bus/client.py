"""The Redis client the bus's parts share: every call retried, hot commands pipelined.

Every Redis call of the bus goes through :meth:`Client.call`, which retries
connection errors with backoff (once an outage is known, one try a call: design note
63) and fails fast on a Redis that stopped answering (note 42), raising
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

# OSError: what a connection attempt raises besides ConnectionError (a name that does
# not resolve, no route to the host), retried like a refused connection.
RETRYABLE = (rx.ConnectionError, rx.TimeoutError, ConnectionError, TimeoutError, OSError)
TIMEOUTS = (rx.TimeoutError, TimeoutError)
# A call that ran out the socket timeout met a Redis that stopped answering (stalled,
# paused, partitioned: not one that refuses connections). Trying it again would wait the
# timeout again, and so would every other call: a decision's three hints after its commit
# took ~65 s. Such a client is "stalled": the calls in flight are cut short and new ones
# fail at once (Unavailable), but for one probe every STALL_PROBE_SECONDS (an ordinary
# call, with an ordinary call's timeouts); the first answer ends the stall (design note 42).
# A Redis that refuses connections (down, restarting) is retried (~0.6 s); once a call
# failed after all its tries the client is "failing", and each call gets one try, no
# retries, until one is answered (design note 63): a refused connection fails in well
# under a millisecond, so a decision's three hints in an outage cost it one call's tries,
# not three, and the first call after Redis is back goes through.
STALL_PROBE_SECONDS = 0.5
# What a client is told of a Redis error (the driver's words name hosts and ports: logged).
REDIS_UNANSWERED = "Redis did not answer; try again"


def _before_sending(exc: BaseException) -> bool:
    """A failure before the command left this process: the connection was refused or
    could not be made (redis-py says "... connecting to host:port"), so nothing of the
    command can have been applied. Anything else (a reset, a read that failed) may have
    followed it out."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    return isinstance(exc, rx.ConnectionError) and " connecting to " in str(exc)


def _not_answering(what: str) -> Unavailable:
    return Unavailable(f"Redis is not answering; {what} not sent", command=what)


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
        self.failing = False  # a call failed after its retries (refused, dropped) since
        self._probing = False
        self._next_probe = 0.0
        self._calls: set[asyncio.Task[Any]] = set()  # tasks inside call() now
        self._cut: set[asyncio.Task[Any]] = set()  # of those, cancelled by a stall

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

    async def call(self, what: str, fn: Callable[[], Awaitable[T]], *, blocking: bool = False) -> T:
        """Run one Redis call; retry connection errors, then raise Unavailable. A call that
        timed out is not tried again: the client is stalled until Redis answers a probe,
        and the calls in flight then are cut short (``blocking``: a read that waits on the
        server by design, its BLOCK, is never the probe)."""
        if self.closed:
            raise Unavailable("the Redis bus is closed", command=what)
        probe = False
        if self.stalled:
            now = time.monotonic()
            if blocking or self._probing or now < self._next_probe:
                raise _not_answering(what)
            self._probing, self._next_probe, probe = True, now + STALL_PROBE_SECONDS, True
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        try:
            return await self._tries(what, fn, probe)
        except asyncio.CancelledError:
            if task not in self._cut:
                raise  # its caller's cancellation
            self._cut.discard(task)
            task.uncancel()
            raise Unavailable(  # it was in flight: it may have been applied
                f"Redis is not answering; {what} cut short", command=what
            ).unanswered() from None
        finally:
            self._calls.discard(task)
            if probe:
                self._probing = False

    def _stall(self, what: str, exc: BaseException) -> None:
        """Redis stopped answering: fail fast from now on, and cut short every other call in
        flight (each would wait out its own timeout: calls queued for one of redis-py's
        pooled connections, one wave of timeouts after another)."""
        if not self.stalled:
            log.warning("Redis stopped answering (%s: %s); failing fast", what, exc)
            self._next_probe = time.monotonic() + STALL_PROBE_SECONDS
        self.stalled = True
        me = asyncio.current_task()
        for task in self._calls:
            if task is not me and task not in self._cut:
                self._cut.add(task)
                task.cancel()

    def _fail(self, what: str, exc: BaseException) -> None:
        """A call failed after all its tries (refused, reset): from now on each call gets
        one try, no retries, until one is answered (the calls in flight stop at their next
        failure: each would sleep through its own retries against the same refusal)."""
        if not self.failing and not self.closed:
            log.warning("Redis refused %s after its retries (%s); one try per call", what, exc)
        self.failing = True

    async def _tries(self, what: str, fn: Callable[[], Awaitable[T]], probe: bool) -> T:
        # Once an attempt failed in a way that may have followed its command out (a
        # connection lost, a reset), whatever ends the call later says "may have been
        # applied": a retry refused, or never sent, does not undo the first.
        sent = False

        def said(exc: Unavailable) -> Unavailable:
            return exc.unanswered() if sent else exc

        for attempt, delay in enumerate((*RETRY_DELAYS, None), start=1):
            if self.stalled and not probe:
                raise said(_not_answering(what))
            try:
                result = await fn()
                if self.stalled or self.failing:  # an operator reads the outage's end too
                    log.warning("Redis answers again (%s)", what)
                self.stalled = self.failing = False
                return result
            except TIMEOUTS as exc:
                self._stall(what, exc)
                COUNTERS.inc("signoff_redis_errors_total")
                raise (
                    Unavailable(f"Redis {what}: no answer ({exc})", command=what)
                    .said_as(REDIS_UNANSWERED)
                    .unanswered()
                ) from exc
            except RETRYABLE as exc:
                sent = sent or not _before_sending(exc)
                if delay is None or self.closed or self.failing:
                    self._fail(what, exc)
                    COUNTERS.inc("signoff_redis_errors_total")
                    raise said(
                        Unavailable(
                            f"Redis {what} failed after {attempt} tries: {exc}", command=what
                        ).said_as(REDIS_UNANSWERED)
                    ) from exc
                log.debug("Redis %s failed (%s); retry %d", what, exc, attempt)
                COUNTERS.inc("signoff_redis_retries_total")
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            except rx.RedisError as exc:
                COUNTERS.inc("signoff_redis_errors_total")
                raise said(
                    Unavailable(f"Redis {what} failed: {exc}", command=what).said_as(
                        REDIS_UNANSWERED
                    )
                ) from exc
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
