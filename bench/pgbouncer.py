#!/usr/bin/env python3
"""What PgBouncer (transaction pooling) and a statement cache of 0 cost the store.

On one private Postgres, the store's own statements through ``PostgresStore``: a read
(``get_thread``: one ``fetchrow``) and a write (``create_thread``: one ``INSERT ...
RETURNING``), one at a time and 16 at once, in three set-ups:

* direct, asyncpg's statement cache on (100, the default);
* direct, statement cache 0 (every statement parsed again: unnamed prepared statements);
* through PgBouncer in transaction pooling mode (Debian's, 1.18: no prepared statements
  across server connections), statement cache 0 — what a deployment behind it runs.

Figures: microseconds per statement (median over rounds) and statements/s at 16.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, log, machine, machine_busy, services, write_json
from signoff.store.postgres import PostgresStore
from tests import pgbouncer


def parser() -> Any:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--statements", type=int, default=3000, help="per set-up and kind")
    p.add_argument("--quick", action="store_true", help="a small smoke run (600 statements)")
    return p


async def measure(url: str, cache: int, n: int) -> dict[str, Any]:
    store = await PostgresStore.connect(url, max_size=16, statement_cache_size=cache)
    try:
        thread = await store.create_thread("bench", "reader")
        out: dict[str, Any] = {}
        for kind in ("read", "write"):

            async def op(kind: str = kind) -> None:
                if kind == "read":
                    await store.get_thread(thread.id)
                else:
                    await store.create_thread("bench", "writer")

            for _ in range(50):  # warm up
                await op()
            rounds = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n // 5):
                    await op()
                rounds.append((time.perf_counter() - t0) / (n // 5) * 1e6)

            async def worker(k: int) -> None:
                for _ in range(k):
                    await op()

            t0 = time.perf_counter()
            await asyncio.gather(*(worker(n // 16) for _ in range(16)))
            wall = time.perf_counter() - t0
            out[kind] = {
                "us_per_statement_serial": round(statistics.median(rounds), 1),
                "statements_per_s_at_16": round((n // 16) * 16 / wall, 1),
            }
        return out
    finally:
        await store.close()


async def run(url: str, n: int) -> dict[str, Any]:
    bounced = pgbouncer.through(url)
    return {
        "direct_cache_100": await measure(url, 100, n),
        "direct_cache_0": await measure(url, 0, n),
        "pgbouncer_transaction_cache_0": await measure(bounced, 0, n),
    }


def main() -> int:
    args = parser().parse_args()
    if args.quick:
        args.statements = 600
    busy = machine_busy()
    started = time.monotonic()
    with services(args, "pgbouncer") as svc:
        results = asyncio.run(run(svc.database_url, args.statements))
    base = results["direct_cache_100"]
    relative = {
        name: {
            kind: round(
                r[kind]["us_per_statement_serial"] / base[kind]["us_per_statement_serial"], 2
            )
            for kind in ("read", "write")
        }
        for name, r in results.items()
    }
    data = {
        "config": {"statements": args.statements, "pgbouncer": "1.18, pool_mode=transaction"},
        "machine": {**machine(), **busy},
        "results": results,
        "serial_latency_vs_direct_cache_100": relative,
        "seconds": round(time.monotonic() - started, 1),
    }
    path = write_json(args.out, "pgbouncer", data)
    log(f"pgbouncer: wrote {path} in {data['seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
