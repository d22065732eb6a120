"""Per-user quotas: threads created per minute, model turns in flight, open WebSockets.

Each is counted per (tenant, user) and configured in :class:`~runtime.config.Settings`
(``SIGNOFF_QUOTA_*``; 0 turns one off). A refusal is :class:`RateLimited` (HTTP 429 with
``Retry-After``; an ``error`` frame with status 429 on a WebSocket), decided before the
request writes anything, so a refused request changes nothing.

- **Threads per minute** are counted in Postgres, the truth: the insert is conditional on
  the owner's threads of the last 60 s, under a per-user advisory lock, so concurrent
  requests on any number of gateways never overshoot. Redis plays no part.
- **Turns in flight** are the owner's runs ``running`` in Postgres plus the messages a
  gateway accepted (202 / ``ack``) that no worker has started yet. Those live only in the
  Redis inbox until a worker picks them up, so each gateway records an accepted message
  in a per-user Redis sorted set (``Keys.accepted_turns``) *before* enqueueing it, under
  the id of the run it will start (``run_id_of``, derived from the message id as the
  worker does). One statement then counts both halves in one snapshot: the user's
  ``running`` runs, and the recorded ids that have no run row yet. A message whose run
  started is counted by its run alone, never twice, and a finished run no longer counts,
  though its entry lingers until pruned. Entries older than ``quota_queued_seconds`` drop
  out (a message lost with a Redis that had no persistence stops counting then). The add
  and the read of the set are one script, so of N concurrent requests each sees every
  request before it: a burst on several gateways cannot all slip under the limit (under
  contention a request may be refused that a calmer moment would admit; never the
  reverse). If Redis does not answer, the set is a hint we do without: only Postgres's
  ``running`` runs are counted (enqueueing needs Redis anyway, so such a request will
  most likely get 503). With the in-process bus (``signoff dev``) the set lives in memory.
- **Open WebSockets** are counted per gateway process, in memory: a user may hold up to
  the limit on each gateway. The first frame (``auth``) decides whose socket it is; over
  the limit the socket gets an ``error`` frame (429) and is closed with 4429 before
  ``ready``. A crashed gateway's counts die with it, so nothing can leak.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import msgspec
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from signoff.gateway.auth import Principal, Tokens
from signoff.gateway.errors import error_body, status_of
from signoff.runtime.bus import Bus
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.canonical import run_id_of
from signoff.runtime.config import Settings
from signoff.runtime.errors import MaybeQueued, RateLimited, SignoffError, Unauthenticated
from signoff.runtime.keys import Keys
from signoff.runtime.records import Thread
from signoff.runtime.store import Store

log = logging.getLogger("signoff.quotas")

THREAD_WINDOW_SECONDS = 60.0
# A refused turn: when one of the user's turns will have finished is unknown; a model
# turn takes seconds.
TURN_RETRY_AFTER = 5.0
SOCKET_RETRY_AFTER = 5.0
# Close code of a socket refused for the user's socket quota (like 4401 for 401).
CLOSE_TOO_MANY_SOCKETS = 4429


class Ledger(Protocol):
    """Per-user sorted sets of recently accepted messages (``RedisBus`` implements it)."""

    async def window_add(self, key: str, member: str, now_ms: int, window_ms: int) -> list[str]:
        """Drop members older than the window, add ``member``, return every member left."""
        ...

    async def window_remove(self, key: str, members: list[str]) -> None: ...


class MemoryLedger:
    """The ledger of one process, for the in-process bus (one gateway, no Redis)."""

    def __init__(self) -> None:
        self._sets: dict[str, dict[str, int]] = {}

    async def window_add(self, key: str, member: str, now_ms: int, window_ms: int) -> list[str]:
        entries = self._sets.setdefault(key, {})
        for old in [m for m, at in entries.items() if at <= now_ms - window_ms]:
            del entries[old]
        entries[member] = now_ms
        return list(entries)

    async def window_remove(self, key: str, members: list[str]) -> None:
        entries = self._sets.get(key)
        if entries is None:
            return
        for member in members:
            entries.pop(member, None)
        if not entries:
            del self._sets[key]


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


class Quotas:
    """The thread and turn quotas (the socket quota is :class:`SocketSlots`)."""

    def __init__(
        self,
        *,
        store: Store,
        ledger: Ledger,
        keys: Keys,
        threads_per_minute: int = 0,
        turns_in_flight: int = 0,
        queued_seconds: float = 120.0,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.keys = keys
        self.threads_per_minute = threads_per_minute
        self.turns_in_flight = turns_in_flight
        self.queued_ms = max(int(queued_seconds * 1000), 1)

    @classmethod
    def from_settings(cls, settings: Settings, store: Store, bus: Bus) -> Quotas:
        ledger: Ledger = bus if isinstance(bus, RedisBus) else MemoryLedger()
        return cls(
            store=store,
            ledger=ledger,
            keys=Keys(settings.key_prefix),
            threads_per_minute=settings.quota_threads_per_minute,
            turns_in_flight=settings.quota_turns_in_flight,
            queued_seconds=settings.quota_queued_seconds,
        )

    async def create_thread(self, who: Principal, thread_id: str | None = None) -> Thread:
        """A new thread of ``who``'s, or :class:`RateLimited` (and no thread);
        ``thread_id``: of that id (:class:`Conflict` if it exists)."""
        limit = self.threads_per_minute
        if limit <= 0:
            return await self.store.create_thread(who.tenant, who.user, thread_id)
        thread, wait = await self.store.create_thread_within_quota(
            who.tenant,
            who.user,
            limit=limit,
            window_seconds=THREAD_WINDOW_SECONDS,
            thread_id=thread_id,
        )
        if thread is None:
            raise RateLimited(
                f"more than {limit} new threads a minute; wait before starting another",
                retry_after=wait,
                quota="threads_per_minute",
                limit=limit,
            )
        return thread

    @asynccontextmanager
    async def turn(self, who: Principal, message_id: str) -> AsyncIterator[None]:
        """Admit one more model turn for ``who`` (the message ``message_id``) or raise
        :class:`RateLimited`. The body enqueues the message; if it raises, the turn is
        given back, so a refused or failed request leaves nothing counted."""
        limit = self.turns_in_flight
        if limit <= 0:
            yield
            return
        key = self.keys.accepted_turns(who.tenant, who.user)
        run_id = run_id_of(message_id)
        recorded = True
        try:
            accepted = await self.ledger.window_add(
                key, run_id, int(time.time() * 1000), self.queued_ms
            )
        except SignoffError as exc:
            # Redis is a hint: without it, count what Postgres knows (and this message).
            log.warning("turn quota of %s without Redis (%s): counting Postgres only", who, exc)
            accepted, recorded = [run_id], False
        try:
            in_flight, started = await self.store.turns_in_flight(
                who.tenant, who.user, [a for a in accepted if _is_uuid(a)]
            )
            if in_flight > limit:
                raise RateLimited(
                    f"{limit} turns already in flight; wait for one to finish",
                    retry_after=TURN_RETRY_AFTER,
                    quota="turns_in_flight",
                    limit=limit,
                )
            if started and recorded:
                # Runs count themselves from now on: keep the set to unstarted messages.
                with contextlib.suppress(SignoffError):
                    await self.ledger.window_remove(key, started)
            yield
        except BaseException as exc:
            # A message that may have been queued (MaybeQueued) may run: it stays counted.
            if recorded and not isinstance(exc, MaybeQueued):
                with contextlib.suppress(SignoffError):
                    await self.ledger.window_remove(key, [run_id])
            raise


# -- open WebSockets ------------------------------------------------------------------------


class SocketSlots:
    """Open WebSockets per (tenant, user) in this gateway process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[tuple[str, str], int] = {}

    def take(self, who: Principal) -> bool:
        if self.limit <= 0:
            return True
        key = (who.tenant, who.user)
        n = self._open.get(key, 0)
        if n >= self.limit:
            return False
        self._open[key] = n + 1
        return True

    def give_back(self, who: Principal) -> None:
        if self.limit <= 0:
            return
        key = (who.tenant, who.user)
        n = self._open.get(key, 0) - 1
        if n > 0:
            self._open[key] = n
        else:
            self._open.pop(key, None)

    def count(self, who: Principal) -> int:
        return self._open.get((who.tenant, who.user), 0)


