"""One pipelined Redis connection for the bus's hot commands (PUBLISH, GET, SET, DEL).

Every decision costs about seven of these across the processes. Through redis-py's
client one costs ~137 µs of CPU here (connection pool, retry and event layers);
written straight to the socket and parsed by hiredis, ~61 µs. Commands are written
as they come, without waiting for earlier replies, and one reader matches replies
to commands in order. Any trouble on the connection (a drop, a protocol error, a
command unanswered past the timeout: one watchdog per connection, no timer per
command) fails every command in flight with :class:`ConnectionError` or
:class:`TimeoutError`, which the bus's retry helper (``Client.call``) retries on a new
connection: a reply is never matched to the wrong command.

Plain TCP and Unix sockets, with AUTH and SELECT from the client's settings; a TLS
client keeps using redis-py (:class:`~signoff.runtime.bus.client.Client` checks
:func:`supported`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import hiredis
from redis import exceptions as rx
from redis.asyncio.connection import Connection, UnixDomainSocketConnection

Arg = bytes | str | int
# Error replies after which this connection is retired: the server cannot serve it now.
RETIRE = ("READONLY", "LOADING", "MASTERDOWN")


def supported(connection_class: type[Any]) -> bool:
    return connection_class in (Connection, UnixDomainSocketConnection)


def pack(args: tuple[Arg, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class Pipe:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float | None
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._timeout = timeout
        self._parser = hiredis.Reader(replyError=rx.ResponseError)
        self._pending: deque[asyncio.Future[Any]] = deque()
        self._sent: deque[float] = deque()  # when each pending command was written
        self._error: BaseException | None = None
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._read(), name="signoff-redis")
        # One watchdog per connection instead of a timer per command.
        self._watch: asyncio.TimerHandle | None = None
        if timeout is not None:
            self._watch = self._loop.call_later(timeout / 4, self._check)

    @classmethod
    async def open(cls, kwargs: dict[str, Any], timeout: float | None) -> Pipe:
        connect_timeout = kwargs.get("socket_connect_timeout") or timeout
        async with asyncio.timeout(connect_timeout):
            if kwargs.get("path"):
                reader, writer = await asyncio.open_unix_connection(kwargs["path"])
            else:
                host, port = kwargs.get("host", "localhost"), int(kwargs.get("port", 6379))
                reader, writer = await asyncio.open_connection(host, port)
        pipe = cls(reader, writer, timeout)
        try:
            if kwargs.get("password"):
                user = kwargs.get("username")
                await pipe.call(b"AUTH", *((user,) if user else ()), kwargs["password"])
            if int(kwargs.get("db") or 0):
                await pipe.call(b"SELECT", int(kwargs["db"]))
        except BaseException:
            pipe.close()
            raise
        return pipe

    @property
    def closed(self) -> bool:
        return self._error is not None

    async def call(self, *args: Arg) -> Any:
        if self._error is not None:
            raise ConnectionError(f"Redis connection closed: {self._error}")
        # Packed before its reply is awaited: an argument that cannot be encoded (a str with
        # a lone surrogate) raises here with nothing queued, so no reply is ever shifted
        # onto the next command.
        data = pack(args)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending.append(fut)
        self._sent.append(self._loop.time())
        self._writer.write(data)
        if self._writer.transport.get_write_buffer_size() > 1 << 20:
            await self._writer.drain()  # Redis is not keeping up: do not buffer without end
        return await fut

    async def call_many(self, *commands: tuple[Arg, ...]) -> list[Any]:
        """Several commands written back to back on this connection (``ASKING`` before a
        redirected command, ``WAIT`` after a write); every reply, or the first error."""
        if self._error is not None:
            raise ConnectionError(f"Redis connection closed: {self._error}")
        data = b"".join(pack(args) for args in commands)
        futures: list[asyncio.Future[Any]] = []
        now = self._loop.time()
        for _ in commands:
            fut: asyncio.Future[Any] = self._loop.create_future()
            futures.append(fut)
            self._pending.append(fut)
            self._sent.append(now)
        self._writer.write(data)
        results = await asyncio.gather(*futures, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    def _check(self) -> None:
        """The oldest command has waited past the timeout: its reply may still come, so
        nothing on this connection can be trusted now (every pending command fails)."""
        assert self._timeout is not None
        if self._error is not None:
            return
        if self._sent and self._loop.time() - self._sent[0] > self._timeout:
            self._fail(TimeoutError(f"no reply from Redis within {self._timeout}s"))
            return
        self._watch = self._loop.call_later(self._timeout / 4, self._check)

    async def _read(self) -> None:
        try:
            while True:
                data = await self._reader.read(1 << 16)
                if not data:
                    raise ConnectionError("Redis closed the connection")
                self._parser.feed(data)
                while (reply := self._parser.gets()) is not False:
                    if not self._pending:
                        raise rx.InvalidResponse("a reply nobody asked for")
                    fut = self._pending.popleft()
                    self._sent.popleft()
                    if isinstance(reply, rx.ResponseError) and str(reply).startswith(RETIRE):
                        # A replica, a server loading its data set or one that lost its
                        # primary: nothing more should be sent here. This command and every
                        # other in flight fail as on a dropped connection (the bus retries
                        # them on a new one).
                        error = ConnectionError(f"Redis answered {reply}")
                        if not fut.done():
                            fut.set_exception(error)
                        raise error
                    if fut.done():  # its caller gave up (cancelled)
                        continue
                    if isinstance(reply, rx.ResponseError):
                        fut.set_exception(reply)
                    else:
                        fut.set_result(reply)
        except asyncio.CancelledError:
            self._fail(ConnectionError("Redis connection closed"))
            raise
        except Exception as exc:
            self._fail(exc if isinstance(exc, ConnectionError) else ConnectionError(str(exc)))

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._watch is not None:
            self._watch.cancel()
        self._sent.clear()
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(type(error)(str(error)))

    def close(self) -> None:
        self._fail(ConnectionError("closed"))
        self._task.cancel()
