"""WebSocket ``/v1/ws``: chat, live thread events, decisions.

Origin is checked against an allow-list before ``accept()`` (Starlette's CORS
middleware does not cover WebSockets). The first frame must authenticate, and
every later frame is authorised again with the same token (it may expire).
Events are read from Postgres after the client's last ``seq``; bus hints only
say when to look.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.auth import Principal, Tokens
from gateway.errors import error_body, status_of
from gateway.feed import Feeds
from gateway.service import GatewayService, ResolveIn, event_of, parse
from runtime.errors import (
    InvalidInput,
    OriginRejected,
    RateLimited,
    SignoffError,
    Unauthenticated,
)
from runtime.hints import Hint, WireEntry

log = logging.getLogger("signoff.ws")

AUTH_TIMEOUT = 10.0


class Frame(msgspec.Struct, frozen=True):
    type: str
    id: str | None = None
    token: str | None = None
    thread_id: str | None = None
    text: str | None = None
    after_seq: int | None = None
    card_id: str | None = None
    decision: str | None = None
    snapshot_hash: str | None = None
    reason: str | None = None
    edits: dict[str, Any] | None = None


class _FrameId(msgspec.Struct):
    id: str | None = None


_enc = msgspec.json.Encoder()
_frame = msgspec.json.Decoder(Frame)
_frame_id = msgspec.json.Decoder(_FrameId)
# What a frame that does not parse raises: msgspec's errors, and RecursionError on deep nesting.
_BAD_FRAME = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


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


class Connection:
    def __init__(
        self,
        ws: WebSocket,
        service: GatewayService,
        feeds: Feeds,
        tokens: Tokens,
        max_bytes: int,
        limit: RateLimit | None = None,
    ) -> None:
        self.ws = ws
        self.service = service
        self.feeds = feeds
        self.tokens = tokens
        self.max_bytes = max_bytes
        self.limit = limit or RateLimit(0, 1)
        self.token = ""
        self.who: Principal | None = None
        self._send_lock = asyncio.Lock()
        self._last_seq: dict[str, int] = {}
        self._last_assistant: dict[str, int] = {}
        self._catchup: dict[str, asyncio.Lock] = {}
        self._listeners: dict[str, Any] = {}

    async def send(self, payload: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_text(_enc.encode(payload).decode())

    async def send_error(self, exc: SignoffError, frame_id: str | None = None) -> None:
        await self.send(
            {"type": "error", "id": frame_id, "status": status_of(exc), **error_body(exc)}
        )

    async def receive(self) -> bytes:
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        data = message.get("bytes") or (message.get("text") or "").encode()
        if len(data) > self.max_bytes:
            await self.ws.close(code=1009, reason="message too big")
            raise WebSocketDisconnect(1009)
        return bytes(data)

    def authorise(self) -> Principal:
        """Every frame: the token must still verify (it may have expired since the handshake)."""
        return self.tokens.verify(self.token)

    async def run(self) -> None:
        try:
            raw = await asyncio.wait_for(self.receive(), AUTH_TIMEOUT)
            frame = _frame.decode(raw)
            if frame.type != "auth":
                raise Unauthenticated("the first frame must be {type: auth, token}")
            self.token = frame.token or ""
            self.who = self.authorise()
        except (TimeoutError, *_BAD_FRAME):
            await self.send_error(Unauthenticated("authenticate first"))
            await self.ws.close(code=4401)
            return
        except Unauthenticated as exc:
            await self.send_error(exc)
            await self.ws.close(code=4401)
            return
        await self.send({"type": "ready", "user": self.who.user, "tenant": self.who.tenant})
        try:
            while True:
                raw = await self.receive()
                if self.limit.take():
                    await self.handle(raw)
                else:
                    await self.refuse(raw)
        except WebSocketDisconnect:
            pass
        finally:
            for thread_id, listener in self._listeners.items():
                self.feeds.remove(thread_id, listener)

    async def refuse(self, raw: bytes) -> None:
        """Over the rate: a 429 error frame, nothing done. A client that keeps sending a
        burst's worth of frames into refusals is flooding: it is disconnected (1008)."""
        if self.limit.refused > self.limit.burst:
            log.info("closing a flooding WebSocket of %s", self.who.user if self.who else "?")
            await self.ws.close(code=1008, reason="rate limit exceeded")
            raise WebSocketDisconnect(1008)
        try:
            frame_id = _frame_id.decode(raw).id
        except _BAD_FRAME:
            frame_id = None
        await self.send_error(
            RateLimited(f"more than {self.limit.rate:g} frames a second; slow down"), frame_id
        )

    async def handle(self, raw: bytes) -> None:
        frame_id = None
        try:
            try:
                frame = _frame.decode(raw)
            except _BAD_FRAME as exc:
                raise InvalidInput(f"invalid frame: {exc}") from exc
            frame_id = frame.id
            who = self.authorise()
            if frame.type == "message":
                await self.on_message(frame, who)
            elif frame.type == "resume":
                await self.on_resume(frame, who)
            elif frame.type == "resolve":
                await self.on_resolve(frame, who)
            elif frame.type == "auth":
                self.token = frame.token or ""
                self.who = self.authorise()
                await self.send({"type": "ready", "id": frame_id, "user": self.who.user})
            else:
                raise InvalidInput(f"unknown frame type {frame.type!r}")
        except Unauthenticated as exc:
            await self.send_error(exc, frame_id)
            await self.ws.close(code=4401)
            raise WebSocketDisconnect(4401) from exc
        except SignoffError as exc:
            await self.send_error(exc, frame_id)

    async def on_message(self, frame: Frame, who: Principal) -> None:
        if frame.text is None:
            raise InvalidInput("a message needs text")
        if frame.thread_id is None:
            thread = await self.service.create_thread(who)
            thread_id = thread.id
            await self.follow(thread_id, 0)
        else:
            thread_id = frame.thread_id
            await self.service.own_thread(thread_id, who)
            if thread_id not in self._listeners:
                thread = await self.service.store.get_thread(thread_id)
                await self.follow(thread_id, thread.last_seq)
        delivery = await self.service.post_message(thread_id, frame.text, who, "ws")
        await self.send(
            {"type": "ack", "id": frame.id, "thread_id": thread_id, "delivery": delivery}
        )

    async def on_resume(self, frame: Frame, who: Principal) -> None:
        if frame.thread_id is None:
            raise InvalidInput("resume needs thread_id")
        state = await self.service.thread_state(frame.thread_id, who)
        await self.send(
            {"type": "ack", "id": frame.id, "thread_id": frame.thread_id, "state": state}
        )
        await self.follow(frame.thread_id, max(frame.after_seq or 0, 0))

    async def on_resolve(self, frame: Frame, who: Principal) -> None:
        if frame.card_id is None:
            raise InvalidInput("resolve needs card_id")
        body: ResolveIn = parse(
            {
                k: v
                for k, v in {
                    "decision": frame.decision,
                    "snapshot_hash": frame.snapshot_hash,
                    "reason": frame.reason,
                    "edits": frame.edits,
                }.items()
                if v is not None
            },
            ResolveIn,
        )
        outcome = await self.service.resolve(frame.card_id, body, who, "ws")
        await self.send({"type": "resolved", "id": frame.id, **msgspec.to_builtins(outcome)})

    async def follow(self, thread_id: str, after_seq: int) -> None:
        """Send the log after ``after_seq``, then every new entry, in order, once."""
        self._last_seq[thread_id] = after_seq
        self._catchup.setdefault(thread_id, asyncio.Lock())
        if thread_id not in self._listeners:

            async def listener(hint: Hint, _t: str = thread_id) -> None:
                if hint.delta:
                    if hint.seq < self._last_assistant.get(_t, -1):
                        return  # its assistant entry was already delivered: stale delta
                    await self.send(
                        {
                            "type": "delta",
                            "thread_id": _t,
                            "run_id": hint.run_id,
                            "after_seq": hint.seq,
                            "text": hint.delta,
                        }
                    )
                elif not (hint.entries and await self.deliver(_t, hint.entries)):
                    await self.catch_up(_t)

            self._listeners[thread_id] = listener
            await self.feeds.add(thread_id, listener)
        await self.catch_up(thread_id)

    async def deliver(self, thread_id: str, entries: list[WireEntry]) -> bool:
        """Send the entries a hint carried, if they follow what this socket got; False on a
        gap (the caller re-reads the log then)."""
        async with self._catchup[thread_id]:
            last = self._last_seq.get(thread_id, 0)
            fresh = [e for e in entries if e.seq > last]
            if fresh and fresh[0].seq != last + 1:
                return False
            for e in fresh:
                await self.send(
                    {
                        "type": "event",
                        "thread_id": thread_id,
                        "seq": e.seq,
                        "kind": e.kind,
                        "run_id": e.run_id,
                        "data": e.data,
                        "at": e.at,
                    }
                )
                self._last_seq[thread_id] = e.seq
                if e.kind == "assistant":
                    self._last_assistant[thread_id] = e.seq
            return True

    async def catch_up(self, thread_id: str) -> None:
        async with self._catchup[thread_id]:
            while True:
                after = self._last_seq.get(thread_id, 0)
                entries = await self.service.store.entries_after(thread_id, after, 500)
                for entry in entries:
                    await self.send({"type": "event", **event_of(entry)})
                    self._last_seq[thread_id] = entry.seq
                    if entry.kind == "assistant":
                        self._last_assistant[thread_id] = entry.seq
                if len(entries) < 500:
                    return


async def websocket_endpoint(
    ws: WebSocket,
    *,
    service: GatewayService,
    feeds: Feeds,
    tokens: Tokens,
    allowed_origins: tuple[str, ...],
    max_bytes: int,
    rate: float = 0.0,
    burst: int = 1,
) -> None:
    """``rate``/``burst``: frames a second per socket past the first (0: no limit)."""
    origin = ws.headers.get("origin")
    if not origin_allowed(origin, ws.headers.get("host"), allowed_origins):
        log.info("rejected WebSocket from origin %r", origin)
        with contextlib.suppress(Exception):
            await ws.close(code=1008, reason=OriginRejected.code)
        return
    await ws.accept()
    await Connection(ws, service, feeds, tokens, max_bytes, RateLimit(rate, burst)).run()
