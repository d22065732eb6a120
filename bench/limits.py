#!/usr/bin/env python3
"""The physical floor of a decision on this machine, measured in the same run as the rest.

A decision must at least (1) commit one conditional ``UPDATE`` durably in Postgres and
(2) cross one Redis pub/sub hop to the worker. This script measures both with
the least software in the way:

* ``pg_commit``: one autocommitted ``UPDATE floor_cards SET status = 'approved' ...
  WHERE id = $1 AND status = 'pending'`` through asyncpg (signoff's driver), one at a time.
* ``redis_publish``: ``PUBLISH`` from this process on a raw socket -> a subscriber in
  another process on a raw socket, one way (wall clock stamped into the payload).
* ``pg_roundtrip``: ``SELECT 1``, for scale.

* ``decide_store``: signoff's own deciding statement, ``PostgresStore.decide`` (the
  conditional ``UPDATE`` + audit row + thread-log entry with the card's JSON, one
  statement of data-modifying CTEs, autocommit), to set beside the bare commit.

``floor_ms`` = p50 commit + p50 pub/sub hop. Samples are paced (``--gap-ms``) so each
one meets an idle machine, as a decision at 100/s does.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg

from bench.common import (
    base_parser,
    log,
    machine,
    machine_busy,
    progress,
    server_versions,
    services,
    spread,
    summarize_ms,
    write_json,
)

SUBSCRIBER = r"""
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
password = sys.argv[4].encode() if len(sys.argv) > 4 else b""
s = socket.create_connection((host, port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
f = s.makefile("rb")
if password:  # the embedded server has a password
    s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password))
    assert f.readline().startswith(b"+OK"), "AUTH refused"
s.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$11\r\nbench:floor\r\n")
def read():
    line = f.readline()
    if line[:1] == b"*":
        return [read() for _ in range(int(line[1:]))]
    if line[:1] == b"$":
        data = f.read(int(line[1:]) + 2)
        return data[:-2]
    return line[1:-2]
read()  # the subscribe confirmation
print("ready", flush=True)
out = []
for _ in range(n):
    msg = read()
    now = time.time_ns()
    out.append(now - int(msg[2]))
print(" ".join(map(str, out)), flush=True)
"""


def resp(*args: bytes) -> bytes:
    out = b"*%d\r\n" % len(args)
    for a in args:
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def redis_hop(redis_url: str, n: int, gap: float) -> list[int]:
    """One-way PUBLISH -> subscriber latencies (ns), one message at a time."""
    parts = urlsplit(redis_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    sub = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, host, str(port), str(n), unquote(parts.password or "")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sub.stdout is not None
        if sub.stdout.readline().strip() != "ready":
            raise RuntimeError("subscriber did not start")
        pub = socket.create_connection((host, port))
        pub.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = pub.makefile("rb")
        if parts.password:
            pub.sendall(resp(b"AUTH", unquote(parts.password).encode()))
            reader.readline()
        for _ in range(n):
            pub.sendall(resp(b"PUBLISH", b"bench:floor", str(time.time_ns()).encode()))
            reader.readline()
            time.sleep(gap)
        line = sub.stdout.readline()
        pub.close()
        return [int(x) for x in line.split()]
    finally:
        sub.kill()
        sub.wait()


async def pg_commits(database_url: str, n: int, gap: float) -> tuple[list[int], list[int]]:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS floor_cards (id bigint PRIMARY KEY, status text NOT NULL, "
            "decided_at timestamptz)"
        )
        await conn.execute("TRUNCATE floor_cards")
        await conn.execute(
            "INSERT INTO floor_cards SELECT g, 'pending' FROM generate_series(1, $1) g", n
        )
        stmt = await conn.prepare(
            "UPDATE floor_cards SET status = 'approved', decided_at = now() "
            "WHERE id = $1 AND status = 'pending'"
        )
        commits = []
        for i in range(1, n + 1):
            t = time.perf_counter_ns()
            await stmt.fetch(i)
            commits.append(time.perf_counter_ns() - t)
            await asyncio.sleep(gap)
        ping = await conn.prepare("SELECT 1")
        trips = []
        for _ in range(n):
            t = time.perf_counter_ns()
            await ping.fetchval()
            trips.append(time.perf_counter_ns() - t)
            await asyncio.sleep(gap)
        return commits, trips
    finally:
        await conn.close()


SEED = """
WITH g AS (SELECT i, md5($1 || ':t:' || i)::uuid AS tid, md5($1 || ':r:' || i)::uuid AS rid,
                  md5($1 || ':c:' || i)::uuid AS cid, md5($1 || ':o:' || i)::uuid AS oid
           FROM generate_series(1, $2::int) i),
