""" "May have been applied" survives a retry (``Unavailable.maybe_applied``, design note 52).

A review found it lost: a call's first attempt reached Redis and then lost its
connection; the retry was refused (Redis answered READONLY after a failover) or never
sent (another call's timeout had meanwhile stalled the client), and the error said
nothing had been applied. A gateway then discarded the thread it had made for the
message, and the client sent it again: run twice, or dropped. Real Redis for the
single-server client; the cluster client's retry logic on a scripted call."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis import exceptions as rx
from redis.asyncio.cluster import RedisCluster

from signoff.runtime.bus.client import Client
from signoff.runtime.bus.cluster import ClusterClient
from signoff.runtime.errors import Unavailable
from tests import services

pytestmark = pytest.mark.anyio


@pytest.fixture
async def redis() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(services.redis_url(), protocol=2)
    yield client
    await client.aclose()


async def test_a_retry_never_sent_after_an_attempt_that_may_have_gone_out(
    redis: aioredis.Redis,
) -> None:
    client = Client(redis)
    stream = f"maybe-{secrets.token_hex(4)}"
    attempts = 0

    async def xadd() -> object:
        nonlocal attempts
        attempts += 1
        await redis.xadd(stream, {"job": "x"})  # applied ...
        client.stalled = True  # ... while another call's timeout stalled the client
        raise rx.ConnectionError("connection reset after the command went out")

    try:
        with pytest.raises(Unavailable) as caught:
            await client.call("XADD", xadd)
        assert attempts == 1
        assert await redis.xlen(stream) == 1
        assert caught.value.maybe_applied, caught.value
    finally:
        await redis.delete(stream)


async def test_a_retry_refused_after_an_attempt_that_may_have_gone_out(
    redis: aioredis.Redis,
) -> None:
    client = Client(redis)
    stream = f"maybe-{secrets.token_hex(4)}"
    attempts = 0

    async def xadd() -> object:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            await redis.xadd(stream, {"job": "x"})
            raise rx.ConnectionError("connection reset")
        raise rx.ReadOnlyError("You can't write against a read only replica.")

    try:
        with pytest.raises(Unavailable) as caught:
            await client.call("XADD", xadd)
        assert attempts == 2 and await redis.xlen(stream) == 1
        assert caught.value.maybe_applied, caught.value
    finally:
        await redis.delete(stream)


async def test_a_refusal_redis_answered_first_is_not_maybe_applied(
    redis: aioredis.Redis,
) -> None:
    """The other side: a WRONGTYPE answered on the first attempt applied nothing."""
    client = Client(redis)
    key = f"maybe-{secrets.token_hex(4)}"
    await redis.set(key, "a string", px=60_000)
    try:
        with pytest.raises(Unavailable) as caught:
            await client.call("XADD", lambda: redis.xadd(key, {"job": "x"}))
        assert not caught.value.maybe_applied
    finally:
        await redis.delete(key)


async def test_the_cluster_client_keeps_it_across_retries_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node dropped the connection after the command went out; the retry met a cluster
    that refused (CLUSTERDOWN is retried, a READONLY answer ends the call): may have
    been applied. A cluster's own refusals alone applied nothing."""
    client = ClusterClient(RedisCluster(host="127.0.0.1", port=1))  # never connected here

    async def refreshed() -> None:
        client._stale = False

    monkeypatch.setattr(client, "refresh", refreshed)
    monkeypatch.setattr("signoff.runtime.bus.cluster.CLUSTER_RETRY_DELAYS", (0.0, 0.0, 0.0))

    def script(*errors: Exception):  # type: ignore[no-untyped-def]
        left = list(errors)

        async def call() -> object:
            raise left.pop(0)

        return call

    with pytest.raises(Unavailable) as caught:
        await client.call(
            "XADD", script(rx.ConnectionError("reset"), rx.ResponseError("WRONGTYPE no"))
        )
    assert caught.value.maybe_applied
    with pytest.raises(Unavailable) as caught:
        await client.call(
            "XADD", script(rx.ClusterDownError("CLUSTERDOWN"), rx.ResponseError("WRONGTYPE no"))
        )
    assert not caught.value.maybe_applied


async def test_the_end_of_an_outage_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """An operator probe: after Redis came back nothing said so, and an outage's end could
    not be read from the log (only its ~150 warnings). Real Redis behind a refusing proxy."""
    from signoff.runtime.bus.redis import RedisBus
    from signoff.runtime.keys import Keys
    from tests.faults.proxy import Proxy

    port = int(services.redis_url().rsplit(":", 1)[1].split("/")[0])
    with Proxy(port) as proxy:
        bus = RedisBus.from_url(proxy.url_for(services.redis_url()), Keys("outage:"))
        try:
            proxy.refuse()
            with pytest.raises(Unavailable):
                await bus.publish("outage:channel", b"x")
            assert "Redis answers again" not in caplog.text
            proxy.refuse(False)
            await bus.publish("outage:channel", b"x")
            assert "Redis answers again" in caplog.text
            caplog.clear()
            await bus.publish("outage:channel", b"x")
            assert "Redis answers again" not in caplog.text  # once per outage
        finally:
            await bus.close()
