"""Postgres faults: stalled (SIGSTOP), restarted mid-transaction, slow or half-open links,
and a provider that commits but answers after its client gave up.

The stalled and restarted server is a private cluster (``private_pg``), never the
machine's, which other suites share.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest
import websockets

from signoff.runtime.cards import Decision, Status
from tests.cluster import Cluster, cluster
from tests.faults.conftest import Invariants, PrivatePostgres, Profile, fresh_migrated_db
from tests.faults.helpers import (
    approve,
    bearer,
    count,
    pending,
    runs_done,
    start_threads,
    wait_until,
)
from tests.faults.proxy import Proxy
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

DB_TIMEOUT = 2.0


async def ready(c: Cluster) -> bool:
    async with httpx.AsyncClient(timeout=5) as http:
        try:
            return (await http.get(c.gateways[0].url + "/readyz")).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.mark.slow  # ~15 s: the default run leaves it to `pytest -m slow` (CI runs it)
async def test_postgres_stalled_then_continued_gives_503_and_nothing_half_written(
    private_pg: PrivatePostgres,
    redis_url: str,
    tmp_path: Path,
    profile: Profile,
    invariants: Invariants,
) -> None:
    """I9 + I4: while every Postgres process is SIGSTOPped, decisions (HTTP and WebSocket),
    reads and new messages answer a typed, retriable 503 within the store timeout instead
    of hanging; afterwards each card is untouched or fully decided with its audit row, and
    retrying the decisions executes each card exactly once."""
    url = fresh_migrated_db(private_pg.url)
    with cluster(
        url,
        redis_url,
        tmp_path,
        gateways=1,
        workers=1,
        SIGNOFF_DB_TIMEOUT_SECONDS=str(DB_TIMEOUT),
        SIGNOFF_POLL_SECONDS="1",
    ) as c:
        invariants.watch_cluster(c)
        gw = c.gateways[0]
        users = [f"st{i}" for i in range(5)]
        threads = await start_threads(c, gw.url, users)
        db = await asyncpg.connect(url)
        cards = await wait_until(lambda: pending(db, c.tenant, 5), what="5 cards")
        await db.close()
        ws = await websockets.connect(gw.url.replace("http", "ws") + "/v1/ws")
        await ws.send(json.dumps({"type": "auth", "token": c.token(cards[0]["owner"])}))
        assert json.loads(await ws.recv())["type"] == "ready"

        private_pg.stall()
        stalled_at = time.monotonic()
        try:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:

                async def resolve(card: asyncpg.Record) -> httpx.Response:
                    return await http.post(
                        f"/v1/cards/{card['id']}/resolve",
                        json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
                        headers=bearer(c, card["owner"]),
                    )

                t0 = time.monotonic()
                answers = await asyncio.gather(
                    *(resolve(card) for card in cards[1:]),
                    http.get(f"/v1/cards/{cards[0]['id']}", headers=bearer(c, users[0])),
                    http.post(
                        f"/v1/threads/{threads[0]}/messages",
                        json={"text": "saldo"},
                        headers=bearer(c, users[0]),
                    ),
                    http.get("/readyz"),
                )
                took = time.monotonic() - t0
                for r in answers:
                    assert r.status_code == 503, r.text
                for r in answers[:-1]:
                    assert r.json()["error"] == "unavailable", r.text
                    assert r.headers.get("retry-after"), r.headers
                assert took < DB_TIMEOUT * 4, f"callers waited {took:.1f}s"
                await ws.send(
                    json.dumps(
                        {
                            "type": "resolve",
                            "id": "during-stall",
                            "card_id": cards[0]["id"],
                            "decision": "approve",
                            "snapshot_hash": cards[0]["snapshot_hash"],
                        }
                    )
                )
                while True:
                    msg = json.loads(await asyncio.wait_for(ws.recv(), DB_TIMEOUT * 4))
                    if msg.get("id") == "during-stall":
                        break
                assert msg["type"] == "error" and msg["status"] == 503, msg
            left = profile.stall_seconds - (time.monotonic() - stalled_at)
            if left > 0:
                await asyncio.sleep(left)
        finally:
            private_pg.resume()
        await ws.close()

        await wait_until(lambda: ready(c), what="gateway ready again")
        db = await asyncpg.connect(url)
        try:
            # nothing half-written: untouched, or decided together with its audit row
            for card in cards:
                status = await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"])
                trail = [
                    r["to_status"]
                    for r in await db.fetch(
                        "SELECT to_status FROM card_events WHERE card_id = $1 ORDER BY id",
                        card["id"],
                    )
                ]
                assert trail[0] == "pending" and (status == "pending") == (trail == ["pending"])
            # the client retries what got a 503
            codes = await approve(c, gw.url, cards)
            assert set(codes) <= {200, 409}, codes
            await wait_until(lambda: runs_done(db, c.tenant, 5), timeout=60, what="runs done")
            executed = await count(
                db, "SELECT count(*) FROM cards WHERE tenant = $1 AND status = 'executed'", c.tenant
            )
            assert executed == 5
            await invariants.check()
        finally:
            await db.close()


SLOW_AUDIT = """
CREATE TABLE fault_slow_audit (on_ boolean);
INSERT INTO fault_slow_audit VALUES (true);
CREATE FUNCTION fault_slow_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.to_status = 'approved' AND EXISTS (SELECT 1 FROM fault_slow_audit) THEN
        PERFORM pg_sleep(60);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fault_slow_audit BEFORE INSERT ON card_events
    FOR EACH ROW EXECUTE FUNCTION fault_slow_audit();
