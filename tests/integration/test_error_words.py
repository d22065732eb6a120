"""What a client is told when Postgres or Redis fails: never the driver's words, which
name hosts, ports and statements (an operator probe read ``Redis XADD failed after 4
tries: Error 111 connecting to 10.0.3.7:6379`` in a 503's body). The log keeps them.
Real drivers against a port nothing listens on."""

from __future__ import annotations

import pytest

from signoff.embedded import free_port
from signoff.gateway.errors import error_body
from signoff.runtime.bus import Job
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.errors import Unavailable, error_text
from signoff.runtime.keys import Keys
from signoff.store.postgres import PostgresStore

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def told(exc: Unavailable) -> str:
    return str(error_body(exc)) + error_text(exc)


async def test_a_redis_error_is_told_without_host_or_port() -> None:
    port = free_port()
    bus = RedisBus.from_url(f"redis://127.0.0.1:{port}/0", Keys("ew:"))
    try:
        with pytest.raises(Unavailable) as caught:
            await bus.enqueue(
                Job(thread_id="t", text="x", user="u", tenant="t", role="user", channel="http")
            )
    finally:
        await bus.close()
    assert str(port) in caught.value.message  # the log's words name it
    assert str(port) not in told(caught.value) and "127.0.0.1" not in told(caught.value)
    assert error_body(caught.value)["message"] == "Redis did not answer; try again"


async def test_a_postgres_error_is_told_without_host_or_port() -> None:
    port = free_port()
    with pytest.raises(Unavailable) as caught:
        await PostgresStore.connect(f"postgresql://signoff@127.0.0.1:{port}/x", timeout=2)
    assert str(port) in caught.value.message
    assert str(port) not in told(caught.value) and "127.0.0.1" not in told(caught.value)
    assert error_body(caught.value)["message"] == "the database did not answer; try again"
