"""Backends for the bus contract suite: the in-process bus and Redis (a real server).

Each Redis test gets its own key prefix and client name, and its keys are deleted
afterwards, so tests can share one server with other test processes.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis

from signoff.runtime.bus_memory import MemoryBus
from signoff.runtime.bus_redis import RedisBus
from signoff.runtime.keys import Keys
from tests import services

# Short enough for tests to wait out; the contract says nothing about the exact value.
CLAIM_IDLE_MS = 200

AnyBus = MemoryBus | RedisBus


@pytest.fixture
def tag() -> str:
    """A unique tag per test: key prefix and Redis client name."""
    return f"so-test-{secrets.token_hex(6)}"


@pytest.fixture
def keys(tag: str) -> Keys:
    return Keys(f"{tag}:")


def redis_bus_url(tag: str) -> str:
    """The test server's URL, naming this test's connections (to find them in CLIENT LIST)."""
    url = services.redis_url()
    return f"{url}{'&' if '?' in url else '?'}client_name={tag}"


@pytest.fixture
async def admin() -> AsyncIterator[aioredis.Redis]:
    """A plain client on the test server, to look at and break things from outside."""
    client = aioredis.Redis.from_url(services.redis_url())
    try:
        yield client
    finally:
        await client.aclose()


async def drop_keys_of(keys: Keys) -> None:
    """Delete every key under this test's prefix."""
    admin = aioredis.Redis.from_url(services.redis_url())
    try:
        doomed = [key async for key in admin.scan_iter(match=f"{keys.prefix}*", count=500)]
        if doomed:
            await admin.delete(*doomed)
    finally:
        await admin.aclose()


@asynccontextmanager
async def open_redis_bus(tag: str, keys: Keys) -> AsyncIterator[RedisBus]:
    bus = RedisBus.from_url(redis_bus_url(tag), keys, claim_idle_ms=CLAIM_IDLE_MS)
    try:
        yield bus
    finally:
        await bus.close()
        await drop_keys_of(keys)


@pytest.fixture
async def redis_bus(tag: str, keys: Keys) -> AsyncIterator[RedisBus]:
    """The Redis bus alone, for the Redis-only tests."""
    async with open_redis_bus(tag, keys) as bus:
        yield bus


@pytest.fixture(params=["memory", "redis"])
async def bus(request: pytest.FixtureRequest, tag: str, keys: Keys) -> AsyncIterator[AnyBus]:
    """The bus under test, once per backend."""
    if request.param == "memory":
        memory = MemoryBus(claim_idle_ms=CLAIM_IDLE_MS)
        try:
            yield memory
        finally:
            await memory.close()
    else:
        async with open_redis_bus(tag, keys) as redis_bus:
            yield redis_bus
