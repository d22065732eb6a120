"""Bounded Redis resources, on the real server: the client pool never opens more than
``max_connections`` (a call beyond waits), and a card's wait token is deleted as soon
as the card leaves ``pending``, by every path (decided, expired by the sweeper,
superseded, invalidated with its run) — not left to expire."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis

from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Decision, Status
from signoff.runtime.errors import Unavailable
from signoff.runtime.keys import Keys
from tests import services
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def named_url(name: str) -> str:
    url = services.redis_url()
    return f"{url}{'&' if '?' in url else '?'}client_name={name}"


async def connections_named(admin: aioredis.Redis, name: str) -> int:
    clients = await admin.client_list()
    return sum(1 for c in clients if c.get("name") == name)


async def test_load_beyond_the_pool_waits_instead_of_opening_more() -> None:
    name = f"so-pool-{secrets.token_hex(4)}"
    bus = RedisBus.from_url(named_url(name), Keys(f"{name}:"), max_connections=3)
    admin = aioredis.Redis.from_url(services.redis_url())
    peak = 0
    try:
        redis = bus.client.redis

        async def slow() -> object:  # holds a pooled connection for 0.3 s
            return await bus.client.call("BLPOP", lambda: redis.blpop([f"{name}:none"], 0.3))

        load = asyncio.gather(*(slow() for _ in range(12)))
        while not load.done():
            peak = max(peak, await connections_named(admin, name))
            await asyncio.sleep(0.02)
        assert await load == [None] * 12  # every call went through, one after another
        assert 1 <= peak <= 3, peak
    finally:
        await bus.close()
        await admin.aclose()


async def test_a_call_that_waits_past_the_pool_timeout_is_unavailable() -> None:
    name = f"so-pool-{secrets.token_hex(4)}"
    bus = RedisBus.from_url(named_url(name), Keys(f"{name}:"), max_connections=1, pool_timeout=0.05)
    try:
        redis = bus.client.redis

        async def blocking() -> object:
            return await redis.blpop([f"{name}:none"], 1)

        hold = asyncio.create_task(blocking())
        await asyncio.sleep(0.1)
        with pytest.raises(Unavailable):
            await bus.client.call("GET", lambda: redis.get(f"{name}:k"))
        await hold
    finally:
        await bus.close()


@asynccontextmanager
async def on_redis(database_url: str, **kw: object) -> AsyncIterator[Harness]:
    keys = Keys(f"so-wt-{secrets.token_hex(4)}:")
    bus = RedisBus.from_url(services.redis_url(), keys)
    async with harness(database_url, bus=bus, **kw) as h:  # type: ignore[arg-type]
        yield h


async def parked(h: Harness, user: str = "alice") -> tuple[str, str]:
    thread = await h.thread(user)
    await h.say(thread, "cobre", user)
    (card,) = await h.store.pending_cards(thread)
    assert await h.bus.wait_holder(card.id) == h.worker.worker_id
    return thread, card.id


async def test_a_decision_deletes_the_token_even_when_no_worker_hears_it(
    database_url: str,
) -> None:
    async with on_redis(database_url, model=Scripted(pix())) as h:
        _, approved = await parked(h)
        _, rejected = await parked(h, "bob")
        await h.worker.stop(release=False)  # the holder is gone (tokens left, as a crash)
        assert await h.bus.wait_holder(approved) is not None
        await h.decide(await h.card(approved), Decision.APPROVE)
        await h.decide(await h.card(rejected), Decision.REJECT)
        assert await h.bus.wait_holder(approved) is None
        assert await h.bus.wait_holder(rejected) is None


async def test_an_expiry_by_another_workers_sweeper_deletes_the_token(database_url: str) -> None:
    async with on_redis(database_url, model=Scripted(pix())) as h:
        _, card_id = await parked(h)
        await h.worker.stop(release=False)
        await h.store.pool.execute(
            "UPDATE cards SET expires_at = now() - interval '1 second' WHERE id = $1::uuid",
            card_id,
        )
        expired, _ = await h.worker.sweep()
        assert card_id in [c.id for c in expired]
        assert (await h.card(card_id)).status is Status.EXPIRED
        assert await h.bus.wait_holder(card_id) is None


async def test_an_expiry_by_the_holders_own_sweeper_deletes_the_token(database_url: str) -> None:
    async with on_redis(database_url, model=Scripted(pix())) as h:
        _, card_id = await parked(h)
        h.worker.waits.drop_all()  # the run is not woken: only the sweep's delete counts
        await h.store.pool.execute(
            "UPDATE cards SET expires_at = now() - interval '1 second' WHERE id = $1::uuid",
            card_id,
        )
        await h.worker.sweep()
        assert (await h.card(card_id)).status is Status.EXPIRED
        assert await h.bus.wait_holder(card_id) is None


async def test_a_new_message_superseding_the_card_deletes_the_token(database_url: str) -> None:
    async with on_redis(database_url, model=Scripted(pix())) as h:
        thread, card_id = await parked(h)
        await h.say(thread, "esquece, outra coisa", "alice")
        assert (await h.card(card_id)).status is Status.SUPERSEDED
        assert await h.bus.wait_holder(card_id) is None


async def test_an_approved_card_invalidated_with_its_run_leaves_no_token(
    database_url: str,
) -> None:
    """Approved (the token goes with the decision), then its run superseded before it ran:
    invalidated; no token at any point after the card left pending."""
    async with on_redis(database_url, model=Scripted(pix())) as h:
        thread, card_id = await parked(h)
        await h.worker.stop(release=False)
        await h.decide(await h.card(card_id), Decision.APPROVE)
        assert await h.bus.wait_holder(card_id) is None
        # Superseded before any worker could run it: a worker started first reclaims its
        # own runs at once and may execute the card before the message lands (a race the
        # test lost once in CI through PgBouncer).
        await h.say(thread, "esquece", "alice")
        assert (await h.card(card_id)).status is Status.INVALIDATED
        await h.worker.start()
        await h.settle()
        assert (await h.card(card_id)).status is Status.INVALIDATED
        assert await h.bus.wait_holder(card_id) is None
