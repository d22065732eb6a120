"""A small TCP proxy for fault tests: latency, drop, half-open, reset, pause.

It runs its own event loop in a thread, so it keeps forwarding while the test
blocks (``time.sleep``, subprocess waits) and whatever loop the code under test
uses. It listens on 127.0.0.1 only and forwards to one upstream on loopback.

Faults (all thread-safe, effective at once):

* :meth:`delay` — a constant latency per direction, without serialising
  chunks (each chunk is delivered ``seconds`` after it was read).
* :meth:`refuse` — drop: new connections are accepted and reset at once.
* :meth:`blackhole` — half-open: chosen connections stay open, but nothing
  more is forwarded either way and no FIN or RST is ever sent.
* :meth:`reset` — chosen connections are torn down with an RST on both sides.
* :meth:`pause` / :meth:`resume` — stop reading from the upstream side of
  chosen connections (a slow reader: the upstream's send buffer fills up).
* :meth:`hold_replies_after` — once a client chunk contains a marker (e.g. an
  idempotency key in a Postgres Bind message), hold that connection's replies
  for a while: the upstream acted, its answer arrives late.

Connections are chosen by a predicate over :class:`Link`, which records the
first bytes the client sent (e.g. ``b"SUBSCRIBE" in link.sent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")

SNIFF_BYTES = 64 * 1024
CHUNK = 64 * 1024


@dataclass(eq=False)
class Link:
    """One proxied connection: client <-> proxy <-> upstream."""

    n: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    sent: bytearray = field(default_factory=bytearray)  # first client bytes, for predicates
    blackholed: bool = False
    upstream_flowing: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False
    hold_until: float = 0.0


Pick = Callable[[Link], bool]


def _all(link: Link) -> bool:
    return True


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    """``with Proxy(port) as p: url = p.url_for(original_url)``."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        if upstream_host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the fault proxy only forwards to loopback")
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.links: list[Link] = []
        self.accepted = 0
        self._delay = {"up": 0.0, "down": 0.0}
        self._refuse = False
        self._blackhole_new = False
        self._hold: tuple[bytes, float, int] | None = None  # marker, seconds, times left
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._started = threading.Event()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> Proxy:
        self._thread.start()
        self._started.wait(10)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0, backlog=1024)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for link in list(self.links):
            self._close(link, rst=True)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = (userinfo + "@" if userinfo else "") + f"127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    # -- controls (any thread) -----------------------------------------------------------

    def _call(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        return self._submit(run())

    def _submit(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def delay(self, up: float = 0.0, down: float = 0.0) -> None:
        """Add latency: ``up`` client->upstream, ``down`` upstream->client (seconds)."""

        def set_() -> None:
            self._delay = {"up": up, "down": down}

        self._call(set_)

    def hold_replies_after(self, marker: bytes, seconds: float, times: int = 1) -> None:
        """The next ``times`` client chunks containing ``marker``: replies held ``seconds``."""

        def set_() -> None:
            self._hold = (marker, seconds, times)

        self._call(set_)

    def refuse(self, on: bool = True) -> None:
        """Drop: reset every new connection as soon as it is accepted."""

        def set_() -> None:
            self._refuse = on

        self._call(set_)

    def blackhole(self, pick: Pick = _all, *, new: bool = False) -> int:
        """Half-open the chosen live connections (and, with ``new``, every later one)."""

        def set_() -> int:
            self._blackhole_new = new
            hit = [link for link in self.links if not link.closed and pick(link)]
            for link in hit:
                link.blackholed = True
            return len(hit)

        return self._call(set_)

    def heal(self) -> None:
        """Forget every fault for connections made from now on, and unpause live ones.

        Half-open connections stay dead (as a real half-open connection would)."""

        def set_() -> None:
            self._delay = {"up": 0.0, "down": 0.0}
            self._refuse = False
            self._blackhole_new = False
            for link in self.links:
                link.upstream_flowing.set()

        self._call(set_)

    def reset(self, pick: Pick = _all) -> int:
        """Tear the chosen live connections down with an RST on both sides."""

        def set_() -> int:
            hit = [link for link in self.links if not link.closed and pick(link)]
            for link in hit:
                self._close(link, rst=True)
            return len(hit)

        return self._call(set_)

    def pause(self, pick: Pick = _all) -> int:
        """Stop reading what the upstream sends on the chosen connections."""

        def set_() -> int:
            hit = [link for link in self.links if not link.closed and pick(link)]
            for link in hit:
                link.upstream_flowing.clear()
            return len(hit)

        return self._call(set_)

    def resume(self) -> None:
        def set_() -> None:
            for link in self.links:
                link.upstream_flowing.set()

        self._call(set_)

    def live(self, pick: Pick = _all) -> int:
        return self._call(lambda: sum(1 for link in self.links if not link.closed and pick(link)))

    # -- forwarding -------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._refuse:
            _rst(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _rst(writer)
            return
        link = Link(n=self.accepted, client=writer, upstream=up_writer)
        link.blackholed = self._blackhole_new
        link.upstream_flowing.set()
        self.links.append(link)
        link.tasks = [
            asyncio.create_task(self._pump(link, reader, up_writer, "up")),
            asyncio.create_task(self._pump(link, up_reader, writer, "down")),
        ]

    async def _pump(
        self,
        link: Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: str,
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        sender = asyncio.create_task(self._send(link, queue, writer))
        try:
            while True:
                if direction == "down":
                    await link.upstream_flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                if direction == "down":
                    await link.upstream_flowing.wait()  # paused while this read was pending
                if direction == "up" and len(link.sent) < SNIFF_BYTES:
                    link.sent += data[: SNIFF_BYTES - len(link.sent)]
                if direction == "up" and self._hold is not None and self._hold[0] in data:
                    marker, seconds, times = self._hold
                    link.hold_until = time.monotonic() + seconds
                    self._hold = (marker, seconds, times - 1) if times > 1 else None
                if link.blackholed:
                    continue  # swallowed: the peer waits for an answer that never comes
                at = time.monotonic() + self._delay[direction]
                if direction == "down":
                    at = max(at, link.hold_until)
                queue.put_nowait((at, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await sender
            if link.blackholed:
                # half-open: never tell the other side; keep its socket open
                await asyncio.Event().wait()
            self._close(link, rst=False)

    async def _send(
        self,
        link: Link,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
    ) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            at, data = item
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if link.blackholed or link.closed:
                continue
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                return

    def _close(self, link: Link, *, rst: bool) -> None:
        if link.closed:
            return
        link.closed = True
        for writer in (link.client, link.upstream):
            if rst:
                _rst(writer)
            else:
                with contextlib.suppress(Exception):
                    writer.close()
        current = asyncio.current_task()
        for task in link.tasks:
            if task is not current:
                task.cancel()