class _AuthFrame(msgspec.Struct):
    type: str = ""
    id: str | None = None
    token: str | None = None


_auth_frame = msgspec.json.Decoder(_AuthFrame)
# What a first frame that does not parse raises (msgspec raises UnicodeDecodeError on
# invalid UTF-8 in a binary frame): it passes on untouched, for gateway/ws.py to refuse.
_BAD_FRAME = (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError)
_enc = msgspec.json.Encoder()


class SocketGate:
    """An ASGI WebSocket endpoint that counts each socket against its user's quota.

    It reads the first frame on its way to ``endpoint`` (``gateway/ws.py``): a valid
    ``auth`` frame takes one of the user's slots, given back when the socket ends. Over
    the limit it answers an ``error`` frame (429) and closes with 4429, and ``endpoint``
    sees a disconnect. Anything else in the first frame (not JSON, not ``auth``, a bad
    token) passes untouched: ``endpoint`` refuses it (4401). A later ``auth`` frame with
    another user's token keeps the socket counted against its first user.
    """

    def __init__(
        self,
        slots: SocketSlots,
        tokens: Tokens,
        endpoint: Callable[[WebSocket], Awaitable[None]],
    ) -> None:
        self.slots = slots
        self.tokens = tokens
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        holder: list[Principal] = []  # the principal holding a slot, once taken
        refused = False
        first = True

        async def receive_first_frame_counted() -> Message:
            nonlocal first, refused
            message = await receive()
            if not first or message["type"] != "websocket.receive":
                return message
            first = False
            who = self._principal(message)
            if who is None:
                return message
            if not self.slots.take(who):
                refused = True
                await self._refuse(send, message)
                return {"type": "websocket.disconnect", "code": CLOSE_TOO_MANY_SOCKETS}
            holder.append(who)
            return message

        try:
            await self.endpoint(WebSocket(scope, receive_first_frame_counted, send))
        except WebSocketDisconnect:
            if not refused:
                raise
        finally:
            for who in holder:
                self.slots.give_back(who)

    def _principal(self, message: Message) -> Principal | None:
        raw = message.get("bytes") or (message.get("text") or "").encode("utf-8", "replace")
        try:
            frame = _auth_frame.decode(raw)
            if frame.type != "auth":
                return None
            return self.tokens.verify(frame.token)
        except (*_BAD_FRAME, Unauthenticated):
            return None

    async def _refuse(self, send: Send, message: Message) -> None:
        raw = message.get("bytes") or (message.get("text") or "").encode("utf-8", "replace")
        frame_id: Any = None
        with contextlib.suppress(*_BAD_FRAME):
            frame_id = _auth_frame.decode(raw).id
        exc = RateLimited(
            f"{self.slots.limit} WebSockets already open on this gateway; close one first",
            retry_after=SOCKET_RETRY_AFTER,
            quota="sockets",
            limit=self.slots.limit,
        )
        frame = {"type": "error", "id": frame_id, "status": status_of(exc), **error_body(exc)}
        await send({"type": "websocket.send", "text": _enc.encode(frame).decode()})
        await send(
            {
                "type": "websocket.close",
                "code": CLOSE_TOO_MANY_SOCKETS,
                "reason": "too many sockets",
            }
        )
