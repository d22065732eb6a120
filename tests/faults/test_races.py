"""Races between gateways: many approvals of one card, approve against reject, the deadline.

Real processes: 3 `signoff gateway` and 1 `signoff worker` on one Postgres and Redis.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Iterator

import asyncpg
import httpx
import pytest
import websockets

from tests.cluster import Cluster, cluster
from tests.faults.conftest import Invariants, Profile
from tests.faults.helpers import (
    approve,
    bearer,
    blast,
    count,
    pending,
    start_threads,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

SWEEP = 0.3


@pytest.fixture(scope="module")
def gateways3(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from tests import services

    with cluster(
        database_url,
        services.redis_url(),
        tmp_path_factory.mktemp("races"),
        gateways=3,
        workers=1,
        SIGNOFF_SWEEP_SECONDS=str(SWEEP),
        SIGNOFF_POLL_SECONDS="1",
    ) as c:
        yield c


@pytest.fixture
def c(gateways3: Cluster, database_url: str, invariants: Invariants) -> Cluster:
    invariants.watch_cluster(gateways3)
    return gateways3


@pytest.mark.slow  # 10-12 s; tests/integration/test_gateway.py races 200 in the default run
async def test_10000_concurrent_approvals_of_one_card_across_3_gateways_one_winner(
    c: Cluster, database_url: str, profile: Profile, invariants: Invariants
) -> None:
    """I4 + I9: N approvals of one card spread over 3 gateways (HTTP and WebSocket):
    exactly one 200, every other answer a typed 409 already_decided naming the winner;
    one approval audit row, one execution, one provider charge."""
    db = await asyncpg.connect(database_url)
    try:
        await start_threads(c, c.gateways[0].url, ["race-owner"])
        (card,) = await wait_until(lambda: pending(db, c.tenant, 1), what="the card")
        n = profile.approvals
        body = {"decision": "approve", "snapshot_hash": card["snapshot_hash"]}
        hdrs = bearer(c, "race-owner")
        codes: Counter[int] = Counter()
        errors: Counter[str] = Counter()
        winners: list[str] = []
        start = asyncio.Event()
        ws_share = n // 10  # a tenth goes over WebSocket `resolve` frames

        async def over_http(gw_url: str, k: int) -> None:
            await start.wait()
            path = f"/v1/cards/{card['id']}/resolve"
            for status, raw in await blast(gw_url, path, json.dumps(body).encode(), hdrs, k, 48):
                codes[status] += 1
                if status == 200:
                    winners.append(gw_url)
                elif status == 409:
                    detail = json.loads(raw)
                    errors[detail["error"]] += 1
                    assert detail["detail"]["decided_by"] == "race-owner"

        async def over_ws(gw_url: str, k: int) -> None:
            """k decisions over one socket, one at a time (within the per-socket burst)."""
            ws = await websockets.connect(gw_url.replace("http", "ws") + "/v1/ws")
            await ws.send(json.dumps({"type": "auth", "token": c.token("race-owner")}))
            assert json.loads(await ws.recv())["type"] == "ready"
            await start.wait()
            for i in range(k):
                frame = {"type": "resolve", "card_id": card["id"], "id": str(i), **body}
                await ws.send(json.dumps(frame))
                while True:
                    msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
                    if msg.get("id") == str(i):
                        break
                if msg["type"] == "resolved":
                    codes[200] += 1
                    winners.append("ws:" + gw_url)
                else:
                    codes[msg["status"]] += 1
                    if msg["status"] == 409:
                        errors[msg["error"]] += 1
            await ws.close()

        per_socket = 20  # within the per-socket burst: no 429 expected here
        sockets = ws_share // per_socket
        per_gw = (n - sockets * per_socket) // len(c.gateways)
        extra = n - sockets * per_socket - per_gw * len(c.gateways)
        jobs = [over_http(gw.url, per_gw + extra * (i == 0)) for i, gw in enumerate(c.gateways)]
        jobs += [over_ws(c.gateways[i % 3].url, per_socket) for i in range(sockets)]
        t0 = time.monotonic()
        task = asyncio.gather(*jobs)
        await asyncio.sleep(0.5)  # every client connected and queued behind the start line
        start.set()
        await task
        took = time.monotonic() - t0
        # Under overload a request may wait past the store timeout: a typed, retriable 503
        # that changed nothing. Never a second winner, never an untyped answer.
        busy = codes.pop(503, 0)
        assert busy <= n // 100, (busy, codes, took)
        assert codes == Counter({200: 1, 409: n - 1 - busy}), (codes, took)
        assert errors == Counter({"already_decided": n - 1 - busy})
        assert len(winners) == 1
        await wait_until(
            lambda: count(
                db, "SELECT count(*) FROM cards WHERE id = $1 AND status = 'executed'", card["id"]
            ),
            what="execution",
        )
        approvals = await count(
            db,
            "SELECT count(*) FROM card_events WHERE card_id = $1 AND to_status = 'approved'",
            card["id"],
        )
        assert approvals == 1
        await invariants.check()
    finally:
        await db.close()


async def test_approve_against_reject_across_gateways_one_decision_each(
    c: Cluster, database_url: str, invariants: Invariants
) -> None:
    """I4 + I8: approvals on one gateway race rejections on another for each of 20 cards:
    one decision per card, executed iff approved, the loser always a typed 409."""
    db = await asyncpg.connect(database_url)
    try:
        users = [f"ar{i}" for i in range(20)]
        await start_threads(c, c.gateways[0].url, users)
        cards = await wait_until(lambda: pending(db, c.tenant, 20), what="20 cards")
        a, b = c.gateways[1], c.gateways[2]
        results = await asyncio.gather(
            *(approve(c, a.url, cards, "approve") for _ in range(3)),
            *(approve(c, b.url, cards, "reject") for _ in range(3)),
        )
        approvals = [Counter(col) for col in zip(*results[:3], strict=True)]
        rejections = [Counter(col) for col in zip(*results[3:], strict=True)]
        for card, ok_a, ok_r in zip(cards, approvals, rejections, strict=True):
            assert ok_a[200] + ok_r[200] == 1, (card["id"], ok_a, ok_r)
            assert ok_a[409] + ok_r[409] == 5
        ids = [card["id"] for card in cards]

        async def settled() -> bool:
            n = await count(
                db,
                "SELECT count(*) FROM cards WHERE id = ANY($1::uuid[]) "
                "AND status IN ('executed', 'rejected')",
                ids,
            )
            return n == len(ids)

        await wait_until(settled, what="every card executed or rejected")
        won = sum(col[200] for col in approvals)
        executed = await count(
            db,
            "SELECT count(*) FROM cards WHERE id = ANY($1::uuid[]) AND status = 'executed'",
            ids,
        )
        assert executed == won
        await invariants.check()
    finally:
        await db.close()


async def test_decision_at_the_expiry_boundary(
    c: Cluster, database_url: str, invariants: Invariants
) -> None:
    """I7: deadlines a few hundred ms away, approvals fired around them while the sweeper
    runs every 0.3 s: a 200 only before the database's deadline, a typed 410 after it, no
    card both approved and expired, none left pending past its deadline + one sweep."""
    db = await asyncpg.connect(database_url)
    try:
        users = [f"exp{i}" for i in range(30)]
        await start_threads(c, c.gateways[0].url, users)
        cards = await wait_until(lambda: pending(db, c.tenant, 30), what="30 cards")
        rng = random.Random(7)
        offsets = {card["id"]: rng.uniform(0.05, 0.6) for card in cards}
        # Both sides of the deadline for sure, whatever the machine's load: one card has
        # long to go, one is already past; the others are decided right around theirs.
        offsets[cards[0]["id"]] = 30.0
        offsets[cards[1]["id"]] = -1.0
        await db.executemany(
            "UPDATE cards SET expires_at = now() + make_interval(secs => $2) WHERE id = $1",
            [(card["id"], offsets[card["id"]]) for card in cards],
        )
        t0 = time.monotonic()
        answers: dict[str, int] = {}
        async with httpx.AsyncClient(timeout=30) as http:

            async def fire(card: asyncpg.Record, gw_url: str) -> None:
                at = min(offsets[card["id"]], 0.7) + rng.uniform(-0.1, 0.1)
                await asyncio.sleep(max(at, 0))
                r = await http.post(
                    f"{gw_url}/v1/cards/{card['id']}/resolve",
                    json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
                    headers=bearer(c, card["owner"]),
                )
                # past the deadline: 410, whether or not the sweeper tidied it yet
                assert r.status_code in (200, 410), r.text
                if r.status_code == 410:
                    assert r.json()["error"] == "expired"
                answers[card["id"]] = r.status_code

            await asyncio.gather(
                *(fire(card, c.gateways[i % 3].url) for i, card in enumerate(cards))
            )
        assert time.monotonic() - t0 < 5
        assert answers[cards[0]["id"]] == 200 and answers[cards[1]["id"]] == 410
        ids = list(answers)

        async def settled() -> bool:
            n = await count(
                db,
                "SELECT count(*) FROM cards WHERE id = ANY($1::uuid[]) "
                "AND status IN ('executed', 'expired')",
                ids,
            )
            return n == len(ids)

        await wait_until(settled, what="every card executed or expired")
        rows = await db.fetch("SELECT id::text, status FROM cards WHERE id = ANY($1::uuid[])", ids)
        for row in rows:
            want = "executed" if answers[row["id"]] == 200 else "expired"  # 410
            assert row["status"] == want, (row, answers[row["id"]])
        both = await count(
            db,
            "SELECT count(*) FROM card_events a JOIN card_events e ON a.card_id = e.card_id "
            "WHERE a.card_id = ANY($1::uuid[]) AND a.to_status = 'approved' "
            "AND e.to_status = 'expired'",
            ids,
        )
        assert both == 0
        await invariants.check()
    finally:
        await db.close()
