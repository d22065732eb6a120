"""A minimal HTTP/1.1 keep-alive client for load generation (bench only).

httpx costs ~1.6 ms of CPU per request here, more than the gateway's own work on a
deliver_event; on 2 shared cores the load generator would then eat the CPU the system
under test needs. This sends ``POST`` requests with a JSON body over a pool of persistent
connections and reads ``Content-Length`` responses (what the gateway sends), nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer


class RawClient:
    def __init__(self, base_url: str, headers: dict[str, str], size: int = 16) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.size = size
        self.idle: asyncio.Queue[Conn] = asyncio.Queue()
        self.opened = 0

    async def _get(self) -> Conn:
        if self.idle.empty() and self.opened < self.size:
            self.opened += 1
            reader, writer = await asyncio.open_connection(self.host, self.port)
            return Conn(reader, writer)
        return await self.idle.get()

    async def post(self, path: str, body: Any) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        conn = await self._get()
        try:
            conn.writer.write(
                (
                    f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.extra}"
                    f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                ).encode()
                + data
            )
            head = await conn.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            payload = await conn.reader.readexactly(length) if length else b""
        except BaseException:
            self.opened -= 1
            conn.writer.close()
            raise
        self.idle.put_nowait(conn)
        return status, payload

    async def close(self) -> None:
        while not self.idle.empty():
            conn = self.idle.get_nowait()
            conn.writer.close()
            with contextlib.suppress(Exception):
                await conn.writer.wait_closed()
