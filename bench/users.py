"""Simulated users over real WebSockets.

Each user holds two sockets: a *chat* socket on one gateway, where it asks for a
write in a new thread and watches that thread's events, and a *decide* socket on
another gateway, where it approves the card (DESIGN.md §2: "browser --click-->
gateway B"). A user owns several threads, one parked card each (a new message in
a thread would supersede its pending card, so a thread holds at most one).

Timings are taken with ``time.perf_counter_ns`` in this process: the click is the
moment the ``resolve`` frame is handed to the socket; ``resolved`` is the gateway's
answer (decision committed and signalled); ``result`` is the ``card_update`` event
with status ``executed`` on the chat socket (the other gateway).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from bench.common import Cluster, Socket, gather_limited

ASK = "cobre 12 do João"
OTHER_ENDS = frozenset({"failed", "invalidated", "rejected", "expired", "superseded"})


@dataclass
class Card:
    id: str
    hash: str
    thread_id: str
    user: User
    click_ns: int = 0
    resolved_ns: int = 0
    result_ns: int = 0
    run_done_ns: int = 0
    error: str | None = None
    acked: asyncio.Future[None] | None = None
    final: str = ""  # a terminal status other than executed (failed, invalidated, ...)
    finished: asyncio.Future[None] | None = None
    asked_ms: float = 0.0  # the message sent -> its card on the chat socket


@dataclass
class User:
    name: str
    chat: Socket | None = None
    decide: Socket | None = None
    acks: dict[str, asyncio.Future[str]] = field(default_factory=dict)
    card_waiters: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    early_cards: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_frame: dict[str, Card] = field(default_factory=dict)
    by_card: dict[str, Card] = field(default_factory=dict)
    by_thread: dict[str, Card] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class Users:
    """A population of simulated users on a cluster (chat on gateway i, decide on i+1)."""

    def __init__(self, c: Cluster, n: int, prefix: str = "u") -> None:
        self.c = c
        self.users = [User(f"{prefix}{i}") for i in range(n)]
        self._ids = itertools.count()
        self.results = asyncio.Event()
        self.pending_results = 0
        self.errors: list[str] = []
        self.on_result: Any = None

    # -- sockets ------------------------------------------------------------------------

    async def open(self, limit: int = 64) -> None:
        g = len(self.c.gateways)

        async def one(i: int, u: User) -> None:
            token = self.c.token(u.name)
            chat_gw = self.c.gateways[i % g]
            decide_gw = self.c.gateways[(i + 1) % g]

            def on_chat(f: dict[str, Any], t: int) -> None:
                self._on_chat(u, f, t)

            def on_decide(f: dict[str, Any], t: int) -> None:
                self._on_decide(u, f, t)

            u.chat = Socket(chat_gw.ws_url, token, on_chat)
            u.decide = Socket(decide_gw.ws_url, token, on_decide)
            await u.chat.open()
            await u.decide.open()

        await gather_limited([one(i, u) for i, u in enumerate(self.users)], limit)

    async def close(self) -> None:
        await gather_limited(
            [s.close() for u in self.users for s in (u.chat, u.decide) if s is not None], 256
        )

    # -- frames -------------------------------------------------------------------------

    def _on_chat(self, u: User, f: dict[str, Any], t: int) -> None:
        kind = f.get("type")
        if kind == "ack":
            fut = u.acks.pop(f.get("id") or "", None)
            if fut is not None and not fut.done():
                fut.set_result(f["thread_id"])
        elif kind == "event":
            ek = f.get("kind")
            if ek == "card":
                data = f["data"]
                thread = f["thread_id"]
                waiter = u.card_waiters.pop(thread, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(data)
                else:
                    u.early_cards[thread] = data
            elif ek == "card_update":
                data = f["data"]
                card = u.by_card.get(data.get("id", ""))
                status = data.get("status")
                if card is not None and status in OTHER_ENDS and not card.final:
                    card.final = str(status)
                    if card.finished is not None and not card.finished.done():
                        card.finished.set_result(None)
                if card is not None and status == "executed" and not card.result_ns:
                    card.result_ns = t
                    if card.finished is not None and not card.finished.done():
                        card.finished.set_result(None)
                    self.pending_results -= 1
                    if self.on_result is not None:
                        self.on_result(card)
                    if self.pending_results <= 0:
                        self.results.set()
            elif ek == "run":
                card = u.by_thread.get(f["thread_id"])
                if card is not None and card.click_ns and not card.run_done_ns:
                    card.run_done_ns = t
        elif kind == "error":
            u.errors.append(str(f))
            self.errors.append(f"chat {u.name}: {f.get('error')} {f.get('message')}")
            fut = u.acks.pop(f.get("id") or "", None)
            if fut is not None and not fut.done():
                fut.set_exception(RuntimeError(str(f)))

    def _on_decide(self, u: User, f: dict[str, Any], t: int) -> None:
        kind = f.get("type")
        if kind == "resolved":
            card = u.by_frame.pop(f.get("id") or "", None)
            if card is not None:
                card.resolved_ns = t
                if card.acked is not None and not card.acked.done():
                    card.acked.set_result(None)
        elif kind == "error":
            card = u.by_frame.pop(f.get("id") or "", None)
            msg = f"decide {u.name}: {f.get('error')} {f.get('message')}"
            self.errors.append(msg)
            if card is not None:
                card.error = msg
                card.resolved_ns = t
                if card.acked is not None and not card.acked.done():
                    card.acked.set_result(None)
                if card.finished is not None and not card.finished.done():
                    card.finished.set_result(None)
                self.pending_results -= 1
                if self.pending_results <= 0:
                    self.results.set()

    # -- parking ------------------------------------------------------------------------

    async def ask(self, u: User, timeout: float = 120) -> Card:
        """One new thread asking for a write; returns once its card arrived (parked run)."""
        assert u.chat is not None
        loop = asyncio.get_running_loop()
        fid = f"m{next(self._ids)}"
        ack: asyncio.Future[str] = loop.create_future()
        u.acks[fid] = ack
        sent = time.perf_counter_ns()
        await u.chat.send({"type": "message", "text": ASK, "id": fid})
        thread = await asyncio.wait_for(ack, timeout)
        data = u.early_cards.pop(thread, None)
        if data is None:
            waiter: asyncio.Future[dict[str, Any]] = loop.create_future()
            u.card_waiters[thread] = waiter
            data = await asyncio.wait_for(waiter, timeout)
        card = Card(id=data["id"], hash=data["snapshot_hash"], thread_id=thread, user=u)
        card.asked_ms = (time.perf_counter_ns() - sent) / 1e6
        u.by_card[card.id] = card
        u.by_thread[thread] = card
        return card

    async def park(self, total: int, limit: int = 64, bar: Any = None) -> list[Card]:
        """``total`` parked runs spread round-robin over the users; at most ``limit`` in flight."""

        async def one(i: int) -> Card:
            card = await self.ask(self.users[i % len(self.users)])
            if bar is not None:
                bar.update(1)
            return card

        return await gather_limited([one(i) for i in range(total)], limit)

    # -- deciding -----------------------------------------------------------------------

    def expect(self, n: int) -> None:
        self.pending_results = n
        self.results.clear()

    async def click(self, card: Card) -> None:
        """Approve on the user's decide socket (the other gateway); does not wait."""
        u = card.user
        assert u.decide is not None
        fid = f"r{next(self._ids)}"
        u.by_frame[fid] = card
        card.click_ns = time.perf_counter_ns()
        await u.decide.ws.send(
            f'{{"type":"resolve","id":"{fid}","card_id":"{card.id}",'
            f'"decision":"approve","snapshot_hash":"{card.hash}"}}'
        )

    async def click_and_wait(self, card: Card, until: str = "ack", timeout: float = 60) -> None:
        """Closed loop: approve, then wait for the gateway's answer (``ack``) or for the
        card's ``executed`` event on the chat socket (``result``)."""
        loop = asyncio.get_running_loop()
        card.acked = loop.create_future()
        card.finished = loop.create_future()
        await self.click(card)
        await asyncio.wait_for(card.acked if until == "ack" else card.finished, timeout)

    async def wait_results(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.results.wait(), timeout)
            return True
        except TimeoutError:
            return False
