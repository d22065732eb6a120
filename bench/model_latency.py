#!/usr/bin/env python3
"""Approvals continued per second when the model takes its time: a continuation's step slot
held through the model's reply (as before design note 56) or let go while it waits.

The payments demo runs in-process (``signoff.testing.Harness``: decisions and one worker,
a Redis bus) against the fake Messages API with ``--latency`` seconds per reply, as a
hosted model answers in seconds where the bench's offline model answers at once. Each
round parks ``--runs`` runs (one Pix card each), approves them all at once and times
until every run has its model's last reply: continuations/s = runs / that time, and the
most model calls the continuations made at once. The two variants (``held``: the slot
kept through every call, ``runtime/slots.PATIENCE`` set to infinity; ``let-go``: as
shipped) alternate (A B, B A, ...) over ``--reps`` rounds each, with ``--steps`` slots.
Not in ``run_all.py``. Writes ``results/model_latency.json``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, log, machine, server_versions, services, write_json
from signoff.demo import build
from signoff.runtime import slots
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Status
from signoff.runtime.config import Settings
from signoff.runtime.keys import Keys
from signoff.testing import FakeMessagesServer, Harness, ScriptedReply, reply, text, tool_use


def answer(body: dict[str, Any]) -> ScriptedReply:
    """A charge for a user's message; a closing text once the tool's result is in."""
    content = body["messages"][-1]["content"]
    if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
        return reply(text("Feito."))
    return reply(tool_use("create_pix_charge", {"customer": "João", "amount": "10"}))


VARIANTS = {"held": float("inf"), "let-go": slots.PATIENCE}


async def one_round(
    database_url: str, redis_url: str, steps: int, runs: int, latency: float, tag: str
) -> dict[str, float]:
    tenant = f"bench-model-{tag}"
    bus = RedisBus.from_url(redis_url, Keys(f"so-{tag}:"))
    settings = Settings(steps_in_flight=steps)
    with FakeMessagesServer(responder=answer, latency=latency) as fake:
        async with Harness(
            build((tenant,)),
            database_url=database_url,
            tenant=tenant,
            fake=fake,
            bus=bus,
            settings=settings,
        ) as h:
            threads = [await h.thread("alice") for _ in range(runs)]
            await asyncio.gather(*(h.say(t, "cobre 10 do João", "alice") for t in threads))
            cards = [card for t in threads for card in await h.pending(t)]
            if len(cards) != runs:
                raise SystemExit(f"{len(cards)} cards parked of {runs}")
            fake.reset_most_in_flight()
            t0 = time.perf_counter()
            await asyncio.gather(*(h.decide(card, "approve") for card in cards))
            await h.settle(timeout=600)
            elapsed = time.perf_counter() - t0
            executed = [(await h.card(c)).status for c in cards].count(Status.EXECUTED)
            if executed != runs:
                raise SystemExit(f"{executed} of {runs} cards executed")
            return {
                "seconds": round(elapsed, 3),
                "continuations_per_s": round(runs / elapsed, 1),
                "most_model_calls_at_once": fake.most_in_flight,
            }


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=200, help="runs parked and approved per round")
    p.add_argument("--latency", type=float, default=1.0, help="seconds per model reply")
    p.add_argument("--steps", type=int, default=10, help="SIGNOFF_STEPS_IN_FLIGHT")
    p.add_argument("--reps", type=int, default=2, help="rounds per variant")
    args = p.parse_args(argv)
    variants = list(VARIANTS)
    rounds: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with services(args, "model_latency") as svc:
        for rep in range(args.reps):
            for variant in variants if rep % 2 == 0 else variants[::-1]:
                slots.PATIENCE = VARIANTS[variant]
                row = asyncio.run(
                    one_round(
                        svc.database_url,
                        svc.redis_url,
                        args.steps,
                        args.runs,
                        args.latency,
                        f"{variant}-{rep}",
                    )
                )
                rounds[variant].append(row)
                log(f"  {variant:7s}: {row}")
        versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
    summary = {
        variant: {
            "continuations_per_s": statistics.median(r["continuations_per_s"] for r in rows),
            "min": min(r["continuations_per_s"] for r in rows),
            "max": max(r["continuations_per_s"] for r in rows),
            "most_model_calls_at_once": max(r["most_model_calls_at_once"] for r in rows),
            "runs": len(rows),
        }
        for variant, rows in rounds.items()
    }
    path = write_json(
        args.out,
        "model_latency",
        {
            "machine": machine(),
            "servers": versions,
            "config": {"runs": args.runs, "latency_s": args.latency, "steps": args.steps},
            "rounds": rounds,
            "summary": summary,
        },
    )
    log(f"model_latency: {summary}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
