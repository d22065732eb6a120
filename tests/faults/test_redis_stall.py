"""A Redis that stops answering (SIGSTOP: connections accepted, nothing replied).

Before: every bus call that met it waited out the socket timeout four times (a timeout
was retried like a refused connection), so a decision, committed at once, was answered
after ~65 s (its three hints after the commit, one after the other), a message's 503
came after ~41 s, and a worker's lease renewal waited behind its Redis heartbeat until
the lease lapsed. Now the first call that times out marks the client stalled: calls fail
at once until Redis answers a probe (``runtime/bus/client.py``, design note 42).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import websockets

from signoff.runtime.bus.client import STALL_PROBE_SECONDS, Client, redis_from_url
from signoff.runtime.decisions import Resolution
from signoff.runtime.errors import Unavailable
from signoff.testing.servers import EmbeddedServer
from tests.cluster import cluster
from tests.faults.conftest import Invariants
from tests.faults.helpers import approve, bearer, pending, runs_done, start_threads, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@pytest.fixture
def stall(valkey: EmbeddedServer) -> Iterator[tuple[EmbeddedServer, list[bool]]]:
    """SIGSTOP/SIGCONT of the private Redis; continued at the end whatever happened."""
    stopped = [False]
    yield valkey, stopped
    if stopped[0]:
        os.kill(valkey.pid, signal.SIGCONT)


def pause(server: EmbeddedServer, stopped: list[bool], on: bool) -> None:
    os.kill(server.pid, signal.SIGSTOP if on else signal.SIGCONT)
    stopped[0] = on


async def resume_answers(url: str, token: str, thread_id: str) -> list[dict[str, Any]]:
    """Every answer to one ``resume`` frame within 15 s."""
    async with websockets.connect(url.replace("http", "ws", 1) + "/v1/ws") as ws:
        await ws.send(json.dumps({"type": "auth", "token": token}))
        assert json.loads(await ws.recv())["type"] == "ready"
        await ws.send(json.dumps({"type": "resume", "id": "r1", "thread_id": thread_id}))
        answers = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(15):
                async for raw in ws:
                    frame = json.loads(raw)
                    if frame.get("id") == "r1":
                        answers.append(frame)
        return answers


@pytest.mark.no_store
async def test_a_stalled_redis_costs_one_timeout_then_calls_fail_at_once(
    stall: tuple[EmbeddedServer, list[bool]],
) -> None:
    server, stopped = stall
    client = Client(redis_from_url(server.url + "?socket_timeout=0.5"))
    try:
        await client.set_px("k", "v", 60_000)
        pause(server, stopped, True)
        t0 = time.monotonic()
        with pytest.raises(Unavailable):
            await client.get("k")
        first = time.monotonic() - t0
        assert 0.4 < first < 1.5, first  # one socket timeout, not four
        assert client.stalled
        t0 = time.monotonic()
        results = await asyncio.gather(
            *(client.get("k") for _ in range(20)), return_exceptions=True
        )
        assert all(isinstance(r, Unavailable) for r in results)
        assert time.monotonic() - t0 < 0.3  # no probe due yet: none of them waited

        await asyncio.sleep(STALL_PROBE_SECONDS + 0.1)
        t0 = time.monotonic()
        probe, *rest = await asyncio.gather(
            *(client.get("k") for _ in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, Unavailable) for r in (probe, *rest))
        assert time.monotonic() - t0 < 1.5  # the one probe waited its own bound

        pause(server, stopped, False)
        await asyncio.sleep(STALL_PROBE_SECONDS + 0.1)
        assert await client.get("k") == b"v"  # the probe is answered: the stall is over
        assert not client.stalled
        assert await client.get("k") == b"v"
    finally:
        await client.close()


@pytest.mark.no_store
async def test_calls_in_flight_when_redis_stalls_fail_together_not_in_waves(
    stall: tuple[EmbeddedServer, list[bool]],
) -> None:
    """The reviewer's repro: 16 XADDs through a pool of 4 connections when Redis stalls.
    Each connection's call timed out on its own, then the next 4 got the connections and
    waited out their own timeout: failures in waves (1, 2, 3, 4 s). Now the first timeout
    cuts every call in flight short."""
    server, stopped = stall
    url = server.url + "?socket_timeout=1"
    client = Client(redis_from_url(url, max_connections=4, pool_timeout=5))
    try:
        await client.xadd("s", b"f", b"v")
        pause(server, stopped, True)
        t0 = time.monotonic()
        done: list[float] = []

        async def one() -> None:
            with pytest.raises(Unavailable):
                await client.xadd("s", b"f", b"v")
            done.append(time.monotonic() - t0)

        await asyncio.gather(*(one() for _ in range(16)))
        assert max(done) < 1.8, sorted(done)  # one timeout (1 s) for all, not four waves
        # a blocking read is never the probe: it fails at once while stalled
        await asyncio.sleep(STALL_PROBE_SECONDS + 0.1)
        t0 = time.monotonic()
        with pytest.raises(Unavailable):
            await client.call("XREADGROUP", lambda: asyncio.sleep(30), blocking=True)
        assert time.monotonic() - t0 < 0.2
        pause(server, stopped, False)
        await asyncio.sleep(STALL_PROBE_SECONDS + 0.1)
        await client.xadd("s", b"f", b"v")  # the probe: answered, the stall is over
        assert not client.stalled
    finally:
        await client.close()


@pytest.mark.no_store
async def test_a_name_that_does_not_resolve_is_unavailable() -> None:
    """A DNS failure is an OSError, not a ConnectionError: it escaped the pipelined path
    raw (a 500 for a caller that expects Unavailable)."""
    client = Client(redis_from_url("redis://redis-gone.invalid:6379/0?socket_timeout=1"))
    try:
        with pytest.raises(Unavailable):
            await client.publish("c", b"m")
    finally:
        await client.close()


@pytest.mark.slow  # ~15-30 s: the default run leaves it to `pytest -m slow`
async def test_decisions_are_answered_soon_while_redis_stalls_and_applied_once(
    database_url: str,
    stall: tuple[EmbeddedServer, list[bool]],
    tmp_path: Path,
    invariants: Invariants,
) -> None:
    """The hostile reviewer's repro on a gateway and a worker: cards shown, Redis
    SIGSTOPped, three approvals. Each is committed, then answered 200 within one socket
    timeout (the first) or at once; a message gets its 503 within one; the worker applies
    every decision from its poll of Postgres; once Redis answers again, hints flow."""
    server, stopped = stall
    with cluster(
        database_url,
        server.url,
        tmp_path,
        gateways=1,
        workers=1,
        SIGNOFF_POLL_SECONDS="1",
    ) as c:
        invariants.watch_cluster(c)
        (gw,) = c.gateways
        db = await asyncpg.connect(database_url)
        try:
            threads = await start_threads(c, gw.url, [f"st{i}" for i in range(3)])
            cards = await wait_until(lambda: pending(db, c.tenant, 3), what="3 cards")
            pause(server, stopped, True)
            t0 = time.monotonic()
            assert await approve(c, gw.url, cards[:1]) == [200]
            assert time.monotonic() - t0 < 8  # was ~65 s: one timeout now (5 s)
            t0 = time.monotonic()
            assert await approve(c, gw.url, cards[1:]) == [200, 200]
            assert time.monotonic() - t0 < 3  # the stall is known: no wait
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                thread = (await http.post("/v1/threads", headers=bearer(c, "st9"))).json()
                t0 = time.monotonic()
                r = await http.post(
                    f"/v1/threads/{thread['thread']['id']}/messages",
                    json={"text": "cobre 12 do João"},
                    headers=bearer(c, "st9"),
                )
                assert r.status_code == 503, r.text
                assert time.monotonic() - t0 < 8  # was ~41 s
            await wait_until(lambda: runs_done(db, c.tenant, 3), timeout=30, what="3 applied")
            # A resume whose thread feed cannot be listened to gets one answer, an error;
            # it got an ack, then the error ten seconds later, and followed nothing.
            answers = await resume_answers(gw.url, c.token("st0"), threads[0])
            assert [(a["type"], a.get("status")) for a in answers] == [("error", 503)]
            # Renewing the worker's lease never waits on Redis (its heartbeat has its own
            # loop): the worker still holds its lease after the whole stall.
            (wk,) = c.workers
            assert await db.fetchval(
                "SELECT lease_until > now() FROM workers WHERE id = $1", wk.name
            )

            pause(server, stopped, False)
            await start_threads(c, gw.url, ["st-after"])
            after = await wait_until(lambda: pending(db, c.tenant, 1), timeout=30, what="card")
            assert await approve(c, gw.url, after) == [200]
            await wait_until(lambda: runs_done(db, c.tenant, 4), timeout=30, what="4 done")
            await invariants.check()
        finally:
            await db.close()


@pytest.mark.slow  # 11-12 s: the default run leaves it to `pytest -m slow` (CI runs it)
@pytest.mark.no_store
async def test_a_decision_waits_for_its_hints_at_most_their_budget_on_a_stalled_cluster(
    database_url: str,
) -> None:
    """A Redis Cluster client retries a timeout for ~6 s to ride a failover: with every
    node paused, each of a decision's three hints took up to a minute before the answer
    went out. The answer now waits at most HINTS_BUDGET_SECONDS for all of them; the
    decision is committed either way."""
    from signoff.runtime.bus.redis import RedisBus
    from signoff.runtime.cards import Decision, Status
    from signoff.runtime.decisions import HINTS_BUDGET_SECONDS
    from signoff.runtime.keys import Keys
    from tests.harness import harness
    from tests.integration.test_decisions import Scripted, one_card, pix
    from tests.rediscluster import local_cluster

    with local_cluster() as rc:
        bus = RedisBus.from_url(rc.url, Keys("stall-cluster:"))
        async with harness(database_url, model=Scripted(pix()), bus=bus) as h:
            card = await one_card(h)
            paused = list(rc.processes.values())
            for proc in paused:
                os.kill(proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                await h.decisions.resolve(
                    card.id,
                    Resolution(decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash),
                    principal=card.owner,
                    channel="test",
                    tenant=h.tenant,
                )
                took = time.monotonic() - t0
            finally:
                for proc in paused:
                    os.kill(proc.pid, signal.SIGCONT)
            assert took < HINTS_BUDGET_SECONDS + 2.5, took
            assert (await h.store.get_card(card.id)).status in (
                Status.APPROVED,
                Status.EXECUTING,
                Status.EXECUTED,
            )
