"""uvicorn's WebSocket protocol as the gateway serves it (``SIGNOFF_WS_PROTOCOL``).

The gateway turns some handshakes away with a typed JSON answer (an origin not allowed,
a path with no WebSocket: ``gateway.ws.deny``, the ASGI denial-response extension).
uvicorn 0.54's ``websockets-sansio`` protocol sends that answer but does not count the
handshake as done, so each denial also logged ``ERROR ASGI callable returned without
completing handshake`` (an unauthenticated client could fill the log with them);
:class:`SansIOProtocol` counts it. ``wsproto`` already does.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from signoff.gateway.timeouts import http_protocol
from signoff.runtime.config import Settings


class SansIOProtocol(WebSocketsSansIOProtocol):
    """The websockets library's sans-I/O protocol; a denial response ends the handshake."""

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True


def ws_protocol(name: str) -> str | type[asyncio.Protocol]:
    """The ``ws=`` of ``uvicorn.Config`` for ``SIGNOFF_WS_PROTOCOL``."""
    return SansIOProtocol if name == "websockets-sansio" else name


def protocols(settings: Settings) -> dict[str, Any]:
    """``http=`` and ``ws=`` of ``uvicorn.Config`` for these settings (h11 with deadlines,
    ``gateway/timeouts.py``; the WebSocket protocol above)."""
    return {"http": http_protocol(settings), "ws": ws_protocol(settings.ws_protocol)}
