"""Approve against a new message in the same thread, on real processes (issue 10).

2 `signoff gateway` + 2 `signoff worker` processes, the demo app's offline model. A round
takes a thread whose run is parked on a pending `create_pix_charge` card and sends, at a
random offset of 0–10 ms (either one first), "approve the card"
(``POST /v1/cards/{id}/resolve``) to one gateway and a new message in the same thread
(``POST /v1/threads/{t}/messages``, another "cobre …", which proposes the next round's
card) to the other, alternating. Rounds run concurrently in independent lanes (one user
and one thread each) so that 500 of them finish in about a minute on 2 cores.

Asserted, every violation collected and reported together:

* no 5xx, ever; every answer typed: an approval ``200`` or a JSON ``409``, a message ``202``;
* every ``202`` message processed within 5 s: its run exists and settled (not `running`);
* every card's final state consistent with its approval: approved (200) → `executed`,
  `failed` or `invalidated`, never left `approved`/`executing`; refused (409) → never
  executed — and with its audit trail (the invariant checker);
* nothing `approved` for more than a few seconds, in the audit (approved → next move) and
  now (the checker);
* exactly one provider charge per executed card, none for any other (the checker and a
  count); no run left `running`; no inbox entry left pending.

``SIGNOFF_RACE_ROUNDS`` (default 500) and ``SIGNOFF_RACE_LANES`` (default 10) scale it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests import services
from tests.cluster import Cluster, cluster
from tests.faults.conftest import Invariants
from tests.faults.invariants import inbox_state

ROUNDS = int(os.environ.get("SIGNOFF_RACE_ROUNDS", "500"))
LANES = max(1, min(int(os.environ.get("SIGNOFF_RACE_LANES", "10")), ROUNDS))
MAX_OFFSET = 0.010  # seconds between the two requests of a round, either order
SETTLE_SECONDS = 5.0  # a 202 message's run exists and left `running` within this
APPROVED_SECONDS = 5.0  # no card sits `approved` longer than this
POLL = 0.025

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


@pytest.fixture
def c(database_url: str, tmp_path: Path, invariants: Invariants) -> Iterator[Cluster]:
    with cluster(
        database_url,
        services.redis_url(),
        tmp_path,
        gateways=2,
        workers=2,
        SIGNOFF_POLL_SECONDS="1",
        SIGNOFF_LEASE_SECONDS="3",
        SIGNOFF_SWEEP_SECONDS="0.5",
        SIGNOFF_CLAIM_IDLE_MS="1000",
    ) as cl:
        invariants.watch_cluster(cl, approved_after_seconds=APPROVED_SECONDS)
        yield cl


@dataclass
class Tally:
    """What the rounds saw; ``problems`` are violations, reported together at the end."""

    rounds: int = 0
    approve_codes: Counter[int] = field(default_factory=Counter)
    message_codes: Counter[int] = field(default_factory=Counter)
    approvals: dict[str, int] = field(default_factory=dict)  # card id -> status code
    messages: int = 0  # 202 messages whose processing was checked
    settle_times: list[float] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (kind, what)

    def problem(self, kind: str, text: str) -> None:
        self.problems.append((kind, text))


def untyped(r: httpx.Response) -> str | None:
    """Why ``r`` is not a typed answer, or None."""
    if not r.headers.get("content-type", "").startswith("application/json"):
        return f"{r.headers.get('content-type')!r} body {r.text[:200]!r}"
    try:
        body = r.json()
    except ValueError:
        return f"invalid JSON {r.text[:200]!r}"
    if r.status_code >= 400 and not (isinstance(body, dict) and "error" in body):
        return f"error without a code: {r.text[:200]!r}"
    return None


PROCESSED = """
SELECT r.id::text AS run_id, r.status,
       (SELECT jsonb_build_object('id', k.id::text, 'snapshot_hash', k.snapshot_hash)
        FROM cards k WHERE k.run_id = r.id AND k.status = 'pending'
        ORDER BY k.created_at LIMIT 1) AS card
