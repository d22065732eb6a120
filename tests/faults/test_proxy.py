"""The fault proxy is test code other tests trust: check each fault against an echo server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.faults.proxy import Proxy

pytestmark = [pytest.mark.anyio, pytest.mark.no_store]


@pytest.fixture
async def echo() -> AsyncIterator[int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def roundtrip(port: int, payload: bytes = b"ping", timeout: float = 2.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), timeout)
    finally:
        writer.close()


async def test_forwards_delays_refuses_and_heals(echo: int) -> None:
    with Proxy(echo) as p:
        assert p.url_for("redis://u:pw@127.0.0.1:6379/0") == f"redis://u:pw@127.0.0.1:{p.port}/0"
        assert await roundtrip(p.port) == b"ping"
        p.delay(up=0.1, down=0.1)
        t0 = time.monotonic()
        assert await roundtrip(p.port) == b"ping"
        assert time.monotonic() - t0 >= 0.2
        p.refuse()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await roundtrip(p.port)
        p.heal()
        assert await roundtrip(p.port) == b"ping"


async def test_blackhole_reset_pause_and_held_replies(echo: int) -> None:
    with Proxy(echo) as p:
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(b"hello")
        assert await reader.readexactly(5) == b"hello"
        assert p.blackhole(lambda link: b"hello" in link.sent) == 1
        writer.write(b"again")
        with pytest.raises(TimeoutError):  # half-open: no answer, no FIN, no RST
            await asyncio.wait_for(reader.read(1), 0.5)
        assert not reader.at_eof()
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(b"x")
        await reader.readexactly(1)
        assert p.reset() >= 1
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            writer.write(b"y")
            await writer.drain()
            await asyncio.wait_for(reader.readexactly(1), 1)
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(b"a")
        await reader.readexactly(1)
        p.pause()
        writer.write(b"b")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(1), 0.3)
        p.resume()
        assert await asyncio.wait_for(reader.readexactly(1), 1) == b"b"
        p.hold_replies_after(b"KEY", 0.4)
        t0 = time.monotonic()
        writer.write(b"KEY")
        assert await asyncio.wait_for(reader.readexactly(3), 2) == b"KEY"
        assert time.monotonic() - t0 >= 0.4
        t0 = time.monotonic()
        writer.write(b"KEY")  # only once
        await asyncio.wait_for(reader.readexactly(3), 2)
        assert time.monotonic() - t0 < 0.3
        writer.close()
