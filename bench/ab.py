#!/usr/bin/env python3
"""A/B a lever in one run: ``decisions.py`` alternately with two environments (A B A B ...).

Each run is a short ``decisions.py`` (open loop at 100/s and 1000/s offered, a closed
loop of 64 users) on fresh servers and fresh gateway and worker processes; the two
variants alternate, so both see the same machine state (on a shared machine the load
drifts: never compare runs taken minutes apart). For every figure the median over
the repetitions of each side is reported with its min..max, and B / A.

Example: ``bench/ab.py --name uvloop --a SIGNOFF_EVENT_LOOP=asyncio
--b SIGNOFF_EVENT_LOOP=uvloop --reps 3`` writes ``results/ab_uvloop.json``.

``--a-root`` / ``--b-root``: two commits' code instead of two settings, each side run
from its own checkout (``git worktree add /tmp/old <commit>``; a process started there
imports that checkout's signoff).

``--latency``: instead, what one decision at a time costs the person, for a lever that
saves round trips rather than CPU: an open loop at 25/s (6 s of arrivals, the machine
otherwise idle) and one user approving card after card (150 decisions).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, ROOT, TMP, log, machine_busy, spread

PHASES = [
    "--rates", "100,1000", "--seconds", "2,0.4", "--open-runs", "1,1",
    "--concurrency", "64", "--closed-decisions", "384", "--closed-runs", "1",
    "--users", "100", "--max-seconds", "120",
]  # fmt: skip


LATENCY_PHASES = [
    "--rates", "25", "--seconds", "6", "--open-runs", "1",
    "--concurrency", "1", "--closed-decisions", "150", "--closed-runs", "1",
    "--users", "100", "--max-seconds", "120",
]  # fmt: skip


def latency_figures(data: dict[str, Any]) -> dict[str, float]:
    s = data["summary"]
    o25, c1 = s.get("open_25", {}), s.get("closed_1", {})

    def v(g: dict[str, Any], k: str) -> float:
        x = g.get(k, {}).get("value")
        return float(x) if x is not None else float("nan")

    return {
        "click_to_ack_p50_ms_at_25": v(o25, "click_to_resolved_p50_ms"),
        "click_to_executed_p50_ms_at_25": v(o25, "decision_to_result_p50_ms"),
        "click_to_executed_p99_ms_at_25": v(o25, "decision_to_result_p99_ms"),
        "closed1_click_to_ack_p50_ms": v(c1, "click_to_resolved_p50_ms"),
        "closed1_click_to_executed_p50_ms": v(c1, "decision_to_result_p50_ms"),
        "closed1_click_to_executed_p99_ms": v(c1, "decision_to_result_p99_ms"),
        "closed1_decisions_per_s": v(c1, "decisions_per_s"),
    }


def figures(data: dict[str, Any]) -> dict[str, float]:
    s = data["summary"]
    o100, o1000, c64 = s.get("open_100", {}), s.get("open_1000", {}), s.get("closed_64", {})

    def v(g: dict[str, Any], k: str) -> float:
        x = g.get(k, {}).get("value")
        return float(x) if x is not None else float("nan")

    out = {
        "click_to_ack_p50_ms_at_100": v(o100, "click_to_resolved_p50_ms"),
        "click_to_ack_p99_ms_at_100": v(o100, "click_to_resolved_p99_ms"),
        "click_to_executed_p50_ms_at_100": v(o100, "decision_to_result_p50_ms"),
        "click_to_executed_p99_ms_at_100": v(o100, "decision_to_result_p99_ms"),
        "click_to_executed_p50_ms_at_1000": v(o1000, "decision_to_result_p50_ms"),
        "click_to_executed_p99_ms_at_1000": v(o1000, "decision_to_result_p99_ms"),
        "answered_per_s_at_1000": v(o1000, "decisions_per_s"),
        "closed64_decisions_per_s": v(c64, "decisions_per_s"),
        "closed64_executed_per_s": v(c64, "results_per_s"),
    }
    cost = (c64.get("cost_run1") or {}).get("cpu_ms_per_decision", {})
    for role in ("gateways", "workers", "postgres", "total"):
        out[f"closed64_cpu_ms_{role}"] = float(cost.get(role, float("nan")))
    # The message path, from the parking before the 64-user loop (a new thread, its first
    # message, the card on the chat socket; at most --park-limit in flight).
    out["parking_runs_per_s"] = v(c64, "parking_runs_per_s")
    out["parking_message_to_card_p50_ms"] = v(c64, "message_to_card_p50_ms")
    parking = (c64.get("parking_cost_run1") or {}).get("cpu_ms_per_decision", {})
    for role in ("gateways", "workers", "postgres", "total"):
        out[f"parking_cpu_ms_{role}"] = float(parking.get(role, float("nan")))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True)
    p.add_argument("--a", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--b", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--latency", action="store_true", help="one decision at a time (above)")
    for side in ("a", "b"):  # two commits' code: a checkout (git worktree) per side
        p.add_argument(
            f"--{side}-root",
            type=Path,
            default=ROOT,
            help=f"the checkout whose bench/decisions.py and code run side {side.upper()}",
        )
    args = p.parse_args(argv)
    phases, read = (LATENCY_PHASES, latency_figures) if args.latency else (PHASES, figures)
    busy = machine_busy()
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    t0 = time.monotonic()
    for rep in range(args.reps):
        for side in ("a", "b") if rep % 2 == 0 else ("b", "a"):
            out = TMP / "ab" / f"{args.name}-{side}-{rep}"
            out.mkdir(parents=True, exist_ok=True)
            env = [x for kv in getattr(args, side) for x in ("--env", kv)]
            root = getattr(args, f"{side}_root")  # its signoff is imported from there
            cmd = [sys.executable, str(root / "bench" / "decisions.py"), "--no-progress"]
            cmd += ["--out", str(out), *phases, *env]
            code = subprocess.run(cmd, cwd=root, check=False, timeout=300).returncode
            if code != 0:
                log(f"ab: {side} run {rep + 1} exited {code}")
                continue
            figs = read(json.loads((out / "decisions.json").read_text()))
            runs[side].append(figs)
            log(f"ab {args.name} {side} run {rep + 1}: {figs}")
    keys = list(runs["a"][0]) if runs["a"] else []
    table: dict[str, Any] = {}
    for k in keys:
        a = spread([r[k] for r in runs["a"]], "")
        b = spread([r[k] for r in runs["b"]], "")
        ratio = b["value"] / a["value"] if a["value"] and b["value"] else None
        table[k] = {"a": a, "b": b, "b_over_a": round(ratio, 3) if ratio else None}
    data = {
        "name": args.name,
        "a": args.a,
        "b": args.b,
        "a_root": str(args.a_root),
        "b_root": str(args.b_root),
        "reps": args.reps,
        "phases": "latency" if args.latency else "default",
        "order": "A B, then B A, alternating",
        "machine": busy,
        "figures": table,
        "runs": runs,
        "seconds": round(time.monotonic() - t0, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"ab_{args.name}.json").write_text(json.dumps(data, indent=2) + "\n")
    for k, row in table.items():
        a, b = row["a"], row["b"]
        log(
            f"  {k:36s} A {a['value']} ({a['min']}..{a['max']})  "
            f"B {b['value']} ({b['min']}..{b['max']})  B/A {row['b_over_a']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