FROM messages m JOIN runs r ON r.id = m.run_id
WHERE m.thread_id = $1::uuid AND m.kind = 'user' AND m.body -> 'content' -> 0 ->> 'text' = $2
"""


class Race:
    def __init__(self, c: Cluster, db: asyncpg.Pool, clients: list[httpx.AsyncClient]) -> None:
        self.c = c
        self.db = db
        self.clients = clients
        self.tally = Tally()

    async def post_message(
        self, gw: int, user: str, thread: str, text: str
    ) -> tuple[httpx.Response | None, float]:
        try:
            r = await self.clients[gw].post(
                f"/v1/threads/{thread}/messages",
                json={"text": text},
                headers=self.auth(user),
            )
        except httpx.HTTPError as exc:
            self.tally.problem("no answer", f"message on gw{gw}: {type(exc).__name__}: {exc}")
            return None, time.monotonic()
        at = time.monotonic()
        self.tally.message_codes[r.status_code] += 1
        why = untyped(r)
        if r.status_code != 202 or why:
            self.tally.problem(
                f"message answered {r.status_code}",
                f"message on gw{gw}: {r.status_code} {why or r.text[:200]}",
            )
        return r, at

    async def approve(self, gw: int, user: str, card: dict[str, str]) -> int | None:
        try:
            r = await self.clients[gw].post(
                f"/v1/cards/{card['id']}/resolve",
                json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
                headers=self.auth(user),
            )
        except httpx.HTTPError as exc:
            self.tally.problem("no answer", f"approve on gw{gw}: {type(exc).__name__}: {exc}")
            return None
        self.tally.approve_codes[r.status_code] += 1
        self.tally.approvals[card["id"]] = r.status_code
        why = untyped(r)
        if r.status_code not in (200, 409) or why:
            self.tally.problem(
                f"approve answered {r.status_code}" + (" untyped" if why else ""),
                f"approve of {card['id']} on gw{gw}: {r.status_code} {why or r.text[:200]}",
            )
        return r.status_code

    def auth(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.c.token(user)}"}

    async def processed(self, thread: str, text: str, accepted_at: float) -> dict[str, str] | None:
        """Wait for the message's run to settle; return its pending card, if it has one.

        Past ``SETTLE_SECONDS`` after the 202 that is a violation; the lane goes on
        waiting (up to 3× longer) for a card to continue with."""
        self.tally.messages += 1
        late = accepted_at + SETTLE_SECONDS
        give_up = accepted_at + 3 * SETTLE_SECONDS
        reported = False
        last: asyncpg.Record | None = None
        while True:
            last = await self.db.fetchrow(PROCESSED, thread, text)
            now = time.monotonic()
            if last is not None and last["status"] != "running":
                self.tally.settle_times.append(now - accepted_at)
                if now > late and not reported:
                    self.tally.problem(
                        "202 message processed late",
                        f"message {text!r}: run {last['run_id']} settled "
                        f"{now - accepted_at:.1f}s after its 202",
                    )
                return None if last["card"] is None else dict(json.loads(last["card"]))
            if now > late and not reported:
                reported = True
                state = "no run" if last is None else f"run {last['run_id']} still running"
                self.tally.problem(
                    "202 message: "
                    + ("no run" if last is None else "run still running")
                    + " after 5 s",
                    f"message {text!r} in thread {thread}: {state} {SETTLE_SECONDS:.0f}s "
                    "after its 202",
                )
            if now > give_up:
                return None
            await asyncio.sleep(POLL)

    async def fresh_card(self, lane: int, user: str, thread: str, tag: str) -> dict[str, str]:
        """Post a message that proposes a card, and return that card (3 tries)."""
        for attempt in range(3):
            text = f"cobre {10 + lane} do João #{tag}.{attempt}"
            r, at = await self.post_message(lane % 2, user, thread, text)
            if r is not None and r.status_code == 202:
                card = await self.processed(thread, text, at)
                if card is not None:
                    return card
        raise AssertionError(f"lane {lane}: no card after 3 messages; so far: {self.summary()}")

    async def lane(self, k: int, rounds: int, rng: random.Random) -> None:
        user = f"racer{k}"
        r = await self.clients[k % 2].post("/v1/threads", headers=self.auth(user))
        assert r.status_code == 201, r.text
        thread = r.json()["thread"]["id"]
        card = await self.fresh_card(k, user, thread, f"{k}.start")
        for i in range(rounds):
            gw_approve = (k + i) % 2  # the two requests of a round on different gateways
            gw_message = 1 - gw_approve
            text = f"cobre {10 + i % 90} do João #{k}.{i}"
            offset = rng.uniform(0, MAX_OFFSET)
            approve = self.approve(gw_approve, user, card)
            message = self.post_message(gw_message, user, thread, text)
            if rng.random() < 0.5:
                first: Any = asyncio.ensure_future(approve)
                await asyncio.sleep(offset)
                second: Any = asyncio.ensure_future(message)
                _, (r, at) = await asyncio.gather(first, second)
            else:
                first = asyncio.ensure_future(message)
                await asyncio.sleep(offset)
                second = asyncio.ensure_future(approve)
                (r, at), _ = await asyncio.gather(first, second)
            self.tally.rounds += 1
            nxt = None
            if r is not None and r.status_code == 202:
                nxt = await self.processed(thread, text, at)
            card = nxt or await self.fresh_card(k, user, thread, f"{k}.{i}")

    def summary(self) -> str:
        t = self.tally
        settle = sorted(t.settle_times) or [0.0]
        return (
            f"{t.rounds} rounds; approve {dict(t.approve_codes)}; message "
            f"{dict(t.message_codes)}; {t.messages} messages settled in p50 "
            f"{settle[len(settle) // 2]:.2f}s, max {settle[-1]:.2f}s"
        )


async def quiet(db: asyncpg.Pool, tenant: str, timeout: float) -> bool:
    """Wait until no run is `running` and no card `approved`/`executing` (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = await db.fetchval(
            "SELECT (SELECT count(*) FROM runs WHERE tenant = $1 AND status = 'running') "
            "+ (SELECT count(*) FROM cards WHERE tenant = $1 "
            "   AND status IN ('approved', 'executing'))",
            tenant,
        )
        if busy == 0:
            return True
        await asyncio.sleep(0.1)
    return False


async def final_checks(race: Race, db: asyncpg.Pool, c: Cluster) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    t = c.tenant
    rows = await db.fetch("SELECT id::text, status FROM cards WHERE tenant = $1", t)
    status = {r["id"]: r["status"] for r in rows}
    finals: Counter[tuple[int, str]] = Counter()
    for card_id, code in race.tally.approvals.items():
        final = status.get(card_id, "missing")
        finals[(code, final)] += 1
        if code == 200 and final not in ("executed", "failed", "invalidated"):
            out.append((f"approved (200), ends {final}", f"card {card_id}"))
        if code == 409 and final in ("approved", "executing", "executed", "failed"):
            out.append((f"refused (409), ends {final}", f"card {card_id}"))
    print(f"race: (answer, final status) of the raced cards: {dict(finals)}")
    # How long each approved card stayed `approved`, from its audit.
    rows = await db.fetch(
        """
        SELECT c.id::text, c.status, a.at AS approved_at,
               (SELECT min(e.at) FROM card_events e WHERE e.card_id = c.id
                  AND e.from_status = 'approved' AND e.to_status <> 'approved') AS left_at,
               now() AS now
        FROM cards c JOIN card_events a
          ON a.card_id = c.id AND a.from_status = 'pending' AND a.to_status = 'approved'
        WHERE c.tenant = $1
        """,
        t,
    )
    for r in rows:
        dwell = ((r["left_at"] or r["now"]) - r["approved_at"]).total_seconds()
        if dwell > APPROVED_SECONDS:
            where = "still approved" if r["left_at"] is None else f"then {r['status']}"
            out.append(
                (
                    f"approved > {APPROVED_SECONDS:.0f} s",
                    f"card {r['id']} sat approved for {dwell:.1f}s ({where})",
                )
            )
    running = await db.fetch(
        "SELECT id::text, worker_id FROM runs WHERE tenant = $1 AND status = 'running'", t
    )
    out += [("run left running", f"run {r['id']} (holder {r['worker_id']})") for r in running]
    executed = await db.fetchval(
        "SELECT count(*) FROM cards WHERE tenant = $1 AND status = 'executed' "
        "AND tool = 'create_pix_charge'",
        t,
    )
    charges = await db.fetchval("SELECT count(*) FROM demo_charges WHERE tenant = $1", t)
    if charges != executed:
        out.append(("charges", f"{charges} provider charges for {executed} executed cards"))
    inbox = await inbox_state(c.redis_url, c.prefix)
    out += [
        ("inbox entry unprocessed", f"entry {e.id} after {e.age:.1f}s (at {e.consumer})")
        for e in inbox.entries
        if e.age > SETTLE_SECONDS
    ]
    return out


def report(problems: list[tuple[str, str]]) -> str:
    """Problems by kind: a count and the first few of each."""
    kinds: dict[str, list[str]] = {}
    for kind, what in problems:
        kinds.setdefault(kind, []).append(what)
    lines = [f"{len(problems)} problems:"]
    for kind, whats in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(whats)} × {kind}")
        lines += [f"      {w}" for w in whats[:3]]
    return "\n".join(lines)


