"""The Bus protocol: the fast path between gateways and workers.

A bus carries hints, never truth: a lost message costs latency, not a decision,
because every receiver can re-read Postgres (DESIGN.md I6). A hint may carry the
committed entries themselves (design note 2), but Postgres stays what a receiver
falls back on. Backends: :mod:`signoff.runtime.bus.memory` (one process) and
:mod:`signoff.runtime.bus.redis` (pools).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import msgspec


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """A user message to run, as carried by the inbox."""

    thread_id: str
    text: str
    user: str
    tenant: str
    role: str = "user"
    channel: str = "http"
    # Set by the gateway once per user message; the run id derives from it, so a
    # redelivered inbox entry finds its run instead of starting another (I5).
    message_id: str = ""
    # Set instead of a message: a workflow run to continue (started, or a gate passed
    # while no live worker held it); the worker that takes it claims the run.
    workflow_run: str = ""


class Delivery(msgspec.Struct, frozen=True):
    """A job taken from the inbox; ``ack`` it once its step is stored."""

    id: str
    job: Job


class Subscription(Protocol):
    def __aiter__(self) -> AsyncIterator[bytes]: ...


class Bus(Protocol):
    async def publish(self, channel: str, message: bytes) -> int:
        """Send to every current subscriber; the count that heard it (0: nobody did)."""
        ...

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe; the subscription is live (confirmed) when the context is entered."""
        ...

    async def set_wait(self, card_id: str, holder: str, ttl_ms: int) -> None:
        """Record ``holder`` (the worker holding the card's run) as waiting on the card."""
        ...

    async def clear_wait(self, card_id: str) -> None: ...

    async def clear_waits(self, card_ids: Iterable[str]) -> None:
        """Clear many wait tokens in a few round trips (a stopping worker's parked cards)."""
        ...

    async def wait_holder(self, card_id: str) -> str | None:
        """The worker whose wait token names the card, if the token has not expired."""
        ...

    async def heartbeat(self, worker_id: str, ttl_ms: int) -> None:
        """Mark the worker alive for ``ttl_ms`` (its inbox entries are not claimed meanwhile)."""
        ...

    async def claim_owner(self, owner: str, ttl_ms: int) -> str:
        """Claim this bus's key prefix for ``owner`` (an app on its database) for
        ``ttl_ms``, renewing it when ours; returns the owner now (another: refused)."""
        ...

    def gate_inbox(self, confirmed: asyncio.Event) -> None:
        """Use the inbox only once ``confirmed`` is set: the key prefix is this app's
        (``prefix_owner.hold``). Until then ``take`` returns nothing and ``enqueue``
        waits a moment, then raises :class:`~signoff.runtime.errors.Unavailable`
        (nothing queued)."""
        ...

    async def enqueue(self, job: Job) -> str: ...

    async def take(self, consumer: str, timeout: float, count: int = 16) -> list[Delivery]:
        """Up to ``count`` jobs for ``consumer`` (a partitioned inbox may give one more per
        partition): claimed ones of dead consumers first, else new ones, waiting up to
        ``timeout``. What is not taken stays for any other consumer."""
        ...

    async def ack(self, delivery_id: str) -> None: ...

    def release(self, delivery: Delivery) -> None:
        """Hand back a delivery this process could not finish (nor ack): it is delivered
        again, to any consumer (this one included), once idle for the claim time."""
        ...

    async def close(self) -> None: ...
