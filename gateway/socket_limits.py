"""What a WebSocket may send: its frames' rate, the origins it may come from, and how a
handshake is turned away."""

from __future__ import annotations

import contextlib
import time

import msgspec
from starlette.responses import Response
from starlette.websockets import WebSocket


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
