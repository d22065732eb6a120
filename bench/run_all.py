#!/usr/bin/env python3
"""Run the whole bench suite in one command (< 10 minutes on the 2-core machine).

Runs, in order and one at a time: ``limits.py`` (the physical floor),
``decisions.py``, ``compare_langgraph.py``, ``parked.py``, ``failover.py``,
``workflows.py`` (signoff's event gate beside DBOS Transact's ``recv``). Each
starts and stops every process it needs (a private Postgres and Valkey, signoff
gateways and workers) and writes ``bench/results/<name>.json`` and PNG plots.
Then ``bench/results/summary.json`` and the table in ``bench/README.md`` are
regenerated from those files (``report.py``).

Exits non-zero when a script failed, overran its time, or found a decision lost
or executed twice.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report
from bench.common import RESULTS, ROOT, log, machine_busy

WORKFLOWS = [
    "--repeat", "1", "--dbos-parked", "1000", "--latency-wakes", "300",
    "--saturation-wakes", "600", "--parked", "5000,30000",
]  # fmt: skip

SCRIPTS = [
    ("limits", ["--samples", "600"], 90),
    ("decisions", [], 220),
    ("compare_langgraph", [], 200),
    # 10k and 30k parked runs (100k alone: bench/parked.py): 100k took 175 s of adoption
    # on the slower machine of 2026-12-01
    ("parked", ["--runs", "10000,30000"], 320),
    ("failover", [], 120),
    # one repeat, 300/600 wakes, 5k/30k signoff and 1k DBOS parked here (DBOS did ~45
    # wakes/s on that machine): the suite stays under 10 minutes;
    # bench/workflows.py alone takes --repeat and larger sets
    ("workflows", WORKFLOWS, 300),
]


# What the scripts import beyond signoff's own dependencies (the `bench` extra).
BENCH_MODULES = ("tqdm", "matplotlib", "langgraph", "dbos", "psycopg")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated script names to run (default: all)")
    p.add_argument("--report-only", action="store_true", help="only regenerate the report")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run of the suite")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the JSON results (default: bench/results; with --quick, "
        "bench/results/quick). Only a run into the default folder, not --quick, where no "
        "script failed regenerates the README tables (with --only, from that run's JSON "
        "files and the earlier ones of the other scripts)",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0,
        help="wait up to this many seconds for the machine to be idle (< 30%% CPU) first",
    )
    p.add_argument("--database-url", help="passed to every script (default: private servers)")
    p.add_argument("--redis-url", help="passed to every script")
    args = p.parse_args(argv)
    missing = [m for m in BENCH_MODULES if importlib.util.find_spec(m) is None]
    if missing and not args.report_only:
        log(
            f"run_all: the bench needs its extras ({', '.join(missing)} missing): "
            ".venv/bin/pip install -e '.[test,bench]'"
        )
        return 2
    if args.out is None:
        args.out = RESULTS / "quick" if args.quick else RESULTS
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        default = args.out.resolve() == RESULTS.resolve()
        report.write(args.out, readme=report.README if default else None)
        return 0
    if args.wait_quiet:
        deadline = time.monotonic() + args.wait_quiet
        while time.monotonic() < deadline:
            busy = machine_busy(2.0)
            if busy["cpu_busy_before_start"] < 0.3:
                break
            log(f"run_all: machine busy ({busy}); waiting for it to be quiet")
    wanted = set(args.only.split(",")) if args.only else None
    quick = {
        "decisions": ["--quick"],
        "compare_langgraph": ["--runs", "1", "--decisions", "30,64"],
        "parked": ["--runs", "2000,5000", "--sockets", "200,500", "--sample", "20"],
        "failover": ["--repeat", "1", "--parked", "100", "--load", "50"],
        "limits": ["--runs", "2", "--samples", "300"],
        "workflows": ["--quick"],
    }
    common = ["--out", str(args.out)]
    if args.database_url:
        common += ["--database-url", args.database_url]
    if args.redis_url:
        common += ["--redis-url", args.redis_url]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if sys.stderr.isatty():
        env["BENCH_PROGRESS"] = "1"
    t0 = time.monotonic()
    failed: list[str] = []
    timings = {}
    for name, extra, limit in SCRIPTS:
        if wanted is not None and name not in wanted:
            continue
        argv_ = [sys.executable, str(ROOT / "bench" / f"{name}.py"), *common, *extra]
        if args.quick:
            argv_ += quick.get(name, [])
        log(f"run_all: {name} (time limit {limit} s) ...")
        t = time.monotonic()
        try:
            code = subprocess.run(argv_, cwd=ROOT, env=env, timeout=limit, check=False).returncode
        except subprocess.TimeoutExpired:
            log(f"run_all: {name} overran {limit} s")
            code = -1
        timings[name] = round(time.monotonic() - t, 1)
        log(f"run_all: {name} exit {code} in {timings[name]} s")
        if code != 0:
            failed.append(name)
    total = round(time.monotonic() - t0, 1)
    # run_all.json first: the report quotes it.
    (args.out / "run_all.json").write_text(
        json.dumps({"seconds": total, "scripts": timings, "failed": failed}, indent=2) + "\n"
    )
    # The README tables are the committed figures: a smoke run, a run into another folder
    # or one where a script failed must not replace them (its summary.json is in --out).
    publish = args.out.resolve() == RESULTS.resolve() and not args.quick and not failed
    summary = report.write(args.out, readme=report.README if publish else None)
    if not publish:
        log(f"run_all: README tables left as they were; this run's figures: {args.out}")
    missed = [k for k, v in summary.items() if isinstance(v, dict) and v.get("met") is False]
    if args.quick:
        # Smoke sizes (16 users, 5,000 parked runs, phases at 50/s and 200/s): set against
        # the full run's targets they only alarm; the figures below are for a sanity look.
        log(
            f"run_all: {total} s; failed: {failed or 'none'}; a --quick run is a smoke test: "
            "its figures are not compared with the targets (run without --quick for those)"
        )
    else:
        log(f"run_all: {total} s; failed: {failed or 'none'}; targets missed: {missed or 'none'}")
    for k, v in summary.items():
        if isinstance(v, dict) and "value" in v:
            log(
                f"  {k:40s} {v['value']} {v.get('unit', '')}  ({v.get('min')}..{v.get('max')}, runs {v.get('runs')})"
            )
    if total > 600:
        log("run_all: the suite took longer than 10 minutes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
