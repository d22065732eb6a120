"""A Redis that refuses connections (down, restarting): one call's tries, then one try each.

A hostile probe: with Redis down, every Redis call of a process ran its own four tries
(~0.6 s) against the same refusal, so an approval (three hints after its commit) was
answered after ~1.7 s, and an "approve all" of three cards one after another took 5.4 s.
Now the first call that fails after its tries marks the client failing: each call then
gets one try and no retries (a refused connection fails at once), until one is answered
(``runtime/bus/client.py``, design note 63). The decisions stand either way: the
worker's poll finds them in Postgres.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest

from signoff.runtime.bus.client import Client, redis_from_url
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.errors import Unavailable
from signoff.runtime.keys import Keys
from signoff.testing.servers import EmbeddedServer
from tests.faults.conftest import Invariants
from tests.faults.proxy import Proxy
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.mark.no_store
async def test_a_refusing_redis_costs_one_calls_retries_then_one_try_each(
    valkey: EmbeddedServer,
) -> None:
    with Proxy(valkey.port) as proxy:
        client = Client(redis_from_url(proxy.url_for(valkey.url) + "?socket_timeout=2"))
        try:
            await client.set_px("k", "v", 60_000)
            proxy.refuse(True)
            proxy.reset()
            t0 = time.monotonic()
            with pytest.raises(Unavailable):
                await client.get("k")
            first = time.monotonic() - t0
            assert 0.3 < first < 1.5, first  # its tries, against the refusal
            assert client.failing
            t0 = time.monotonic()
            results = await asyncio.gather(
                *(client.get("k") for _ in range(20)), return_exceptions=True
            )
            assert all(isinstance(r, Unavailable) for r in results), results
            assert time.monotonic() - t0 < 0.2  # one try each, no retries

            proxy.refuse(False)
            assert await client.get("k") == b"v"  # the first call after the outage goes
            assert not client.failing
            assert await client.get("k") == b"v"
        finally:
            await client.close()


async def test_approvals_while_redis_is_down_are_answered_at_once_and_run_once(
    database_url: str, valkey: EmbeddedServer, invariants: Invariants
) -> None:
    """Three approvals one after another with Redis down: the first pays one call's
    tries, the others none; the worker's poll runs each card once; once Redis is back
    the hints flow again."""
    keys = Keys(f"down-{secrets.token_hex(3)}:")
    with Proxy(valkey.port) as proxy:
        bus = RedisBus.from_url(proxy.url_for(valkey.url), keys)
        async with harness(
            database_url,
            model=Scripted(pix("10")),
            bus=bus,
            settings=Settings(poll_seconds=0.2),
        ) as h:
            invariants.watch(database_url, h.tenant)
            cards = [await one_card(h, f"u{n}") for n in range(3)]
            proxy.refuse(True)
            proxy.reset()
            took = []
            for card in cards:
                t0 = time.monotonic()
                decided = await h.decide(card, Decision.APPROVE)
                took.append(time.monotonic() - t0)
                assert decided.card["status"] == "approved"
            assert sum(took) < 2.0, took  # was ~1.7 s each
            assert max(took[1:]) < 0.3, took
            deadline = asyncio.get_running_loop().time() + 10
            for card in cards:  # found by the worker's poll
                while (await h.store.get_card(card.id)).status is not Status.EXECUTED:
                    assert asyncio.get_running_loop().time() < deadline, "not run in the outage"
                    await asyncio.sleep(0.05)
            assert await h.charges() == 3

            proxy.heal()
            later = await one_card(h, "u9")  # its wait token's SET is answered: hints flow
            assert not bus.client.failing
            await h.decide(later, Decision.APPROVE)
            deadline = asyncio.get_running_loop().time() + 10
            while (await h.store.get_card(later.id)).status is not Status.EXECUTED:
                assert asyncio.get_running_loop().time() < deadline, "not run after the outage"
                await asyncio.sleep(0.05)
            await h.settle()
            assert await h.charges() == 4
            await invariants.check()