"""


async def test_postgres_restarted_mid_transaction_leaves_nothing_half_written(
    private_pg: PrivatePostgres, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """I8 + I6: Postgres restarts while a decision's transaction has updated the card but
    not yet written its audit row. The caller gets a 503, the card is still pending with no
    trace of the half-done decision, and the retried decision executes it once."""
    url = fresh_migrated_db(private_pg.url)
    db = await asyncpg.connect(url)
    await db.execute(SLOW_AUDIT)  # test-only: the audit insert of an approval blocks
    await db.close()
    with cluster(
        url,
        redis_url,
        tmp_path,
        gateways=1,
        workers=1,
        SIGNOFF_DB_TIMEOUT_SECONDS="30",  # the restart, not the timeout, ends the transaction
        SIGNOFF_POLL_SECONDS="1",
    ) as c:
        invariants.watch_cluster(c)
        gw = c.gateways[0]
        await start_threads(c, gw.url, ["rs0"])
        db = await asyncpg.connect(url)
        (card,) = await wait_until(lambda: pending(db, c.tenant, 1), what="the card")
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            decision = asyncio.create_task(
                http.post(
                    f"/v1/cards/{card['id']}/resolve",
                    json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
                    headers=bearer(c, "rs0"),
                )
            )

            async def mid_transaction() -> bool:
                n = await db.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                )
                return bool(n)

            await wait_until(mid_transaction, what="the decision inside its transaction")
            await db.close()
            await asyncio.to_thread(private_pg.restart)
            r = await decision
            assert r.status_code == 503, r.text
        db = await asyncpg.connect(url)
        try:
            await db.execute("DELETE FROM fault_slow_audit")
            row = await db.fetchrow(
                "SELECT status, decided_by FROM cards WHERE id = $1", card["id"]
            )
            assert row is not None and (row["status"], row["decided_by"]) == ("pending", None)
            trail = await db.fetch(
                "SELECT to_status FROM card_events WHERE card_id = $1", card["id"]
            )
            assert [t["to_status"] for t in trail] == ["pending"]
            await wait_until(lambda: ready(c), what="gateway ready again")

            async def approved() -> bool:
                (code,) = await approve(c, gw.url, [card])
                return code == 200

            await wait_until(approved, every=0.5, what="the retried decision")
            await wait_until(lambda: runs_done(db, c.tenant, 1), timeout=60, what="run done")
            assert await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"]) == (
                "executed"
            )
            await invariants.check()
        finally:
            await db.close()


@pytest.fixture
async def slow_provider(database_url: str) -> AsyncIterator[tuple[Harness, Proxy]]:
    """A harness whose demo provider sits behind the proxy with a 0.5 s client timeout."""
    port = int(database_url.rsplit(":", 1)[1].split("/")[0])
    with Proxy(port) as proxy:
        async with harness(database_url, model=Scripted(pix("33"))) as h:
            direct = h.provider.pool
            h.provider.pool = await asyncpg.create_pool(
                proxy.url_for(database_url), min_size=1, max_size=5, command_timeout=0.5
            )
            try:
                yield h, proxy
            finally:
                await h.provider.pool.close()
                h.provider.pool = direct


async def test_provider_commits_but_replies_after_the_client_timeout(
    slow_provider: tuple[Harness, Proxy], database_url: str, invariants: Invariants
) -> None:
    """I4: the provider commits the charge but its answer comes after the client's
    timeout. That is an unknown outcome, not a failure: the worker asks again with the same
    idempotency key, the provider answers with the charge it already made, and the card is
    `executed` with exactly one charge (never `failed` with a charge behind it)."""
    h, proxy = slow_provider
    invariants.watch(database_url, h.tenant)
    card = await one_card(h)
    proxy.hold_replies_after(card.operation_id.encode(), seconds=2.0)
    await h.decide(card, Decision.APPROVE)
    await h.settle(timeout=20)
    final = await h.store.get_card(card.id)
    assert final.status is Status.EXECUTED, final.result
    keyed = await h.provider.pool.fetchval(
        "SELECT count(*) FROM demo_charges WHERE idempotency_key = $1", card.operation_id
    )
    assert keyed == 1 and await h.charges() == 1
    assert proxy._hold is None  # the reply really was held once
    await invariants.check()


@pytest.mark.slow  # ~15-30 s: the default run leaves it to `pytest -m slow`
async def test_postgres_latency_and_half_open_connections(
    database_url: str, redis_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """I9 + I4: the gateway talks to Postgres through a proxy. With 20 ms of latency each
    way everything works exactly once; when its pooled connections go half-open (packets
    vanish, no FIN, no RST) callers get a 503 within the store timeout, never a hang, and
    the pool heals on fresh connections."""
    port = int(database_url.rsplit(":", 1)[1].split("/")[0])
    with Proxy(port) as proxy:
        with cluster(
            database_url,
            redis_url,
            tmp_path,
            gateways=0,
            workers=1,
            SIGNOFF_POLL_SECONDS="1",
        ) as c:
            gw = c.add_gateway(
                SIGNOFF_DATABASE_URL=proxy.url_for(database_url),
                SIGNOFF_DB_TIMEOUT_SECONDS=str(DB_TIMEOUT),
            )
            invariants.watch_cluster(c)
            proxy.delay(up=0.02, down=0.02)
            db = await asyncpg.connect(database_url)
            try:
                users = [f"ho{i}" for i in range(10)]
                await start_threads(c, gw.url, users)
                cards = await wait_until(lambda: pending(db, c.tenant, 10), what="10 cards")
                assert await approve(c, gw.url, cards[:5]) == [200] * 5
                proxy.delay()
                dead = proxy.blackhole()
                assert dead >= 1
                t0 = time.monotonic()
                codes = await approve(c, gw.url, cards[5:])
                took = time.monotonic() - t0
                assert set(codes) <= {200, 503}, codes
                assert took < DB_TIMEOUT * 6, f"callers waited {took:.1f}s"

                async def all_approved() -> bool:
                    left = [
                        card
                        for card in cards[5:]
                        if await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"])
                        == "pending"
                    ]
                    return not left or set(await approve(c, gw.url, left)) == {200}

                await wait_until(all_approved, every=0.5, what="retries succeed")
                await wait_until(lambda: runs_done(db, c.tenant, 10), timeout=60, what="done")
                await invariants.check()
            finally:
                await db.close()
