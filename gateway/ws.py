"""WebSocket ``/v1/ws``: chat, live thread events, decisions.

Origin is checked against an allow-list before ``accept()`` (Starlette's CORS
middleware does not cover WebSockets). The first frame must authenticate, and
every later frame is authorised again with the same token; when the token expires the
socket closes with 4401 (a timer), and another ``auth`` frame re-checks every subscription.
A thread hint carries the log entries just committed (design note 2): a socket is sent
those that follow the last ``seq`` it got; on a gap, or for a hint without entries, the
log is re-read from Postgres after that ``seq``. Postgres stays the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from signoff.gateway.auth import Principal, Tokens
from signoff.gateway.errors import Internal, error_body, status_of, typed
from signoff.gateway.feed import Feeds, Listener
from signoff.gateway.frames import Frame, decode_frame, id_of
from signoff.gateway.service import GatewayService, ResolveIn, checked_message, event_of, parse
from signoff.gateway.socket_limits import RateLimit, ReadAhead, deny, origin_allowed
from signoff.gateway.watch import ThreadWatch
from signoff.runtime.errors import (
    InvalidInput,
    MaybeQueued,
    OriginRejected,
    RateLimited,
    SignoffError,
    Unauthenticated,
)
from signoff.runtime.hints import Hint, WireEntry

log = logging.getLogger("signoff.ws")

AUTH_TIMEOUT = 10.0


_enc = msgspec.json.Encoder()


class Connection:
    """One authenticated socket. Total: every frame gets its answer or a typed error frame
    and the socket stays open, except for 4401 (the token is bad or has expired), 1008
    (flooding) and 1009 (a frame too big)."""

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
        self._listeners: dict[str, Listener] = {}
        self._expiry: asyncio.Task[None] | None = None
        self.watch = ThreadWatch(feeds, service, self.send)  # the thread list, live

    async def send(self, payload: dict[str, Any]) -> None:
        async with self._send_lock:
            try:
                await self.ws.send_text(_enc.encode(payload).decode())
            except WebSocketDisconnected as exc:  # already closed, by us or by the client
                raise WebSocketDisconnect(1006) from exc

    async def send_error(self, exc: SignoffError, frame_id: str | None = None) -> None:
        await self.send(
            {"type": "error", "id": frame_id, "status": status_of(exc), **error_body(exc)}
        )

    async def close(self, code: int, reason: str | None = None) -> None:
        """Close the socket; one already closed (by either side) is left as it is."""
        async with self._send_lock:
            with contextlib.suppress(WebSocketDisconnect, WebSocketDisconnected):
                await self.ws.close(code=code, reason=reason)

    async def receive(self) -> bytes:
        try:
            message = await self.ws.receive()
        except WebSocketDisconnected as exc:
            raise WebSocketDisconnect(1006) from exc
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        data = message.get("bytes") or (message.get("text") or "").encode()
        if len(data) > self.max_bytes:
            await self.close(1009, "message too big")
            raise WebSocketDisconnect(1009)
        return bytes(data)

    def authorise(self) -> Principal:
        """Every frame: the token must still verify (it may have expired since the handshake)."""
        return self.tokens.verify(self.token)

    def sign_in(self, token: str) -> Principal:
        """Verify ``token`` and make it the socket's; the socket closes with 4401 when it
        expires, whether or not the client sends anything (a timer, not the next frame)."""
        who, until = self.tokens.verify_until(token)
        self.token, self.who = token, who
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = asyncio.create_task(self._expire_at(until))
        return who

    async def _expire_at(self, until: float) -> None:
        while (left := until - time.time()) > 0:
            await asyncio.sleep(min(left, 3600.0))  # (an exp far in the future: sleep in steps)
        self.unfollow_all()  # not one more event on an expired token
        try:
            await self.send_error(Unauthenticated("token expired"))
        except WebSocketDisconnect:
            pass
        except Exception:
            log.exception("could not tell %s that the token expired", self.who)
        await self.close(4401)

    async def run(self) -> None:
        try:
            raw = await asyncio.wait_for(self.receive(), AUTH_TIMEOUT)
            frame = decode_frame(raw)
            if frame.type != "auth":
                raise Unauthenticated("the first frame must be {type: auth, token}")
            who = self.sign_in(frame.token or "")
        except WebSocketDisconnect:
            return
        except (TimeoutError, InvalidInput):
            await self.refuse_auth(Unauthenticated("authenticate first"))
            return
        except Unauthenticated as exc:
            await self.refuse_auth(exc)
            return
        try:
            await self.send(self.ready(who))
            await self.serve()
        except WebSocketDisconnect:
            pass
        except Exception:  # handle() is total; this is its own failure (a bug)
            log.exception("WebSocket of %s failed", who.user)
            await self.close(1011)
        finally:
            if self._expiry is not None:
                self._expiry.cancel()
            self.unfollow_all()

    async def serve(self) -> None:
        """Frames are read by one task and handled in order by another: a ``ping`` is
        answered by the reader at once, even while an earlier frame is still handled (a
        ``resolve`` waiting on a slow Postgres held the pong back, and the page's heartbeat
        let a healthy socket go). When the client leaves, the frames it had sent are
        still handled, in order (a ``resolve`` sent just before closing is a person's
        click), and their answers go nowhere. Rate refusals (429) and refusals of a frame
        that finds the queue full (503) are sent by the reader, at once."""
        queue = ReadAhead()
        handler = asyncio.create_task(self._handle_queued(queue))
        reader = asyncio.create_task(self._read(queue))
        try:
            await asyncio.wait({reader, handler}, return_when=asyncio.FIRST_COMPLETED)
            if not handler.done():  # the client left (or flooded): the rest, then stop
                queue.end()
                await handler
        finally:
            for task in (reader, handler):
                task.cancel()
            await asyncio.gather(reader, handler, return_exceptions=True)
        for task in (handler, reader):
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def _read(self, queue: ReadAhead) -> None:
        while True:
            raw = await self.receive()
            if not self.limit.take():
                await self.refuse(raw)
            elif not await self._pong(raw) and not queue.offer(raw):
                # Not read on: a frame refused alone let later ones be handled before it
                # was sent again. What was read is still handled, in order.
                who = self.who.user if self.who else "?"
                log.info("closing a WebSocket of %s: too many frames waiting", who)
                await self.close(1013, "too many frames waiting; try again later")
                raise WebSocketDisconnect(1013)

    async def _handle_queued(self, queue: ReadAhead) -> None:
        while (raw := await queue.next()) is not None:
            await self.handle(raw)

    async def _pong(self, raw: bytes) -> bool:
        """A ``ping`` of a signed-in socket answered now; False for any other frame (and
        for a ping refused: handled in order, as any frame)."""
        if b"ping" not in raw:
            return False
        try:
            frame = decode_frame(raw)
            if frame.type != "ping":
                return False
            self.authorise()
        except SignoffError:
            return False
        await self.send({"type": "pong", "id": frame.id})
        return True

    async def refuse_auth(self, exc: Unauthenticated) -> None:
        with contextlib.suppress(WebSocketDisconnect):
            await self.send_error(exc)
        await self.close(4401)

    async def refuse(self, raw: bytes) -> None:
        """Over the rate: a 429 error frame, nothing done. A client that keeps sending a
        burst's worth of frames into refusals is flooding: it is disconnected (1008)."""
        if self.limit.refused > self.limit.burst:
            log.info("closing a flooding WebSocket of %s", self.who.user if self.who else "?")
            await self.close(1008, "rate limit exceeded")
            raise WebSocketDisconnect(1008)
        await self.send_error(
            RateLimited(f"more than {self.limit.rate:g} frames a second; slow down"), id_of(raw)
        )

    async def handle(self, raw: bytes) -> None:
        """One frame, answered: every exception on its path becomes a typed error frame
        (a timeout or a backing service down is 503) and the socket stays open; only a
        token that no longer verifies closes it (4401)."""
        frame_id = None
        try:
            try:
                frame = decode_frame(raw)
            except InvalidInput:
                frame_id = id_of(raw)  # the client's id, if the frame got that far
                raise
            frame_id = frame.id
            who = self.authorise()
            if frame.type == "message":
                with self.service.admission:  # back-pressure (gateway/overload.py)
                    await self.on_message(frame, who)
            elif frame.type == "resume":
                await self.on_resume(frame, who)
            elif frame.type == "resolve":
                with self.service.admission:
                    await self.on_resolve(frame, who)
            elif frame.type == "threads":
                threads = await self.watch.list(who)
                await self.send({"type": "threads", "id": frame.id, "threads": threads})
            elif frame.type == "ping":  # a client's heartbeat: the socket still carries
                await self.send({"type": "pong", "id": frame.id})
            elif frame.type == "auth":
                await self.on_auth(frame)
            else:
                raise InvalidInput(f"unknown frame type {frame.type!r}")
        except WebSocketDisconnect:
            raise
        except Unauthenticated as exc:
            with contextlib.suppress(WebSocketDisconnect):
                await self.send_error(exc, frame_id)
            await self.close(4401)
            raise WebSocketDisconnect(4401) from exc
        except Exception as exc:
            error = typed(exc)
            if isinstance(error, Internal):
                log.exception("WebSocket frame of %s failed", self.who.user if self.who else "?")
            await self.send_error(error, frame_id)

    async def on_auth(self, frame: Frame) -> None:
        """Another token on a live socket (a renewal, or another user): every subscription
        is dropped at once, then each is re-checked against the new principal and only the
        threads it owns are followed again, from where they were (nothing missed)."""
        who = self.sign_in(frame.token or "")
        positions = dict(self._last_seq)
        self.unfollow_all()
        kept: list[str] = []
        for thread_id, last_seq in positions.items():
            try:
                await self.service.own_thread(thread_id, who)
                await self.follow(thread_id, last_seq)
            except SignoffError as exc:  # not theirs (or not knowable now): stays dropped
                log.info("re-auth as %s dropped thread %s: %s", who.user, thread_id, exc.code)
                continue
            kept.append(thread_id)
        await self.send({**self.ready(who), "id": frame.id, "threads": kept})

    def ready(self, who: Principal) -> dict[str, Any]:
        """The ``ready`` frame: who is signed in, and the app's example request if it has
        one (the chat page's empty thread shows it)."""
        frame: dict[str, Any] = {"type": "ready", "user": who.user, "tenant": who.tenant}
        if self.service.hint is not None:
            frame["hint"] = self.service.hint
        return frame

    async def on_message(self, frame: Frame, who: Principal) -> None:
        if frame.text is None:
            raise InvalidInput("a message needs text")
        checked_message(frame.text, frame.idempotency_key)  # before a thread is made or followed
        if frame.thread_id is not None:
            thread = await self.service.own_thread(frame.thread_id, who)
            # Followed, and answered, under the id as Postgres spells it: hints travel on
            # a channel named by it ("A1B2..." or "{a1b2...}" would follow no channel).
            thread_id = thread.id
            if thread_id not in self._listeners:
                await self.follow(thread_id, thread.last_seq)
            delivery = await self.service.post_message(
                thread_id, frame.text, who, "ws", frame.idempotency_key
            )
        else:
            # A thread made for this message holds it, or is gone: accepted or refused,
            # never a thread without its message. One whose message may be queued stays,
            # followed, and its error names it: that message may yet run there. A keyed
            # message's thread made by an earlier send of it is found, and kept.
            thread, made = await self.service.thread_for(who, frame.text, frame.idempotency_key)
            thread_id = thread.id
            try:
                await self.follow(thread_id, 0)
                delivery = await self.service.post_message(
                    thread_id, frame.text, who, "ws", frame.idempotency_key
                )
            except MaybeQueued:
                raise
            except BaseException:
                self.unfollow(thread_id)
                if made and frame.idempotency_key is None:  # a key's thread: another send
                    await self.service.discard_thread(thread_id)  # of it may have queued
                raise
        await self.send(
            {"type": "ack", "id": frame.id, "thread_id": thread_id, "delivery": delivery}
        )

    async def on_resume(self, frame: Frame, who: Principal) -> None:
        if frame.thread_id is None:
            raise InvalidInput("resume needs thread_id")
        state = await self.service.thread_state(frame.thread_id, who)
        thread_id = state["thread"]["id"]  # as Postgres spells it (see on_message)
        ack = {"type": "ack", "id": frame.id, "thread_id": thread_id, "state": state}
        await self.follow(thread_id, max(frame.after_seq or 0, 0), ack=ack)

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

    def following(self, thread_id: str) -> bool:
        return thread_id in self._listeners

    async def follow(
        self, thread_id: str, after_seq: int, *, ack: dict[str, Any] | None = None
    ) -> None:
        """Send the log after ``after_seq``, then every new entry, in order, once.

        ``ack`` (a resume's) is sent once the thread's feed is listened to and before any
        of its events: a feed that cannot be listened to (Redis not answering) makes the
        frame's one answer an ``error``, never an ``ack`` followed by an ``error``."""
        self._last_seq[thread_id] = after_seq
        lock = self._catchup.setdefault(thread_id, asyncio.Lock())
        async with lock:  # a hint's events wait for the ack
            await self._listen(thread_id)
            if ack is not None:
                await self.send(ack)
        await self.catch_up(thread_id)

    async def _listen(self, thread_id: str) -> None:
        if thread_id not in self._listeners:

            async def listener(hint: Hint, _t: str = thread_id) -> None:
                if not self.following(_t):
                    return  # dropped (re-auth, expiry) while this hint was on its way
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
                elif hint.notice:  # a run's passing state, ephemeral
                    await self.send(
                        {
                            "type": "notice",
                            "thread_id": _t,
                            "run_id": hint.run_id,
                            "notice": hint.notice,
                        }
                    )
                elif not (hint.entries and await self.deliver(_t, hint.entries)):
                    await self.catch_up(_t)

            self._listeners[thread_id] = listener
            try:
                await self.feeds.add(thread_id, listener)
            except BaseException:
                self.unfollow(thread_id)
                raise

    def unfollow(self, thread_id: str) -> None:
        """Stop following a thread: no event of it is sent from now on."""
        listener = self._listeners.pop(thread_id, None)
        self._last_seq.pop(thread_id, None)
        self._last_assistant.pop(thread_id, None)
        if listener is not None:
            self.feeds.remove(thread_id, listener)

    def unfollow_all(self) -> None:
        for thread_id in list(self._listeners):
            self.unfollow(thread_id)
        self.watch.stop()  # a new principal asks for its own list again

    async def deliver(self, thread_id: str, entries: list[WireEntry]) -> bool:
        """Send the entries a hint carried, if they follow what this socket got; False on a
        gap (the caller re-reads the log then)."""
        async with self._catchup[thread_id]:
            if not self.following(thread_id):
                return True
            last = self._last_seq.get(thread_id, 0)
            fresh = [e for e in entries if e.seq > last]
            if fresh and fresh[0].seq != last + 1:
                return False
            for e in fresh:
                if not self.following(thread_id):
                    return True
                await self.send(
                    {
                        "type": "event",
                        "thread_id": thread_id,
                        "seq": e.seq,
                        "kind": e.kind,
                        "run_id": e.run_id,
                        "data": self.service.views.wire(e.kind, e.data),
                        "at": e.at,
                    }
                )
                self._last_seq[thread_id] = e.seq
                if e.kind == "assistant":
                    self._last_assistant[thread_id] = e.seq
            return True

    async def catch_up(self, thread_id: str) -> None:
        async with self._catchup[thread_id]:
            while self.following(thread_id):
                after = self._last_seq.get(thread_id, 0)
                entries = await self.service.store.entries_after(thread_id, after, 500)
                for entry in entries:
                    if not self.following(thread_id):
                        return
                    await self.send({"type": "event", **self.service.views.event(event_of(entry))})
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
        await deny(ws, 403, OriginRejected.code, "this page's origin may not open a WebSocket")
        return
    await ws.accept()
    await Connection(ws, service, feeds, tokens, max_bytes, RateLimit(rate, burst)).run()
