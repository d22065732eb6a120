#!/usr/bin/env python3
"""Where one decision's time goes, call by call: the store statements, the provider calls and
the hints of a decision and of the step it sets off, timed in one process.

The payments demo runs in-process (``signoff.testing.Harness``: decisions and a worker,
the offline demo model) on a fresh database and a Redis bus; each of ``--decisions``
parked cards is approved one at a time and the worker left to finish its step before
the next. Every call of interest is wrapped with ``perf_counter_ns``: the deciding
statement, the wake read (``run_with_cards``), revalidation and the charge (the demo
provider), ``executing`` and ``executed``, the step's write (``run_step``) and each
thread hint. Not in ``run_all.py``: a diagnostic for ``bench/README.md`` ("Where the time
goes"), not a target. Writes ``results/breakdown.json``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, log, machine, server_versions, services, write_json
from signoff.demo.desk import build
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.keys import Keys
from signoff.testing import Harness

STORE_CALLS = ("decide", "run_with_cards", "begin_execution", "finish_execution", "run_step")


def timed(target: Any, name: str, samples: list[float]) -> None:
    """Replace ``target.name`` (a coroutine function) by one that times each call."""
    call: Callable[..., Awaitable[Any]] = getattr(target, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return await call(*args, **kwargs)
        finally:
            samples.append((time.perf_counter_ns() - t0) / 1e6)

    setattr(target, name, wrapper)


async def measure(database_url: str, redis_url: str, n: int) -> dict[str, Any]:
    tenant = "bench-breakdown"
    bus = RedisBus.from_url(redis_url, Keys("so-breakdown:"))
    samples: dict[str, list[float]] = defaultdict(list)
    async with Harness(
        build((tenant,)), database_url=database_url, tenant=tenant, offline=True, bus=bus
    ) as h:
        cards = []
        for i in range(n + 5):
            thread = await h.thread("alice")
            await h.say(thread, f"cobre {100 + i} do João", "alice")
            cards.extend(await h.pending(thread))
        await h.settle()
        for name in STORE_CALLS:
            timed(h.store, name, samples[name])
        tool = h.app.tools.get("create_pix_charge")
        assert tool is not None
        timed(tool, "revalidate", samples["provider revalidate"])
        timed(tool, "execute", samples["provider charge"])
        assert h.worker is not None
        timed(h.worker.agent.notify, "thread", samples["thread hint (worker)"])
        for card in cards[:5]:  # warm-up, not counted
            await h.approve(card)
            await h.settle()
        for values in samples.values():
            values.clear()
        for card in cards[5:]:
            await h.approve(card)
            await h.settle()

    def stats(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {
            "n": len(ordered),
            "p50": round(statistics.median(ordered), 3),
            "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        }

    return {name: stats(values) for name, values in samples.items() if values}


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--decisions", type=int, default=60)
    args = p.parse_args(argv)
    with services(args, "breakdown") as svc:
        calls = asyncio.run(measure(svc.database_url, svc.redis_url, args.decisions))
        versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
    for name, row in calls.items():
        log(f"  {name:24s} n={row['n']:4d} p50 {row['p50']:8.3f} ms  p90 {row['p90']:8.3f} ms")
    path = write_json(
        args.out, "breakdown", {"machine": machine(), "servers": versions, "calls_ms": calls}
    )
    log(f"breakdown: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
