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
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from runtime.cards import MOVES, Status

HUMAN_CHANNELS = ("http", "ws", "whatsapp", "test")
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


async def check(scope: Scope) -> list[str]:
    conn = await asyncpg.connect(scope.database_url, timeout=10)
    try:
        out: list[str] = []
        for fn in (_executions, _provider, _approvals, _audit, _expiry, _stuck):
            out += [f"{fn.__name__.lstrip('_')}: {v}" for v in await fn(conn, scope)]
        return out
    finally:
        await conn.close()


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
