"""runtime.redis_pipe: the pipelined connection behind the bus's hot commands (real Redis)."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis import exceptions as rx

from runtime.redis_pipe import Pipe
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
        blocked = asyncio.ensure_future(pipe.call(b"BLPOP", key + "-empty", 0.3))
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
        await killer.execute_command("CLIENT", "KILL", "ID", client_id)
    finally:
        await killer.aclose()
    with pytest.raises(ConnectionError):
        await waiting
    assert pipe.closed