def log_signals(c: Cluster) -> str:
    counts: Counter[str] = Counter()
    for proc in c.gateways + c.workers:
        text = proc.output()
        for needle in ("Traceback", "DeadlockDetected", "SerializationError", "ERROR"):
            if n := text.count(needle):
                counts[f"{proc.name}:{needle}"] = n
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"


async def test_approve_against_new_message_in_the_same_thread(
    c: Cluster, invariants: Invariants
) -> None:
    """Issue 10 items 1–3: ROUNDS rounds of approve vs. a new message, across 2 gateways
    and 2 workers. No 5xx, every 202 processed in 5 s, no card approved and forgotten,
    one charge per execution."""
    t0 = time.monotonic()
    db = await asyncpg.create_pool(c.database_url, min_size=2, max_size=LANES + 2)
    limits = httpx.Limits(max_connections=2 * LANES + 4, max_keepalive_connections=2 * LANES + 4)
    clients = [httpx.AsyncClient(base_url=gw.url, limits=limits, timeout=30) for gw in c.gateways]
    try:
        race = Race(c, db, clients)
        rng = random.Random(int(os.environ.get("SIGNOFF_RACE_SEED", "10")))
        shares = [ROUNDS // LANES + (1 if k < ROUNDS % LANES else 0) for k in range(LANES)]
        await asyncio.gather(
            *(race.lane(k, n, random.Random(rng.random())) for k, n in enumerate(shares))
        )
        took = time.monotonic() - t0
        settled = await quiet(db, c.tenant, 2 * APPROVED_SECONDS)
        problems = race.tally.problems + await final_checks(race, db, c)
        print(f"race: {race.summary()}; {took:.1f}s; quiet: {settled}; logs: {log_signals(c)}")
        assert race.tally.rounds == ROUNDS
        violations = []
        try:
            await invariants.check()
        except AssertionError as exc:
            violations.append(str(exc))
        assert not problems and not violations, (
            f"{race.summary()}; logs: {log_signals(c)}\n{report(problems)}\n"
            + "\n".join(violations)
        )
    finally:
        for client in clients:
            await client.aclose()
        await db.close()
