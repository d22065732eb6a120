"""A socket's thread list, kept live: ``{type: "threads"}`` lists the person's threads
(most recently active first, with the cards waiting in each) and from then on the
socket gets ``{type: "threads_changed", thread_id}`` when one of them changes or a new
one is made, so the page re-lists.

It rides on the gateway's existing fan-out (``gateway/feed.py``): one listener per
listed thread on the thread's channel (the same subscription the thread's sockets
share), and one on the person's channel (``Keys.user_channel``), which
``announce_thread`` (gateway/service.py) hints after a thread is committed: one made
over HTTP or WebSocket (``GatewayService.create_thread``) or by a WhatsApp number's
first message (the channel's ``thread_of``). A lost hint only delays the list until the
next change or reconnect: the list itself is always read from Postgres.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from signoff.gateway.auth import Principal
from signoff.gateway.feed import Feeds, Listener
from signoff.runtime.hints import Hint

if TYPE_CHECKING:
    from signoff.gateway.service import GatewayService

log = logging.getLogger("signoff.watch")

WATCH_LIMIT = 20  # threads of the list followed live (the most recently active)
LIST_LIMIT = 50  # threads listed
# Log entries that change a list line: its order (a message) or its badge (a card).
_LISTED = frozenset({"user", "card", "card_update"})

Send = Callable[[dict[str, Any]], Awaitable[None]]


class ThreadWatch:
    def __init__(self, feeds: Feeds, service: GatewayService, send: Send) -> None:
        self.feeds = feeds
        self.service = service
        self.send = send
        self._threads: dict[str, Listener] = {}
        # Subscriptions being added: a re-read hint meanwhile is that subscribe's own
        # (the feed sends it before `add` returns), not a change. One after `add` returned
        # comes from a re-subscribe after a drop, which may hide a missed hint: the page
        # re-lists. (A socket joining a subscription another socket made gets no hint of
        # its own, so "the first one seen" would swallow a real one.)
        self._adding: set[str] = set()
        self._user: tuple[str, Listener] | None = None

    async def list(self, who: Principal) -> list[dict[str, Any]]:
        """The list, and every thread in it (up to ``WATCH_LIMIT``) followed from now on."""
        threads = await self.service.list_threads(who, LIST_LIMIT)
        if self._user is None:
            channel = self.service.quotas.keys.user_channel(who.tenant, who.user)
            key = "user:" + channel  # never a thread id (a UUID)

            async def on_user(hint: Hint) -> None:
                if hint.seq == -1 and key in self._adding:
                    return
                await self._changed("")

            self._user = (key, on_user)
            self._adding.add(key)
            try:
                await self.feeds.add(key, on_user, channel=channel)
            except BaseException:
                self._user = None
                raise
            finally:
                self._adding.discard(key)
        wanted = [t["id"] for t in threads[:WATCH_LIMIT]]
        for thread_id in list(self._threads):
            if thread_id not in wanted:
                self._drop(thread_id)
        for thread_id in wanted:
            if thread_id not in self._threads:
                listener = self._listener(thread_id)
                self._threads[thread_id] = listener
                self._adding.add(thread_id)
                try:
                    await self.feeds.add(thread_id, listener)
                except BaseException:
                    self._threads.pop(thread_id, None)
                    raise
                finally:
                    self._adding.discard(thread_id)
        return threads

    def _listener(self, thread_id: str) -> Listener:
        async def on_thread(hint: Hint) -> None:
            if hint.seq == -1 and not hint.entries:
                if thread_id not in self._adding:  # re-subscribed after a drop
                    await self._changed(thread_id)
            elif any(e.kind in _LISTED for e in hint.entries):
                await self._changed(thread_id)

        return on_thread

    async def _changed(self, thread_id: str) -> None:
        try:
            await self.send({"type": "threads_changed", "thread_id": thread_id or None})
        except Exception as exc:  # the socket is going away: its close stops the watch
            log.debug("threads_changed not sent: %s", exc)

    def _drop(self, thread_id: str) -> None:
        listener = self._threads.pop(thread_id, None)
        if listener is not None:
            self.feeds.remove(thread_id, listener)

    def stop(self) -> None:
        for thread_id in list(self._threads):
            self._drop(thread_id)
        if self._user is not None:
            key, listener = self._user
            self._user = None
            self.feeds.remove(key, listener)
