#!/usr/bin/env python3
"""Where the CPU goes: py-spy on every gateway and worker while decisions flow.

Starts the same cluster as ``decisions.py`` (2 gateways, 2 workers, offline model),
parks ``--decisions`` runs, then approves them in a closed loop with ``--users``
users while ``py-spy record`` samples every signoff process for ``--seconds``. Two
passes per process and window: ``--gil`` (only samples holding the GIL: Python's
own CPU) and without it (also time inside syscalls, which on a busy 2-vCPU machine
is mostly a writer preempted when its write wakes a peer). Writes
``results/profile.json``: per process, the top frames by self time and the
inclusive share of signoff's own functions; the raw collapsed stacks go to
``results/tmp/profile/`` for flame graphs. Needs ptrace rights (root, or
``kernel.yama.ptrace_scope=0``). Not part of ``run_all.py``: profiling perturbs
the figures it would sit beside.
"""

from __future__ import annotations

import asyncio
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import TMP, Cluster, base_parser, cluster, exactly_once, log, services, write_json
from bench.decisions import Bench
from bench.users import Users

OURS = ("runtime/", "store/", "gateway/", "examples/")
_LINE = re.compile(r":\d+\)")


def parser() -> Any:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=64, help="closed-loop users")
    p.add_argument("--decisions", type=int, default=4000, help="parked runs to approve")
    p.add_argument("--seconds", type=float, default=5.0, help="sampling window per pass")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    return p


def summarize(path: Path, top: int) -> dict[str, Any]:
    """Self time of leaf frames and inclusive time of signoff's functions, in %."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_LINE.sub(")", f) for f in stack.split(";")]
        own[frames[-1]] += n
        for f in set(frames):
            if any(o in f for o in OURS):
                incl[f] += n

    def pct(c: collections.Counter[str], k: int) -> list[dict[str, Any]]:
        return [{"frame": f, "percent": round(100 * v / total, 1)} for f, v in c.most_common(k)]

    return {"samples": total, "self": pct(own, top), "inclusive_signoff": pct(incl, 2 * top)}


async def sample(c: Cluster, args: Any, out: Path) -> dict[str, Any]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    procs = [*c.gateways, *c.workers]
    result: dict[str, Any] = {}
    for gil in (True, False):
        runs = []
        for p in procs:
            raw = out / f"{p.name}{'-gil' if gil else ''}.txt"
            argv = [spy, "record", "--pid", str(p.pid), "--duration", str(int(args.seconds))]
            argv += ["--rate", str(args.rate), "--format", "raw", "-o", str(raw), "--nonblocking"]
            argv += ["--gil"] if gil else []
            spawned = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL)
            runs.append((p.name, raw, spawned))
        for name, raw, spawned in runs:
            await spawned.wait()
            if raw.exists():
                key = "python_cpu" if gil else "on_cpu_or_in_syscalls"
                result.setdefault(name, {})[key] = summarize(raw, args.top)
    return result


async def run(c: Cluster, args: Any, out: Path) -> dict[str, Any]:
    users = Users(c, args.users, prefix="pu")
    await users.open()
    bench = Bench(c, users, argparse_like(args))
    cards = await bench.park_for(args.decisions, args.users, "profile")
    await bench.drain([])
    loop = asyncio.create_task(bench.closed_loop(cards, args.users))
    await asyncio.sleep(1.0)  # past the ramp
    t = time.monotonic()
    profiles = await sample(c, args, out)
    took = time.monotonic() - t
    if not loop.done():
        log(f"profile: sampled {took:.1f}s; waiting for the loop to finish")
    phase = await loop
    await users.close()
    return {
        "profiles": profiles,
        "phase": {
            k: phase.get(k) for k in ("decisions_per_s", "results_per_s", "errors", "decisions")
        },
        "loop_still_running_when_sampling_ended": not loop.done(),
    }


def argparse_like(args: Any) -> Any:
    """The knobs Bench reads, with decisions.py's defaults."""
    args.park_limit = getattr(args, "park_limit", 48)
    args.drain_timeout = getattr(args, "drain_timeout", 120.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = TMP / "profile"
    out.mkdir(parents=True, exist_ok=True)
    with services(args, "profile") as svc:
        env = {"SIGNOFF_WS_FRAMES_PER_SECOND": "0", "SIGNOFF_POOL_SIZE": "10"}
        with cluster(svc, TMP / "profile-cluster", gateways=2, workers=2, **env) as c:
            result = asyncio.run(run(c, args, out))
            check = asyncio.run(exactly_once(svc.database_url))
    data = {
        "config": {k: getattr(args, k) for k in ("users", "decisions", "seconds", "rate")},
        **result,
        "raw_stacks": str(out),
        "exactly_once": check,
    }
    path = write_json(args.out, "profile", data)
    for name, prof in result["profiles"].items():
        py = prof.get("python_cpu", {})
        log(f"profile: {name}: {py.get('samples', 0)} GIL samples; top signoff frames:")
        for row in py.get("inclusive_signoff", [])[:8]:
            log(f"    {row['percent']:5.1f}%  {row['frame']}")
    log(f"profile: wrote {path}")
    return 0 if check["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
