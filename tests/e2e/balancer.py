"""A round-robin TCP balancer for tests: what a load balancer in front of gateways does.

It runs its own event loop in a thread and listens on 127.0.0.1. Each new connection goes
to the next upstream that accepts it: an upstream that refuses (a stopped gateway has
closed its listening socket) is skipped, so a client reconnecting to the same URL lands
on a gateway that is still up. ``counts`` records where connections went.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter

CHUNK = 64 * 1024


class Balancer:
    def __init__(self, upstream_ports: list[int]) -> None:
        self.upstreams = list(upstream_ports)
        self.port = 0
        self.counts: Counter[int] = Counter()
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="balancer", daemon=True)
        self._started = threading.Event()
        self._server: asyncio.Server | None = None

    def __enter__(self) -> Balancer:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _connect(self) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter] | None:
        start, n = self._next, len(self.upstreams)
        self._next += 1
        for k in range(n):  # each upstream once, from the next in turn
            port = self.upstreams[(start + k) % n]
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            return port, reader, writer
        return None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        found = await self._connect()
        if found is None:
            writer.close()
            return
        port, up_reader, up_writer = found
        self.counts[port] += 1

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(CHUNK):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
