"""runtime.bus.pipe: the pipelined connection behind the bus's hot commands (real Redis)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
from redis import exceptions as rx

from signoff.runtime.bus.pipe import Pipe
from tests import services

pytestmark = pytest.mark.anyio


@pytest.fixture
def redis_url() -> str:
    return services.redis_url()


def kwargs_of(url: str) -> dict[str, Any]:
    client = aioredis.Redis.from_url(url)
    return dict(client.connection_pool.connection_kwargs)


async def test_replies_match_their_commands_under_concurrency(redis_url: str) -> None:
    pipe = await Pipe.open(kwargs_of(redis_url), 5.0)
    tag = secrets.token_hex(4)
    try:
        keys = [f"pipe-{tag}-{i}" for i in range(500)]
        assert await asyncio.gather(*(pipe.call(b"SET", k, k, b"PX", 60_000) for k in keys)) == [
            b"OK"
        ] * len(keys)
        got = await asyncio.gather(*(pipe.call(b"GET", k) for k in reversed(keys)))
        assert got == [k.encode() for k in reversed(keys)]
        # an error reply fails its own command only
        await pipe.call(b"RPUSH", f"pipe-{tag}-list", b"x")
        with pytest.raises(rx.ResponseError):
            await pipe.call(b"GET", f"pipe-{tag}-list")
        assert await pipe.call(b"GET", keys[0]) == keys[0].encode()
        assert await pipe.call(b"DEL", *keys, f"pipe-{tag}-list") == len(keys) + 1
    finally:
        pipe.close()


async def test_a_caller_that_gives_up_does_not_shift_the_replies(redis_url: str) -> None:
    pipe = await Pipe.open(kwargs_of(redis_url), 5.0)
    key = f"pipe-{secrets.token_hex(4)}"
    try:
        await pipe.call(b"SET", key, b"mine", b"PX", 60_000)
        blocked = asyncio.ensure_future(pipe.call(b"BLPOP", key + "-empty", "0.3"))
        await asyncio.sleep(0.05)
        blocked.cancel()
        # BLPOP's nil reply comes first and must go to nobody
        assert await pipe.call(b"GET", key) == b"mine"
        assert not pipe.closed
    finally:
        pipe.close()


async def test_a_timeout_or_a_drop_fails_everything_in_flight(redis_url: str) -> None:
    pipe = await Pipe.open(kwargs_of(redis_url), 0.2)
    key = f"pipe-{secrets.token_hex(4)}"
    with pytest.raises(TimeoutError):
        await pipe.call(b"BLPOP", key, 2)
    assert pipe.closed
    with pytest.raises(ConnectionError):
        await pipe.call(b"GET", key)

    pipe = await Pipe.open(kwargs_of(redis_url), 5.0)
    client_id = await pipe.call(b"CLIENT", b"ID")
    waiting = asyncio.ensure_future(pipe.call(b"BLPOP", key, 3))
    await asyncio.sleep(0.05)
    killer = aioredis.Redis.from_url(redis_url)
    try:
        # redis-py leaves execute_command unannotated
        kill = cast(Callable[..., Awaitable[Any]], killer.execute_command)
        await kill("CLIENT", "KILL", "ID", client_id)
    finally:
        await killer.aclose()
    with pytest.raises(ConnectionError):
        await waiting
    assert pipe.closed


async def test_an_argument_that_cannot_be_packed_queues_nothing(redis_url: str) -> None:
    """A str with a lone surrogate fails its own call before anything is queued: the
    replies of the commands after it still reach their own callers (issue 10, item 5)."""
    pipe = await Pipe.open(kwargs_of(redis_url), 5.0)
    tag = secrets.token_hex(4)
    a, b = f"pipe-{tag}-a", f"pipe-{tag}-b"
    try:
        await pipe.call(b"SET", a, b"value-a", b"PX", 60_000)
        await pipe.call(b"SET", b, b"value-b", b"PX", 60_000)
        with pytest.raises(UnicodeEncodeError):
            await pipe.call(b"GET", "bad-\udcff")
        assert await pipe.call(b"GET", a) == b"value-a"
        assert await pipe.call(b"GET", b) == b"value-b"
        assert not pipe.closed
    finally:
        pipe.close()


@pytest.mark.parametrize("reply", ["READONLY You cannot write against a replica.", "LOADING x"])
async def test_a_connection_is_retired_on_readonly_or_loading(redis_url: str, reply: str) -> None:
    """A server that says it cannot serve this connection now (a replica after a failover,
    a server loading its data) gets nothing more: the command and every other in flight
    fail as on a dropped connection, which the bus retries on a new one."""
    pipe = await Pipe.open(kwargs_of(redis_url), 5.0)
    key = f"pipe-{secrets.token_hex(4)}"
    try:
        script = f"return redis.error_reply('{reply}')"
        results = await asyncio.gather(
            pipe.call(b"EVAL", script, 0),
            pipe.call(b"GET", key),
            return_exceptions=True,
        )
        assert all(isinstance(r, ConnectionError) for r in results), results
        assert pipe.closed
        with pytest.raises(ConnectionError):
            await pipe.call(b"GET", key)
    finally:
        pipe.close()
