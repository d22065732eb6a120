"""Gateway and worker pools as separate OS processes, joined by Redis and Postgres."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import asyncpg
import httpx
import pytest
import websockets

from tests import services
from tests.cluster import Cluster, cluster
from tests.faults.helpers import inbox_drained, runs_settled

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]


@pytest.fixture
def redis_url() -> str:
    return services.redis_url()


@pytest.fixture
def pools(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with cluster(
        database_url, redis_url, tmp_path, gateways=2, workers=2, SIGNOFF_LEASE_SECONDS="3"
    ) as c:
        yield c


def headers(c: Cluster, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {c.token(user)}"}


async def wait_until(fn: Any, timeout: float = 30.0, every: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await fn()
        if value:
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"not met within {timeout:.0f}s: {what or fn}")


async def test_chat_on_a_approve_on_b(pools: Cluster) -> None:
    a, b = pools.gateways
    ws = await websockets.connect(a.url.replace("http", "ws") + "/v1/ws")
    await ws.send(json.dumps({"type": "auth", "token": pools.token("ana")}))
    assert json.loads(await ws.recv())["type"] == "ready"
    await ws.send(json.dumps({"type": "message", "text": "cobre 150 do João", "id": "m"}))
    card = None
    while card is None:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 20))
        if msg["type"] == "event" and msg["kind"] == "card":
            card = msg["data"]
    async with httpx.AsyncClient(base_url=b.url, headers=headers(pools, "ana")) as http:
        r = await http.post(
            f"/v1/cards/{card['id']}/resolve",
            json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
        )
        assert r.status_code == 200, r.text
    statuses = []
    while "executed" not in statuses:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 20))
        if msg["type"] == "event" and msg["kind"] == "card_update":
            statuses.append(msg["data"]["status"])
    assert statuses == ["approved", "executing", "executed"]
    while True:  # the result reaches the client on A, through the model's reply
        msg = json.loads(await asyncio.wait_for(ws.recv(), 20))
        if msg["type"] == "event" and msg["kind"] == "run":
            assert msg["data"]["status"] == "done"
            break
    await ws.close()


async def parked_threads(
    c: Cluster, gw_url: str, n: int, user_prefix: str = "u", text: str = "cobre 12 do João"
) -> list[tuple[str, str]]:
    """Start n threads that each park on one card; returns (user, thread_id)."""
    out: list[tuple[str, str]] = []
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=gw_url, limits=limits, timeout=30) as http:
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> tuple[str, str]:
            user = f"{user_prefix}{i}"
            async with sem:
                r = await http.post("/v1/threads", headers=headers(c, user))
                thread = r.json()["thread"]["id"]
                r = await http.post(
                    f"/v1/threads/{thread}/messages", json={"text": text}, headers=headers(c, user)
                )
                assert r.status_code == 202, r.text
            return user, thread

        out = list(await asyncio.gather(*(one(i) for i in range(n))))
    return out


async def pending_cards(db: asyncpg.Connection, tenant: str) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT id::text, owner, snapshot_hash, run_id::text FROM cards "
        "WHERE tenant = $1 AND status = 'pending' ORDER BY created_at",
        tenant,
    )


async def approve_all(c: Cluster, gw_url: str, cards: list[asyncpg.Record]) -> list[int]:
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=gw_url, limits=limits, timeout=30) as http:
        sem = asyncio.Semaphore(32)

        async def one(card: asyncpg.Record) -> int:
            async with sem:
                for attempt in range(3):
                    try:
                        r = await http.post(
                            f"/v1/cards/{card['id']}/resolve",
                            json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
                            headers=headers(c, card["owner"]),
                        )
                    except (httpx.ReadError, httpx.RemoteProtocolError):
                        if attempt == 2:
                            raise
                        continue  # the connection dropped: the decision may or may not be in
                    if attempt and r.status_code == 409:
                        # a retry after a dropped reply: ours if the same owner approved it
                        detail = r.json().get("detail", {})
                        if (
                            detail.get("status") != "pending"
                            and detail.get("decided_by") == card["owner"]
                        ):
                            return 200
                    return r.status_code
                raise AssertionError("unreachable")

        return list(await asyncio.gather(*(one(card) for card in cards)))


async def check_exactly_once(db: asyncpg.Connection, tenant: str, n: int) -> None:
    executed = await db.fetchval(
        "SELECT count(*) FROM cards WHERE tenant = $1 AND status = 'executed'", tenant
    )
    charges = await db.fetchval("SELECT count(*) FROM demo_charges WHERE tenant = $1", tenant)
    keyed = await db.fetchval(
        "SELECT count(*) FROM demo_charges d JOIN cards c ON c.operation_id::text = "
        "d.idempotency_key WHERE d.tenant = $1 AND c.status = 'executed'",
        tenant,
    )
    executing = await db.fetchval(
        "SELECT count(*) FROM card_events e JOIN cards c ON c.id = e.card_id "
        "WHERE c.tenant = $1 AND e.to_status = 'executing'",
        tenant,
    )
    others = await db.fetch(
        "SELECT id, status, result FROM cards WHERE tenant = $1 AND status <> 'executed'", tenant
    )
    assert (executed, charges, keyed, executing) == (n, n, n, n), [dict(r) for r in others]


async def all_runs_done(db: asyncpg.Connection, tenant: str, n: int) -> bool:
    done = await db.fetchval(
        "SELECT count(*) FROM runs WHERE tenant = $1 AND status = 'done'", tenant
    )
    return bool(done == n)


@pytest.mark.slow  # ~16 s: the default run leaves it to `pytest -m slow` (CI runs it)
async def test_500_threads_across_pools(pools: Cluster, database_url: str) -> None:
    a, b = pools.gateways
    db = await asyncpg.connect(database_url)
    try:
        n = 500
        await parked_threads(pools, a.url, n)
        cards = await wait_until(lambda: _count_pending(db, pools.tenant, n), timeout=90)
        codes = await approve_all(pools, b.url, cards)
        assert codes == [200] * n
        await wait_until(lambda: all_runs_done(db, pools.tenant, n), timeout=90)
        await check_exactly_once(db, pools.tenant, n)
    finally:
        await db.close()


async def _count_pending(db: asyncpg.Connection, tenant: str, n: int) -> list[asyncpg.Record]:
    cards = await pending_cards(db, tenant)
    return cards if len(cards) == n else []


@pytest.fixture
def one_worker(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """One gateway, one worker to start with: tests add the second worker themselves."""
    with cluster(
        database_url,
        redis_url,
        tmp_path,
        gateways=1,
        workers=1,
        SIGNOFF_LEASE_SECONDS="3",
        SIGNOFF_CLAIM_IDLE_MS="1000",
    ) as c:
        yield c


async def owners(db: asyncpg.Connection, tenant: str) -> set[str]:
    rows = await db.fetch(
        "SELECT DISTINCT worker_id FROM runs WHERE tenant = $1 AND status = 'waiting'", tenant
    )
    return {r["worker_id"] for r in rows}


async def test_kill9_worker_holding_100_parked_runs(one_worker: Cluster, database_url: str) -> None:
    c = one_worker
    (gw,) = c.gateways
    (w1,) = c.workers
    db = await asyncpg.connect(database_url)
    try:
        n = 100
        await parked_threads(c, gw.url, n)
        cards = await wait_until(lambda: _count_pending(db, c.tenant, n), timeout=60)
        assert await owners(db, c.tenant) == {w1.name}
        c.add_worker()
        before, after = cards[:50], cards[50:]
        assert await approve_all(c, gw.url, before[:25]) == [200] * 25
        # let those finish: a kill in the middle of an execution leaves a card in
        # `executing` for reconciliation by design (I4), which is the fault suite's case
        await wait_until(lambda: _executed(db, c.tenant, 25), timeout=30)
        killed_at = time.monotonic()
        w1.signal(signal.SIGKILL)
        w1.wait()
        assert await approve_all(c, gw.url, before[25:]) == [200] * 25  # decided while down
        await wait_until(lambda: all_runs_waiting_elsewhere(db, c.tenant, w1.name), timeout=20)
        adopted_in = time.monotonic() - killed_at
        assert await approve_all(c, gw.url, after) == [200] * 50
        await wait_until(lambda: all_runs_done(db, c.tenant, n), timeout=60)
        await check_exactly_once(db, c.tenant, n)
        assert adopted_in < 10, f"adoption took {adopted_in:.1f}s"
    finally:
        await db.close()


async def all_runs_waiting_elsewhere(db: asyncpg.Connection, tenant: str, dead: str) -> bool:
    held = await db.fetchval(
        "SELECT count(*) FROM runs WHERE tenant = $1 AND status IN ('running', 'waiting') "
        "AND worker_id = $2",
        tenant,
        dead,
    )
    return bool(held == 0)


async def test_sigterm_drains_to_the_other_worker(one_worker: Cluster, database_url: str) -> None:
    c = one_worker
    (gw,) = c.gateways
    (w1,) = c.workers
    db = await asyncpg.connect(database_url)
    try:
        n = 40
        await parked_threads(c, gw.url, n)
        cards = await wait_until(lambda: _count_pending(db, c.tenant, n), timeout=60)
        c.add_worker()
        w1.signal(signal.SIGTERM)
        assert w1.wait(30) == 0
        released = await db.fetchval(
            "SELECT count(*) FROM runs WHERE tenant = $1 AND worker_id = $2", c.tenant, w1.name
        )
        assert released == 0  # leases handed back at once, not left to lapse
        assert await approve_all(c, gw.url, cards) == [200] * n
        await wait_until(lambda: all_runs_done(db, c.tenant, n), timeout=60)
        await check_exactly_once(db, c.tenant, n)
    finally:
        await db.close()


async def test_inbox_entry_of_dead_worker_is_redone_without_duplicate_card(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    with cluster(
        database_url,
        redis_url,
        tmp_path,
        gateways=1,
        workers=0,
        SIGNOFF_LEASE_SECONDS="2",
        SIGNOFF_CLAIM_IDLE_MS="500",
    ) as c:
        doomed = c.add_worker(SIGNOFF_FAULTS="inbox.before_ack")
        (gw,) = c.gateways
        db = await asyncpg.connect(database_url)
        try:
            await parked_threads(c, gw.url, 1)
            await wait_until(lambda: _dead(doomed), timeout=30)
            c.add_worker()
            card = (await wait_until(lambda: _count_pending(db, c.tenant, 1), timeout=30))[0]
            # The survivor reclaims the dead worker's entry, handles it again (finding its
            # run) and acks it; only then do the counts say the redelivery added nothing.
            await wait_until(
                lambda: _redelivered(db, c), timeout=30, what="entry reclaimed and acked"
            )
            total = await db.fetchval("SELECT count(*) FROM cards WHERE tenant = $1", c.tenant)
            runs = await db.fetchval("SELECT count(*) FROM runs WHERE tenant = $1", c.tenant)
            assert (total, runs) == (1, 1)
            assert await approve_all(c, gw.url, [card]) == [200]
            await wait_until(lambda: all_runs_done(db, c.tenant, 1), timeout=30)
            await check_exactly_once(db, c.tenant, 1)
        finally:
            await db.close()


async def _redelivered(db: asyncpg.Connection, c: Cluster) -> bool:
    """The inbox drained and no run `running`: the redelivered entry was handled."""
    return await inbox_drained(c) and await runs_settled(db, c.tenant)


async def _executed(db: asyncpg.Connection, tenant: str, n: int) -> bool:
    done = await db.fetchval(
        "SELECT count(*) FROM cards WHERE tenant = $1 AND status = 'executed'", tenant
    )
    return bool(done >= n)


async def _dead(proc: Any) -> bool:
    return not proc.alive()


async def test_redis_restart_with_100_parked_runs(database_url: str, tmp_path: Path) -> None:
    from signoff.testing.servers import start_valkey

    valkey = start_valkey(tmp_path / "valkey")
    try:
        with cluster(
            database_url,
            valkey.url,
            tmp_path,
            gateways=1,
            workers=2,
            SIGNOFF_LEASE_SECONDS="3",
            SIGNOFF_POLL_SECONDS="1",
        ) as c:
            (gw,) = c.gateways
            db = await asyncpg.connect(database_url)
            try:
                n = 100
                await parked_threads(c, gw.url, n)
                cards = await wait_until(lambda: _count_pending(db, c.tenant, n), timeout=60)
                port = valkey.port
                valkey.stop()  # no persistence: tokens, streams and subscriptions are gone
                valkey = start_valkey(tmp_path / "valkey", port=port)
                codes = await approve_all(c, gw.url, cards)
                assert codes == [200] * n
                await wait_until(lambda: all_runs_done(db, c.tenant, n), timeout=60)
                await check_exactly_once(db, c.tenant, n)
                # the pools still serve new work after the restart
                await parked_threads(c, gw.url, 1, user_prefix="after")
                await wait_until(lambda: _count_pending(db, c.tenant, 1), timeout=30)
            finally:
                await db.close()
    finally:
        valkey.stop()


async def test_decision_published_before_subscribe_and_after_pubsub_kill(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    import redis.asyncio as aioredis

    with cluster(
        database_url,
        redis_url,
        tmp_path,
        gateways=1,
        workers=0,
        SIGNOFF_LEASE_SECONDS="3",
        SIGNOFF_POLL_SECONDS="30",
    ) as c:
        (gw,) = c.gateways
        w = c.add_worker("stable-w")
        db = await asyncpg.connect(database_url)
        r = aioredis.from_url(redis_url)
        try:
            await parked_threads(c, gw.url, 20)
            cards = await wait_until(lambda: _count_pending(db, c.tenant, 20), timeout=60)
            # 1. published while nobody is subscribed: the worker is dead, then comes back
            w.signal(signal.SIGKILL)
            w.wait()
            assert await approve_all(c, gw.url, cards[:10]) == [200] * 10
            c.add_worker("stable-w")  # same id: subscribes, re-reads Postgres, continues
            await wait_until(lambda: _executed(db, c.tenant, 10), timeout=30)
            # 2. subscriber connection killed; decisions published right after
            # redis-py leaves execute_command unannotated
            kill = cast(Callable[..., Awaitable[Any]], r.execute_command)
            killed = await kill("CLIENT", "KILL", "TYPE", "pubsub")
            assert int(killed) >= 1
            assert await approve_all(c, gw.url, cards[10:]) == [200] * 10
            # slow poll is 30 s: only the re-read on re-subscribe can apply these in time
            await wait_until(lambda: all_runs_done(db, c.tenant, 20), timeout=20)
            await check_exactly_once(db, c.tenant, 20)
        finally:
            await r.aclose()
            await db.close()
