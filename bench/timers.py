#!/usr/bin/env python3
"""What the statements timers run cost as the database grows: every worker's sweep and
lease tick, every gateway's WhatsApp poll, retention's batches (``tests/bigdb.py``).

For each ``--sizes`` N, a fresh database gets N finished threads with everything that
hangs off them (a run, a card, five log entries, a WhatsApp contact, a workflow run and
its gate; a few of each still open), then each periodic statement runs ``--repeat``
times as a long-lived process runs it (a generic plan) under ``EXPLAIN (ANALYZE,
BUFFERS)``, rolled back. Reported per statement and N: the server's execution time
(median, max), the pages it touched and any big table it read whole. A statement whose
cost grows with N is what ``tests/integration/test_query_plans.py`` forbids; this shows
by how much. Not in ``run_all.py``: a diagnostic, ~1 minute at 200k. Writes
``results/timers.json``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, log, machine, services, write_json
from tests import bigdb


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


async def measure(url: str, n: int, repeat: int) -> dict[str, Any]:
    conn = await bigdb.connect(url)
    try:
        await conn.execute(bigdb.populate_sql(n))
        await conn.execute("VACUUM ANALYZE")
        out: dict[str, Any] = {}
        for name, args in bigdb.PERIODIC.items():
            times, touched, whole = [], [], []
            for _ in range(repeat):
                top = await bigdb.explain(conn, name, args)
                times.append(float(top["Execution Time"]))
                touched.append(bigdb.pages(top["Plan"]))
                whole = bigdb.scans(top["Plan"])
            out[name] = {
                "exec_ms_p50": round(statistics.median(times), 3),
                "exec_ms_max": round(max(times), 3),
                "pages": max(touched),
                "reads_whole": whole,
            }
            log(f"  {n:>7} {name:28s} {out[name]['exec_ms_p50']:8.3f} ms {max(touched):6d} pages")
        return out
    finally:
        await conn.close()


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=ints, default=[20_000, 200_000], help="threads per run")
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    results: dict[str, Any] = {}
    for n in args.sizes:
        with services(args, f"timers{n}") as svc:
            results[str(n)] = asyncio.run(measure(svc.database_url, n, args.repeat))
    worst = {
        n: max(stats.values(), key=lambda s: s["exec_ms_p50"])["exec_ms_p50"]
        for n, stats in results.items()
    }
    path = write_json(
        args.out,
        "timers",
        {"machine": machine(), "sizes": args.sizes, "statements": results, "worst_ms": worst},
    )
    log(f"timers: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
