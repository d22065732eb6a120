"""Thread feeds: one bus subscription per thread per gateway, fanned out to its sockets.

A hint on the thread channel carries the entries the log grew by (``runtime.hints``),
decoded once here for every socket of the thread. Each listener sends the entries
that follow the last seq it delivered and re-reads the log from Postgres on a gap,
so a lost or reordered hint never loses or duplicates an event. Text deltas ride
on hints too (they are ephemeral, never stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import msgspec

from signoff.runtime.bus import Bus
from signoff.runtime.errors import Unavailable
from signoff.runtime.hints import Hint, decode
from signoff.runtime.keys import Keys

log = logging.getLogger("signoff.feed")

Listener = Callable[[Hint], Awaitable[None]]


READY_SECONDS = 10.0


class Feeds:
    def __init__(self, bus: Bus, keys: Keys, ready_seconds: float = READY_SECONDS) -> None:
        self._bus = bus
        self._keys = keys
        self.ready_seconds = ready_seconds  # how long ``add`` waits for the subscription
        self._listeners: dict[str, set[Listener]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ready: dict[str, asyncio.Event] = {}  # set while the subscription is live
        self._failed: dict[str, asyncio.Event] = {}  # set by the next failed attempt
        self._channels: dict[str, str] = {}  # a key that is not a thread id: its channel

    async def add(self, thread_id: str, listener: Listener, channel: str | None = None) -> None:
        """Register a listener; returns once the thread's subscription is live. A
        subscription not live within ``ready_seconds`` (Redis overloaded), or whose next
        attempt fails (Redis down: it fails at once, design note 63), is
        :class:`Unavailable`; on any failure the listener is removed again. A feed whose
        subscription dropped is not live until it is back: a listener added meanwhile
        waits for it, as the first one did (it was told the feed was live at once).

        ``channel``: subscribe ``thread_id`` (then any key) as that channel instead of the
        thread's (the per-user channel of ``gateway/watch.py`` shares this fan-out)."""
        if channel is not None:
            self._channels[thread_id] = channel
        self._listeners.setdefault(thread_id, set()).add(listener)
        if thread_id not in self._tasks:
            ready = self._ready[thread_id] = asyncio.Event()
            failed = self._failed[thread_id] = asyncio.Event()
            self._tasks[thread_id] = asyncio.create_task(self._follow(thread_id))
        else:
            ready, failed = self._ready[thread_id], self._failed[thread_id]
        if ready.is_set():
            return
        waits = [asyncio.ensure_future(ready.wait()), asyncio.ensure_future(failed.wait())]
        try:
            await asyncio.wait(waits, timeout=self.ready_seconds, return_when="FIRST_COMPLETED")
            if not ready.is_set():
                raise Unavailable("the thread's live feed is not ready; try again")
        except BaseException:
            self.remove(thread_id, listener)
            raise
        finally:
            for wait in waits:
                wait.cancel()

    def listening(self, thread_id: str) -> int:
        """How many listeners follow the thread on this gateway."""
        return len(self._listeners.get(thread_id, ()))

    def remove(self, thread_id: str, listener: Listener) -> None:
        listeners = self._listeners.get(thread_id)
        if listeners is None:
            return
        listeners.discard(listener)
        if not listeners:
            del self._listeners[thread_id]
            self._ready.pop(thread_id, None)
            self._failed.pop(thread_id, None)
            self._channels.pop(thread_id, None)
            task = self._tasks.pop(thread_id, None)
            if task is not None:
                task.cancel()

    async def _follow(self, thread_id: str) -> None:
        channel = self._channels.get(thread_id) or self._keys.thread_channel(thread_id)
        while thread_id in self._listeners:
            try:
                async with self._bus.subscribe(channel) as sub:
                    ready = self._ready.get(thread_id)
                    if ready is not None:  # None: the last listener left meanwhile
                        ready.set()
                    # (Re)subscribed: let every listener re-read the log.
                    await self._dispatch(thread_id, Hint(seq=-1))
                    async for raw in sub:
                        try:
                            hint = decode(raw)
                        except msgspec.DecodeError:
                            continue
                        await self._dispatch(thread_id, hint)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("thread feed %s dropped (%s); re-subscribing", thread_id, exc)
                if (ready := self._ready.get(thread_id)) is not None:
                    ready.clear()  # not live until the next subscription is
                if (failed := self._failed.get(thread_id)) is not None:
                    failed.set()  # the listeners waiting for this attempt are told
                    self._failed[thread_id] = asyncio.Event()
                await asyncio.sleep(0.2)

    async def _dispatch(self, thread_id: str, hint: Hint) -> None:
        for listener in list(self._listeners.get(thread_id, ())):
            try:
                await listener(hint)
            except Exception as exc:
                log.debug("listener failed: %s", exc)

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._listeners.clear()
