#!/usr/bin/env python3
"""A backlog of messages worked off by one worker, then two: how a worker's intake bound
(``SIGNOFF_TURNS_IN_FLIGHT``, design note 58) shares it with a worker started later.

The payments demo runs in-process (``signoff.testing.Harness``: one worker on a Redis
bus) against the fake Messages API with ``--latency`` seconds per reply, as a hosted
model answers in seconds. Each round queues ``--messages`` messages (one per thread,
each answered by one model reply, no card), lets the first worker run alone for
``--late`` seconds, then starts a second worker on the same inbox, and times until
every message's run has ended. The bounds of ``--bounds`` alternate (A B C, C B A,
...); ``0`` is a bound no backlog reaches, as before note 58 (the first worker claims
everything it is given). Reported per round: messages/s, the
share the later worker ran, the most model calls at once, and the most entries one
worker held at once (read from the inbox and not acked). Not in ``run_all.py``.
Writes ``results/backlog.json``.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, log, machine, server_versions, services, write_json
from signoff.demo import build
from signoff.runtime.bus import Job
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.config import Settings
from signoff.runtime.keys import Keys
from signoff.runtime.worker import Worker
from signoff.testing import FakeMessagesServer, Harness, ScriptedReply, reply, text

UNBOUNDED = 1_000_000  # no backlog reaches it: as before note 58


def answer(body: dict[str, Any]) -> ScriptedReply:
    return reply(text("Anotado."))


async def _ended(h: Harness, threads: list[str]) -> dict[str, int]:
    async with h.store.pool.connection() as conn:
        rows = await conn.fetch(
            "SELECT worker_id, count(*) AS n FROM runs WHERE thread_id = ANY($1::uuid[])"
            " AND status = 'done' GROUP BY worker_id",
            threads,
        )
    return {row["worker_id"]: row["n"] for row in rows}


async def one_round(
    database_url: str, redis_url: str, bound: int, messages: int, latency: float, late: float
) -> dict[str, float]:
    tag = secrets.token_hex(3)
    prefix = f"so-backlog-{tag}:"
    bus = RedisBus.from_url(redis_url, Keys(prefix))
    settings = Settings(turns_in_flight=bound, key_prefix=prefix)
    with FakeMessagesServer(responder=answer, latency=latency) as fake:
        async with Harness(
            build((f"bench-backlog-{tag}",)),
            database_url=database_url,
            fake=fake,
            bus=bus,
            settings=settings,
            start_worker=False,
        ) as h:
            threads = [await h.thread("alice") for _ in range(messages)]
            for n, thread in enumerate(threads):
                job = Job(thread_id=thread, text=f"anote {n}", user="alice", tenant=h.tenant)
                await bus.enqueue(job)
            second = Worker(
                settings=h.settings.with_(worker_id=h.settings.worker_id + "-late"),
                store=h.store,
                bus=bus,
                app=h.app,
                model=h.worker.agent.model,
            )
            most_held = 0
            t0 = time.perf_counter()
            await h.worker.start()
            started_second = False
            try:
                while True:
                    held = max(h.worker.intake.in_flight, second.intake.in_flight)
                    most_held = max(most_held, held)
                    if not started_second and time.perf_counter() - t0 >= late:
                        await second.start()
                        started_second = True
                    done = await _ended(h, threads)
                    if sum(done.values()) >= messages:
                        break
                    if time.perf_counter() - t0 > 600:
                        raise SystemExit(f"{sum(done.values())} of {messages} ended in 600 s")
                    await asyncio.sleep(0.05)
                elapsed = time.perf_counter() - t0
            finally:
                await second.stop()
            return {
                "seconds": round(elapsed, 3),
                "messages_per_s": round(messages / elapsed, 1),
                "later_worker_share": round(done.get(second.worker_id, 0) / messages, 3),
                "most_model_calls_at_once": fake.most_in_flight,
                "most_held_by_one_worker": most_held,
            }


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=600, help="messages queued per round")
    p.add_argument("--latency", type=float, default=1.0, help="seconds per model reply")
    p.add_argument("--late", type=float, default=1.0, help="seconds before the second worker")
    p.add_argument("--reps", type=int, default=2, help="rounds per variant")
    p.add_argument(
        "--bounds",
        default=f"{Settings().turns_in_flight},0",
        help="SIGNOFF_TURNS_IN_FLIGHT values compared, comma-separated (0: unbounded)",
    )
    args = p.parse_args(argv)
    bounds = {
        (b.strip() if b.strip() != "0" else "unbounded"): int(b) or UNBOUNDED
        for b in args.bounds.split(",")
    }
    variants = list(bounds)
    rounds: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with services(args, "backlog") as svc:
        for rep in range(args.reps):
            for variant in variants if rep % 2 == 0 else variants[::-1]:
                row = asyncio.run(
                    one_round(
                        svc.database_url,
                        svc.redis_url,
                        bounds[variant],
                        args.messages,
                        args.latency,
                        args.late,
                    )
                )
                rounds[variant].append(row)
                log(f"  {variant}: {row}")
        versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
    summary = {
        variant: {
            "messages_per_s": statistics.median(r["messages_per_s"] for r in rows),
            "min": min(r["messages_per_s"] for r in rows),
            "max": max(r["messages_per_s"] for r in rows),
            "later_worker_share": statistics.median(r["later_worker_share"] for r in rows),
            "most_model_calls_at_once": max(r["most_model_calls_at_once"] for r in rows),
            "most_held_by_one_worker": max(r["most_held_by_one_worker"] for r in rows),
            "runs": len(rows),
        }
        for variant, rows in rounds.items()
    }
    path = write_json(
        args.out,
        "backlog",
        {
            "machine": machine(),
            "servers": versions,
            "config": {
                "messages": args.messages,
                "latency_s": args.latency,
                "late_s": args.late,
                "bounds": bounds,
            },
            "rounds": rounds,
            "summary": summary,
        },
    )
    log(f"backlog: {summary}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
