"""What a WebSocket may send: its frames' rate, how many may wait to be handled, the
origins it may come from, and how a handshake is turned away."""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
from starlette.responses import Response
from starlette.websockets import WebSocket

# Read ahead of the frame being handled, at most this many frames and bytes; past that the
# socket is closed (1013: try again later). Blocked on a full queue the reader answered no
# ping (a review), and 64 frames of 64 KB held 4 MB per socket; a frame refused alone
# (503) let a later one be handled before it was sent again (a second review).
QUEUED_FRAMES = 64
QUEUED_BYTES = 256 * 1024


class ReadAhead:
    """The frames a socket's reader has read and its handler not yet taken, bounded."""

    def __init__(self, frames: int = QUEUED_FRAMES, most_bytes: int = QUEUED_BYTES) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.frames, self.most_bytes = frames, most_bytes
        self.bytes = 0

    def offer(self, raw: bytes) -> bool:
        """Queue the frame, unless that would pass either bound (then False). A frame
        finding the queue empty is taken whatever its size (the socket's own frame limit
        may be set above this bound)."""
        full = self._queue.qsize() >= self.frames or self.bytes + len(raw) > self.most_bytes
        if full and not self._queue.empty():
            return False
        self.bytes += len(raw)
        self._queue.put_nowait(raw)
        return True

    def end(self) -> None:
        """No more frames: the handler stops after those queued."""
        self._queue.put_nowait(None)

    async def next(self) -> bytes | None:
        raw = await self._queue.get()
        if raw is not None:
            self.bytes -= len(raw)
        return raw


class RateLimit:
    """A token bucket per socket: ``rate`` frames a second, ``burst`` at once (0: no limit)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(burst, 1)
        self.tokens = float(self.burst)
        self.at = time.monotonic()
        self.refused = 0  # frames refused since the last one let through

    def take(self) -> bool:
        if self.rate <= 0:
            return True
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            self.refused = 0
            return True
        self.refused += 1
        return False


def origin_allowed(origin: str | None, host: str | None, allowed: tuple[str, ...]) -> bool:
    """Browsers always send Origin on WebSockets; non-browser clients may omit it."""
    if origin is None:
        return True
    if origin in allowed:
        return True
    if host and origin in (f"http://{host}", f"https://{host}"):
        return True
    return False


async def deny(ws: WebSocket, status: int, code: str, message: str) -> None:
    """Turn a WebSocket handshake away with a typed JSON answer (``{error, message}``),
    where the server speaks the ASGI denial-response extension; else a bare close (the
    client sees a 403)."""
    with contextlib.suppress(Exception):
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            body = msgspec.json.encode({"error": code, "message": message})
            await ws.send_denial_response(
                Response(body, status_code=status, media_type="application/json")
            )
        else:
            await ws.close(code=1008, reason=code)
