#!/usr/bin/env python3
"""The thread list (GET /v1/threads, ``threads_of_owner``): how long listing one
person's 50 most recent threads takes as their thread count grows.

One person gets N threads, each with a log of 3 entries, among 9 other people with N
threads each (the owner filter has to skip them); then the store's ``list_threads``
(the statement the endpoint runs) is timed ``--repeat`` times per N. Cards are not
created: the pending count is an index probe on ``cards_thread_pending`` per listed
thread, which an empty index answers as fast as a small one. Writes
``bench/results/thread_list.json``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, base_parser, log, machine, services, summarize_ms, write_json
from signoff.store.postgres import PostgresStore

FILL = """
WITH t AS (
    INSERT INTO threads (id, tenant, owner, last_seq, created_at)
    SELECT gen_random_uuid(), 'bench', $1, 3, now() - make_interval(secs => g)
    FROM generate_series(1, $2) g
    RETURNING id, created_at
)
INSERT INTO messages (thread_id, seq, kind, body, created_at)
SELECT t.id, s, CASE s WHEN 1 THEN 'user' ELSE 'assistant' END,
       jsonb_build_object('content', 'cobre ' || s || ' do João'), t.created_at
FROM t, generate_series(1, 3) s
"""


async def measure(url: str, sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    store = await PostgresStore.connect(url)
    out: list[dict[str, Any]] = []
    have = 0
    try:
        for n in sizes:
            grow = n - have
            for who in ["alice", *[f"other-{i}" for i in range(9)]]:
                await store.db.execute(FILL, who, grow)
            have = n
            await store.db.execute("ANALYZE")
            times: list[float] = []
            for _ in range(repeat):
                t0 = time.perf_counter_ns()
                listed = await store.list_threads("bench", "alice", 50)
                times.append(time.perf_counter_ns() - t0)
                assert len(listed) == min(50, n)
            row = {"threads_of_the_person": n, "threads_in_table": 10 * n, **summarize_ms(times)}
            log(row)
            out.append(row)
    finally:
        await store.close()
    return out


def main() -> None:
    p = base_parser(__doc__ or "")
    p.add_argument("--sizes", default="100,1000,5000", help="threads per person, growing")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="100 and 1000 threads, 50 repeats")
    args = p.parse_args()
    sizes = [100, 1000] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeat = 50 if args.quick else args.repeat
    with services(args, "threadlist") as svc:
        rows = asyncio.run(measure(svc.database_url, sizes, repeat))
    path = write_json(
        RESULTS, "thread_list", {"machine": machine(), "limit": 50, "repeat": repeat, "rows": rows}
    )
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
