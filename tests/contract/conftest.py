"""Backends for the bus contract suite: the in-process bus and Redis (a real server).

Each Redis test gets its own key prefix and client name, and its keys are deleted
afterwards, so tests can share one server with other test processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis

from signoff.runtime.bus.cluster import ClusterClient, cluster_from_url, is_cluster_url
from signoff.runtime.bus.memory import MemoryBus
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.keys import Keys
from tests import services
from tests.rediscluster import LocalCluster

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


@pytest.fixture
async def admin() -> AsyncIterator[aioredis.Redis]:
    """A plain client on the test server, to look at and break things from outside."""
    client = aioredis.Redis.from_url(services.redis_url())
    try:
        yield client
    finally:
        await client.aclose()


async def drop_keys_of(keys: Keys, url: str | None = None) -> None:
    """Delete every key under this test's prefix (on every master of a cluster)."""
    url = url or services.redis_url()
    if is_cluster_url(url):
        cluster = cluster_from_url(url)
        try:
            doomed = [key async for key in cluster.scan_iter(match=f"{keys.prefix}*", count=500)]
            for key in doomed:
                await cluster.delete(key)
        finally:
            await cluster.aclose()
        return
    admin = aioredis.Redis.from_url(url)
    try:
        doomed = [key async for key in admin.scan_iter(match=f"{keys.prefix}*", count=500)]
        if doomed:
            await admin.delete(*doomed)
    finally:
        await admin.aclose()


@asynccontextmanager
async def open_redis_bus(tag: str, keys: Keys, url: str | None = None) -> AsyncIterator[RedisBus]:
    """A bus on the test server (or on ``url``, e.g. the local cluster's), keys dropped after."""
    url = url or services.redis_url()
    bus = RedisBus.from_url(
        f"{url}{'&' if '?' in url else '?'}client_name={tag}", keys, claim_idle_ms=CLAIM_IDLE_MS
    )
    try:
        yield bus
    finally:
        try:
            async with asyncio.timeout(15):
                await bus.close()  # must end, whatever state the servers are in
        except TimeoutError:
            raise AssertionError("RedisBus.close() did not end in 15 s") from None
        # Best effort: the keys are under this test's own prefix. redis-py's cluster
        # client retries a failed cluster for a long time; a test that broke the cluster
        # reports that itself, its teardown does not hang on it.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(15):
                await drop_keys_of(keys, url)


@pytest.fixture
async def redis_bus(tag: str, keys: Keys) -> AsyncIterator[RedisBus]:
    """The Redis bus alone, for the Redis-only tests."""
    async with open_redis_bus(tag, keys) as bus:
        yield bus


@pytest.fixture
async def cluster_bus(tag: str, keys: Keys, redis_cluster: LocalCluster) -> AsyncIterator[RedisBus]:
    """The bus on the local Redis Cluster, for the cluster-only tests."""
    async with open_redis_bus(tag, keys, redis_cluster.url) as bus:
        assert isinstance(bus.client, ClusterClient)
        await bus.client.ready()  # the slot table, for tests that look up a key's node
        yield bus


@pytest.fixture(params=["memory", "redis", "cluster"])
async def bus(request: pytest.FixtureRequest, tag: str, keys: Keys) -> AsyncIterator[AnyBus]:
    """The bus under test, once per backend (a Redis Cluster is one)."""
    if request.param == "memory":
        memory = MemoryBus(claim_idle_ms=CLAIM_IDLE_MS)
        try:
            yield memory
        finally:
            await memory.close()
    elif request.param == "redis":
        async with open_redis_bus(tag, keys) as redis_bus:
            yield redis_bus
    else:
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        async with open_redis_bus(tag, keys, cluster.url) as cluster_bus:
            yield cluster_bus


async def redis_subscribers(admin: aioredis.Redis, channel: str, bus: AnyBus | None = None) -> int:
    """Redis-side subscriptions of a channel: PUBSUB NUMSUB, or on a cluster bus
    PUBSUB SHARDNUMSUB on the node holding the channel's slot."""
    if isinstance(bus, RedisBus) and isinstance(bus.client, ClusterClient):
        node = bus.client.node_of(channel)
        reply = await bus.client.cluster.execute_command(
            "PUBSUB SHARDNUMSUB", channel, target_nodes=node
        )
        [(_, count)] = reply
        return int(count)
    [(_, count)] = await admin.pubsub_numsub(channel)
    return int(count)
