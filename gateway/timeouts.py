"""Deadlines for slow HTTP clients: uvicorn's h11 protocol with a header and a body timer.

uvicorn (0.54, h11) has no header or body timeout: ``timeout_keep_alive`` only runs
between requests and any byte received cancels it, so a client that sends a request's
headers a byte at a time (slowloris), or its body, holds a connection and its buffers for
as long as it likes. :func:`http_protocol` gives uvicorn's own protocol two deadlines:

- **headers**: a request's header block must be complete ``header_timeout`` seconds after
  the connection opened (its first request) or after the first byte of a later request
  (an idle kept-alive connection stays governed by ``timeout_keep_alive``). Past it the
  client gets a ``408`` (JSON ``{error: request_timeout}``) when it had sent part of a
  request, and the connection is closed either way.
- **body**: the body must be complete ``body_timeout`` seconds after the headers, plus
  :data:`BODY_GRACE` so that a handler reading it (``gateway/http.py`` ``HttpApi.body``,
  bound by the same setting) answers its typed 408 first; this cut catches bodies no
  handler reads. A WebSocket upgrade leaves both timers behind.

It also answers what h11 cannot parse (a malformed chunk, two ``Content-Length``s, a
header block over h11's limit, a NUL in a header) with a typed JSON ``400``
(``{error: bad_request}``; uvicorn's is text/plain) and closes the connection; a
request whose handler was already running is told its client is gone, so the handler
ends quietly instead of logging a traceback for a response it can no longer send.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from signoff.runtime.config import Settings

log = logging.getLogger("signoff.timeouts")

BODY_GRACE = 1.0


def _closing(status: bytes, body: bytes) -> bytes:
    """A whole JSON answer written straight to the socket, the connection then closed."""
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


RESPONSE_408 = _closing(
    b"408 Request Timeout",
    b'{"error":"request_timeout","message":"request headers not received in time"}',
)
RESPONSE_400 = _closing(
    b"400 Bad Request", b'{"error":"bad_request","message":"not a valid HTTP/1.1 request"}'
)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines above (0: none)."""

    header_timeout: float = 10.0
    body_timeout: float = 15.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for = ""  # "headers" or "body" while a deadline runs
        self._partial = False  # bytes of a request whose headers are not complete yet
        self._upgraded = False

    # -- uvicorn's protocol interface -------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers", self.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and not self._upgraded:
            self._partial = True
            if self._deadline is None:  # the first byte of a request after a kept-alive idle
                self._arm("headers", self.header_timeout)
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        self._follow()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._upgraded = True
        self._disarm()
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """h11 could not parse the client's bytes: a typed 400 unless an answer was
        already begun, and the connection closed; a handler in flight sees a client gone."""
        self._disarm()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # its send() is a no-op, its receive() a disconnect
            self.cycle.message_event.set()
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # no answer begun
            self.transport.write(RESPONSE_400)
        self.transport.close()

    # -- the deadlines ----------------------------------------------------------------

    def _follow(self) -> None:
        """Move the deadline along with the client's side of the request."""
        if self._upgraded:
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            return  # headers not complete (the header deadline runs), or idle between requests
        self._partial = False
        if state is h11.SEND_BODY:
            if self._waiting_for != "body":
                self._arm("body", self.body_timeout + BODY_GRACE if self.body_timeout else 0)
        else:
            self._disarm()  # the request is read (DONE, MUST_CLOSE, ...)

    def _arm(self, what: str, seconds: float) -> None:
        self._disarm()
        if seconds > 0:
            self._waiting_for = what
            self._deadline = self.loop.call_later(seconds, self._expired, what, seconds)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting_for = ""

    def _expired(self, what: str, seconds: float) -> None:
        self._deadline = None
        self._waiting_for = ""
        if self.transport.is_closing() or self._upgraded:
            return
        log.info(
            "closing a connection from %s: request %s not received within %gs",
            self.client,
            what,
            seconds,
        )
        if what == "headers" and self._partial:
            self.transport.write(RESPONSE_408)
        elif what == "body" and self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            # No answer begun (no handler reads this body, or the one that does is late
            # with its own 408 on a loaded loop): the client is told why all the same.
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True  # its send() is a no-op from now on
                self.cycle.message_event.set()
            self.transport.write(RESPONSE_408)
        self.transport.close()


def http_protocol(settings: Settings) -> type[TimedH11Protocol]:
    """The ``http=`` protocol class for ``uvicorn.Config`` with these settings' deadlines."""

    class Configured(TimedH11Protocol):
        header_timeout = settings.header_timeout_seconds
        body_timeout = settings.body_timeout_seconds

    return Configured