th AS (INSERT INTO threads (id, tenant, owner, last_seq) SELECT tid, 'floor', 'ana', 3 FROM g),
ru AS (INSERT INTO runs (id, thread_id, tenant, owner, status, worker_id)
       SELECT rid, tid, 'floor', 'ana', 'waiting', 'nobody' FROM g)
INSERT INTO cards (id, thread_id, run_id, tenant, owner, tool, risk, args_snapshot, summary,
                   impact, snapshot_hash, request_key, operation_id, status, expires_at)
SELECT cid, tid, rid, 'floor', 'ana', 'create_pix_charge', 'critical',
       '{"customer_id": "c-joao", "amount_cents": 1200}', 'Gerar cobrança Pix · R$ 12,00',
       '{"amount_cents": 1200}', 'h', 'rk:' || cid, oid, 'pending', now() + interval '1 hour'
FROM g RETURNING id::text
"""


async def decides(database_url: str, n: int, gap: float, salt: str) -> list[int]:
    """signoff's deciding statement through the store, one at a time."""
    from signoff.runtime.cards import Decision
    from signoff.store.postgres import PostgresStore

    conn = await asyncpg.connect(database_url)
    store = await PostgresStore.connect(database_url, max_size=2)
    try:
        ids = [r["id"] for r in await conn.fetch(SEED, salt, n)]
        store_ns = []
        for i in range(n):
            t = time.perf_counter_ns()
            await store.decide(
                ids[i],
                principal="ana",
                decision=Decision.APPROVE,
                snapshot_hash="h",
                channel="bench",
            )
            store_ns.append(time.perf_counter_ns() - t)
            await asyncio.sleep(gap)
        return store_ns
    finally:
        await store.close()
        await conn.close()


def measure(
    database_url: str, redis_url: str, n: int, runs: int, gap: float, bar: Any
) -> dict[str, Any]:
    per_run: list[dict[str, Any]] = []
    for _ in range(runs):
        commits, trips = asyncio.run(pg_commits(database_url, n, gap))
        bar.update(1)
        hops = redis_hop(redis_url, n, gap)
        bar.update(1)
        store_ns = asyncio.run(decides(database_url, n // 2, gap, f"r{len(per_run)}"))
        bar.update(1)
        per_run.append(
            {
                "pg_commit_ms": summarize_ms(commits),
                "pg_roundtrip_ms": summarize_ms(trips),
                "redis_publish_ms": summarize_ms(hops),
                "decide_store_ms": summarize_ms(store_ns),
            }
        )
    return {"runs": per_run}


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=1000, help="samples per measure and run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gap-ms", type=float, default=2.0, help="pause between samples")
    args = p.parse_args(argv)
    busy = machine_busy()
    t0 = time.monotonic()
    with services(args, "limits") as svc:
        versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
        bar = progress(3 * args.runs, "limits", args.no_progress, "measure")
        res = measure(
            svc.database_url, svc.redis_url, args.samples, args.runs, args.gap_ms / 1000, bar
        )
        bar.close()
    runs = res["runs"]
    summary: dict[str, Any] = {}
    for fig in (
        "pg_commit_ms",
        "pg_roundtrip_ms",
        "redis_publish_ms",
        "decide_store_ms",
    ):
        for q in ("p50", "p99"):
            summary[f"{fig.removesuffix('_ms')}_{q}_ms"] = spread([r[fig][q] for r in runs], "ms")
    floors = [r["pg_commit_ms"]["p50"] + r["redis_publish_ms"]["p50"] for r in runs]
    summary["floor_ms"] = spread(floors, "ms")
    data = {
        "config": {"samples": args.samples, "runs": args.runs, "gap_ms": args.gap_ms},
        "machine": {**machine(), **versions, **busy},
        "summary": summary,
        "runs": runs,
        "exactly_once": {"ok": True, "note": "no decisions made here"},
        "seconds": round(time.monotonic() - t0, 1),
    }
    path = write_json(args.out, "limits", data)
    f = summary["floor_ms"]
    log(
        f"limits: floor {f['value']} ms (commit p50 {summary['pg_commit_p50_ms']['value']} + "
        f"pub/sub p50 {summary['redis_publish_p50_ms']['value']}); wrote {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
