"""The invariant checker run after every fault test: SQL over the store and the demo provider.

Each check returns human-readable violations (empty: the invariant holds). All of
them are scoped to one tenant, so tests sharing a database never see each other.

* ``executions``  — at most one execution per card / ``operation_id`` (I4).
* ``provider``    — provider rows per idempotency key <= 1, every row belongs to a
                    card that executed (or whose outcome is unknown: ``executing``),
                    and every executed card has exactly its one row (I4).
* ``approvals``   — every card that was ever approved has exactly one audit row
                    ``pending -> approved`` naming its owner (an authenticated human,
                    not the system, the clock or a worker), on a human channel, with
                    the hash they saw equal to the card's, before the deadline (I2, I3,
                    I7, I8).
* ``audit``       — every audit row is a legal move and the trail ends where the card
                    is (I8).
* ``expiry``      — no card ``pending`` past ``expires_at`` + sweep interval (I7).
* ``stuck``       — no card ``executing`` past the stuck threshold without a
                    reconciliation flag (I4).
* ``approved``    — no card ``approved`` (decided, neither executing nor invalidated) for
                    longer than ``approved_after_seconds`` (I4, I6: a decision is acted on).
* ``unheld``      — no run ``running`` with no holder (``worker_id`` NULL, a holder with
                    no lease row, or one whose lease lapsed) for longer than the adoption
                    tick + slack (I6: nothing half-way is left to nobody).
* ``inbox``       — (with ``redis_url`` and ``prefix``) no entry of the scope's inbox
                    stream older than ``inbox_idle_seconds`` and still unprocessed —
                    pending at a consumer or never delivered (I5, I6: a message answered
                    202 is processed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as aioredis
import redis.exceptions as rx

from signoff.runtime.cards import MOVES, Status
from signoff.runtime.keys import Keys

# "workflow": a decision map of an authenticated workflow resume (the owner only), applied
# card by card by the worker under the resumer's name (design note 30).
HUMAN_CHANNELS = ("http", "ws", "whatsapp", "test", "workflow")
NOT_HUMAN = ("system", "clock", "sweeper", "operator")
# Tools of the demo app whose provider rows carry the card's operation_id as idempotency key.
KEYED = {"create_pix_charge": "demo_charges", "refund_sale": "demo_refunds"}


@dataclass(frozen=True)
class Scope:
    database_url: str
    tenant: str
    sweep_seconds: float = 2.0
    stuck_after_seconds: float = 300.0
    slack_seconds: float = 5.0  # scheduling slack on a loaded 2-core machine
    # A decided card is acted on within the worker's poll (a lost hint) or the lease of a
    # dead holder, plus the adoption tick; the default fits the runtime's defaults.
    approved_after_seconds: float = 20.0
    adopt_tick_seconds: float = 2.0  # a lapsed or released run is adopted within one tick
    redis_url: str | None = None  # the inbox check runs only with a Redis and a prefix
    prefix: str | None = None
    # An entry of a dead consumer is reclaimed after the claim idle time (30 s by default)
    # plus one claim interval (<= 5 s), then handled in moments.
    inbox_idle_seconds: float = 40.0


async def check(scope: Scope, *, require_redis: bool = True) -> list[str]:
    """Every violation in ``scope``. ``require_redis=False``: a Redis that no longer
    answers (a private server stopped by the test's teardown) skips the inbox check."""
    conn = await asyncpg.connect(scope.database_url, timeout=10)
    try:
        out: list[str] = []
        for fn in (_executions, _provider, _approvals, _audit, _expiry, _stuck, _approved, _unheld):
            out += [f"{fn.__name__.lstrip('_')}: {v}" for v in await fn(conn, scope)]
    finally:
        await conn.close()
    if scope.redis_url is not None and scope.prefix is not None:
        out += [f"inbox: {v}" for v in await _inbox(scope, require_redis)]
    return out


async def _executions(conn: asyncpg.Connection, s: Scope) -> list[str]:
    rows = await conn.fetch(
        """
        SELECT c.id::text, count(*) AS n FROM card_events e JOIN cards c ON c.id = e.card_id
        WHERE c.tenant = $1 AND e.from_status = 'approved' AND e.to_status = 'executing'
        GROUP BY c.id HAVING count(*) > 1
        """,
        s.tenant,
    )
    out = [f"card {r['id']} entered executing {r['n']} times" for r in rows]
    rows = await conn.fetch(
        """
        SELECT c.id::text, c.status, count(o.operation_id) AS n FROM cards c
        LEFT JOIN operations o ON o.operation_id = c.operation_id AND o.card_id = c.id
        WHERE c.tenant = $1 AND c.status IN ('executing', 'executed', 'failed')
        GROUP BY c.id, c.status HAVING count(o.operation_id) <> 1
        """,
        s.tenant,
    )
    out += [f"card {r['id']} ({r['status']}) has {r['n']} operation rows" for r in rows]
    rows = await conn.fetch(
        """
        SELECT o.operation_id::text, c.status FROM operations o JOIN cards c ON c.id = o.card_id
        WHERE c.tenant = $1 AND c.status NOT IN ('executing', 'executed', 'failed')
        """,
        s.tenant,
    )
    out += [f"operation {r['operation_id']} for a card that is {r['status']}" for r in rows]
    return out


async def _provider(conn: asyncpg.Connection, s: Scope) -> list[str]:
    out: list[str] = []
    for tool, table in KEYED.items():
        if await conn.fetchval("SELECT to_regclass($1)", table) is None:
            continue
        rows = await conn.fetch(
            f"SELECT idempotency_key, count(*) AS n FROM {table} WHERE tenant = $1 "
            "GROUP BY idempotency_key HAVING count(*) > 1",
            s.tenant,
        )
        out += [f"{table}: key {r['idempotency_key']} used {r['n']} times" for r in rows]
        rows = await conn.fetch(
            f"""
            SELECT d.idempotency_key, c.status FROM {table} d
            LEFT JOIN cards c ON c.operation_id::text = d.idempotency_key AND c.tool = $2
            WHERE d.tenant = $1 AND (c.id IS NULL OR c.status NOT IN ('executed', 'executing'))
            """,
            s.tenant,
            tool,
        )
        out += [
            f"{table}: row {r['idempotency_key']} but its card is {r['status'] or 'missing'}"
            for r in rows
        ]
        rows = await conn.fetch(
            f"""
            SELECT c.id::text, count(d.idempotency_key) AS n FROM cards c
            LEFT JOIN {table} d ON d.idempotency_key = c.operation_id::text
            WHERE c.tenant = $1 AND c.tool = $2 AND c.status = 'executed'
            GROUP BY c.id HAVING count(d.idempotency_key) <> 1
            """,
            s.tenant,
            tool,
        )
        out += [f"{table}: executed card {r['id']} has {r['n']} provider rows" for r in rows]
    return out


async def _approvals(conn: asyncpg.Connection, s: Scope) -> list[str]:
    rows = await conn.fetch(
        """
        SELECT c.id::text, c.owner, c.decided_by, c.snapshot_hash, c.decided_at, c.expires_at,
               array_agg(e.actor) FILTER (WHERE e.id IS NOT NULL) AS actors,
               array_agg(e.hash_seen) FILTER (WHERE e.id IS NOT NULL) AS hashes,
               array_agg(e.channel) FILTER (WHERE e.id IS NOT NULL) AS channels,
               bool_and(e.at < c.expires_at) FILTER (WHERE e.id IS NOT NULL) AS in_time
        FROM cards c
        LEFT JOIN card_events e
          ON e.card_id = c.id AND e.from_status = 'pending' AND e.to_status = 'approved'
        WHERE c.tenant = $1
          AND c.status IN ('approved', 'executing', 'executed', 'failed', 'invalidated')
        GROUP BY c.id
        """,
        s.tenant,
    )
    out: list[str] = []
    for r in rows:
        actors, hashes, channels = r["actors"] or [], r["hashes"] or [], r["channels"] or []
        card = f"approved card {r['id']}"
        if len(actors) != 1:
            out.append(f"{card} has {len(actors)} approval audit rows")
            continue
        actor, seen, channel = actors[0], hashes[0], channels[0]
        if actor != r["owner"] or actor != r["decided_by"]:
            out.append(f"{card} approved by {actor!r}, owner {r['owner']!r}")
        if actor in NOT_HUMAN or actor.startswith("worker:"):
            out.append(f"{card} approved by non-human actor {actor!r}")
        if channel not in HUMAN_CHANNELS:
            out.append(f"{card} approved on channel {channel!r}")
        if seen != r["snapshot_hash"]:
            out.append(f"{card}: hash seen {seen!r} is not the card's {r['snapshot_hash']!r}")
        if not r["in_time"] or r["decided_at"] is None or r["decided_at"] >= r["expires_at"]:
            out.append(f"{card} approved at {r['decided_at']}, deadline {r['expires_at']}")
    return out


async def _audit(conn: asyncpg.Connection, s: Scope) -> list[str]:
    rows = await conn.fetch(
        """
        SELECT c.id::text, c.status,
               array_agg(e.from_status ORDER BY e.id) AS froms,
               array_agg(e.to_status ORDER BY e.id) AS tos
        FROM cards c JOIN card_events e ON e.card_id = c.id
        WHERE c.tenant = $1 GROUP BY c.id, c.status
        """,
        s.tenant,
    )
    out: list[str] = []
    for r in rows:
        trail = [(f, t) for f, t in zip(r["froms"], r["tos"], strict=True) if f != t]
        if not trail or trail[0] != (None, "pending"):
            out.append(f"card {r['id']}: trail does not start with creation: {trail}")
            continue
        for src, dst in trail[1:]:
            if src is None or Status(dst) not in MOVES.get(Status(src), frozenset()):
                out.append(f"card {r['id']}: illegal audited move {src} -> {dst}")
        if trail[-1][1] != r["status"]:
            out.append(f"card {r['id']} is {r['status']} but its trail ends at {trail[-1][1]}")
    missing = await conn.fetch(
        """
        SELECT c.id::text FROM cards c WHERE c.tenant = $1
          AND NOT EXISTS (SELECT 1 FROM card_events e WHERE e.card_id = c.id)
        """,
        s.tenant,
    )
    out += [f"card {r['id']} has no audit trail" for r in missing]
    return out


async def _expiry(conn: asyncpg.Connection, s: Scope) -> list[str]:
    rows = await conn.fetch(
        """
        SELECT id::text, expires_at, now() AS now FROM cards
        WHERE tenant = $1 AND status = 'pending'
          AND expires_at + make_interval(secs => $2) < now()
        """,
        s.tenant,
        s.sweep_seconds + s.slack_seconds,
    )
    return [f"card {r['id']} still pending, expired at {r['expires_at']}" for r in rows]


async def _stuck(conn: asyncpg.Connection, s: Scope) -> list[str]:
    rows = await conn.fetch(
        """
        SELECT c.id::text, c.executing_since FROM cards c
        WHERE c.tenant = $1 AND c.status = 'executing' AND NOT c.needs_reconciliation
          AND c.executing_since < now() - make_interval(secs => $2)
          AND NOT EXISTS (SELECT 1 FROM card_events e
                          WHERE e.card_id = c.id AND e.detail ? 'reconciled')
        """,
        s.tenant,
        s.stuck_after_seconds + s.sweep_seconds + s.slack_seconds,
    )
    return [f"card {r['id']} executing since {r['executing_since']}, not flagged" for r in rows]


async def _approved(conn: asyncpg.Connection, s: Scope) -> list[str]:
    rows = await conn.fetch(
        """
        SELECT id::text, decided_at, now() - decided_at AS age FROM cards
        WHERE tenant = $1 AND status = 'approved'
          AND decided_at < now() - make_interval(secs => $2)
        """,
        s.tenant,
        s.approved_after_seconds,
    )
    return [
        f"card {r['id']} approved at {r['decided_at']} and still not acted on "
        f"({r['age'].total_seconds():.1f}s)"
        for r in rows
    ]


async def _unheld(conn: asyncpg.Connection, s: Scope) -> list[str]:
    """A `running` run must have a live holder. The time it has gone without one is
    measured from its holder's lapsed lease, or (released: ``worker_id`` NULL, or a
    holder whose lease row is gone) from its last write — an upper bound, since a
    release does not touch ``updated_at``; a `running` run idle that long is wrong
    anyway (the holder would have written a step)."""
    rows = await conn.fetch(
        """
        SELECT r.id::text, r.worker_id, r.updated_at, w.lease_until FROM runs r
        LEFT JOIN workers w ON w.id = r.worker_id
        WHERE r.tenant = $1 AND r.status = 'running'
          AND CASE WHEN w.id IS NULL THEN r.updated_at ELSE w.lease_until END
              < now() - make_interval(secs => $2)
        """,
        s.tenant,
        s.adopt_tick_seconds + s.slack_seconds,
    )
    out: list[str] = []
    for r in rows:
        if r["worker_id"] is None:
            why = f"no holder (last written {r['updated_at']})"
        elif r["lease_until"] is None:
            why = f"holder {r['worker_id']!r} has no lease row (last written {r['updated_at']})"
        else:
            why = f"holder {r['worker_id']!r} whose lease lapsed at {r['lease_until']}"
        out.append(f"run {r['id']} running with {why}")
    return out


@dataclass(frozen=True)
class InboxEntry:
    id: str
    age: float  # seconds since XADD (the id's time, against Redis's clock)
    consumer: str | None  # the consumer holding it (pending), or None: never delivered
    deliveries: int
    idle: float  # seconds since its last delivery (0 when never delivered)


@dataclass(frozen=True)
class InboxState:
    """The inbox stream of one key prefix. A handled entry is acked and deleted at once
    (``RedisBus.ack``: XACK + XDEL), so every entry still there is unprocessed work."""

    entries: list[InboxEntry]

    @property
    def drained(self) -> bool:
        return not self.entries


async def inbox_state(redis_url: str, prefix: str) -> InboxState:
    """The entries of ``prefix``'s inbox stream (the first 1000), with their PEL state."""
    keys = Keys(prefix)
    inbox, group = keys.inbox, keys.inbox_group
    client = aioredis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=5)
    try:
        raw = await client.xrange(inbox, "-", "+", 1000)
        if not raw:
            return InboxState([])
        seconds, micros = await client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        held: dict[str, tuple[str, int, float]] = {}
        groups: list[dict[Any, Any]] = await client.xinfo_groups(inbox)
        if any(_text(g["name"]) == group for g in groups):
            for item in await client.xpending_range(inbox, group, "-", "+", 1000):
                held[_text(item["message_id"])] = (
                    _text(item["consumer"]),
                    int(item["times_delivered"]),
                    int(item["time_since_delivered"]) / 1000,
                )
        entries = []
        for entry_id, _ in raw:
            eid = _text(entry_id)
            consumer, n, idle = held.get(eid, (None, 0, 0.0))
            age = (now_ms - int(eid.split("-")[0])) / 1000
            entries.append(InboxEntry(eid, age, consumer, n, idle))
        return InboxState(entries)
    finally:
        await client.aclose()


async def _inbox(s: Scope, require_redis: bool) -> list[str]:
    assert s.redis_url is not None and s.prefix is not None
    try:
        state = await inbox_state(s.redis_url, s.prefix)
    except (rx.ConnectionError, rx.TimeoutError, OSError) as exc:
        return [f"Redis at {s.redis_url} does not answer: {exc}"] if require_redis else []
    out: list[str] = []
    for e in state.entries:
        if e.age <= s.inbox_idle_seconds:
            continue
        if e.consumer is None:
            out.append(f"entry {e.id} not processed after {e.age:.1f}s, never delivered")
        else:
            out.append(
                f"entry {e.id} not processed after {e.age:.1f}s: pending at {e.consumer!r}, "
                f"delivered {e.deliveries} times, idle {e.idle:.1f}s"
            )
    return out


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
