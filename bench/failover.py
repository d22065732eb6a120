#!/usr/bin/env python3
"""Failover: kill -9 a worker holding N parked runs under load; time until every run of it
is adopted and every decision on it applied. Lost must be 0.

1. Worker A alone parks N runs (real path: WebSocket message -> offline model -> card).
2. Worker B starts; M more runs are parked (the load, spread over A and B).
3. Open-loop approvals at ``--rate`` per second go to the load runs B holds (so that
   no execution of A's is cut in half: a card killed mid-execution stays
   ``executing`` for an operator by design, I4, and is not what this measures).
4. One second in, A is killed with SIGKILL; right after, all N of A's cards are
   approved (committed in Postgres; the signal goes to a dead channel).
5. Postgres is polled every 50 ms: *adopted* when no active run is A's any more,
   *applied* when all N of A's runs are done and their cards executed.

``failover_s`` = kill -> applied (every run continued, every decision applied).
The lease is ``--lease`` seconds (``SIGNOFF_LEASE_SECONDS``; the product default
is 10 s, which alone puts adoption near 10-12 s). Lost = A's approved cards not
executed after ``--timeout``; the exactly-once check runs over the whole store.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg

from bench.common import (
    TMP,
    Cluster,
    base_parser,
    cluster,
    exactly_once,
    gather_limited,
    log,
    machine,
    machine_busy,
    plt,
    progress,
    raise_nofile,
    server_versions,
    services,
    spread,
    write_json,
)
from bench.users import Card, Users


async def holders(db: asyncpg.Connection, cards: list[Card]) -> dict[str, str]:
    rows = await db.fetch(
        "SELECT c.id::text AS card, r.worker_id FROM cards c JOIN runs r ON r.id = c.run_id "
        "WHERE c.id = ANY($1::uuid[])",
        [c.id for c in cards],
    )
    return {r["card"]: r["worker_id"] for r in rows}


async def one_failover(c: Cluster, svc: Any, args: Any, rep: int) -> dict[str, Any]:
    (a,) = c.workers
    db = await asyncpg.connect(svc.database_url)
    users = Users(c, args.users, prefix=f"f{rep}-")
    await users.open()
    try:
        bar = progress(args.parked + args.load, f"failover {rep + 1}: park", args.no_progress)
        held = await users.park(args.parked, limit=32, bar=bar)
        b = c.add_worker()
        load = await users.park(args.load, limit=32, bar=bar)
        bar.close()
        owner = await holders(db, held + load)
        if any(owner[x.id] != a.name for x in held):
            raise RuntimeError("worker A does not hold all of its parked runs")
        load_b = [x for x in load if owner[x.id] == b.name]
        log(f"failover {rep + 1}: A holds {len(held)} parked runs; B holds {len(load_b)} load runs")

        async def open_loop() -> None:
            t0 = time.monotonic()
            for i, card in enumerate(load_b):
                wait = t0 + i / args.rate - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await users.click(card)

        users.expect(len(held) + len(load_b))
        loader = asyncio.create_task(open_loop())
        await asyncio.sleep(1.0)
        a.signal(signal.SIGKILL)
        killed = time.monotonic()
        assert a.popen is not None
        await asyncio.to_thread(a.popen.wait)
        await gather_limited([users.click(x) for x in held], 32)
        approved_in = time.monotonic() - killed
        adopted = applied = None
        ids = [x.id for x in held]
        deadline = killed + args.timeout
        while time.monotonic() < deadline:
            if adopted is None:
                left = await db.fetchval(
                    "SELECT count(*) FROM runs WHERE worker_id = $1 "
                    "AND status IN ('running', 'waiting')",
                    a.name,
                )
                if left == 0:
                    adopted = time.monotonic() - killed
            done = await db.fetchval(
                "SELECT count(*) FROM cards c JOIN runs r ON r.id = c.run_id "
                "WHERE c.id = ANY($1::uuid[]) AND c.status = 'executed' AND r.status = 'done'",
                ids,
            )
            if done == len(ids):
                applied = time.monotonic() - killed
                break
            await asyncio.sleep(0.05)
        await loader
        await users.wait_results(60)
        lost = await db.fetchval(
            "SELECT count(*) FROM cards WHERE id = ANY($1::uuid[]) AND status <> 'executed'", ids
        )
        load_done = sum(1 for x in load_b if x.result_ns)
        return {
            "parked_on_killed_worker": len(held),
            "load_runs_on_survivor": len(load_b),
            "load_results": load_done,
            "approved_all_in_s": round(approved_in, 3),
            "adopted_s": None if adopted is None else round(adopted, 3),
            "applied_s": None if applied is None else round(applied, 3),
            "lost": int(lost),
            "errors": len(users.errors),
        }
    finally:
        await users.close()
        await db.close()


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--parked", type=int, default=300, help="parked runs on the killed worker")
    p.add_argument("--load", type=int, default=150, help="load runs (spread over both workers)")
    p.add_argument("--rate", type=float, default=50.0, help="load approvals per second")
    p.add_argument("--users", type=int, default=50)
    p.add_argument("--lease", type=float, default=3.0, help="SIGNOFF_LEASE_SECONDS")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    raise_nofile()
    busy = machine_busy()
    t0 = time.monotonic()
    reps = []
    checks = []
    for rep in range(args.repeat):
        with services(args, "failover") as svc:
            versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
            env = {
                "SIGNOFF_LEASE_SECONDS": str(args.lease),
                "SIGNOFF_WS_FRAMES_PER_SECOND": "0",
                "SIGNOFF_CLAIM_IDLE_MS": "1000",
            }
            with cluster(svc, TMP / f"failover{rep}", gateways=2, workers=1, **env) as c:
                res = asyncio.run(one_failover(c, svc, args, rep))
            check = asyncio.run(exactly_once(svc.database_url))
        checks.append(check)
        reps.append(res)
        log(
            f"failover {rep + 1}: adopted in {res['adopted_s']} s, applied in {res['applied_s']} s, "
            f"lost {res['lost']}, exactly once {check['ok']}"
        )
    applied = [r["applied_s"] for r in reps if r["applied_s"] is not None]
    summary = {
        "failover_s": spread(applied if len(applied) == len(reps) else [float("inf")], "s"),
        "failover_adopted_s": spread([r["adopted_s"] or float("nan") for r in reps], "s"),
        "failover_lost": {
            "value": sum(r["lost"] for r in reps),
            "unit": "decisions",
            "runs": len(reps),
            "min": min(r["lost"] for r in reps),
            "max": max(r["lost"] for r in reps),
        },
    }
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 3.5))
    for i, r in enumerate(reps):
        ax.barh(i, r["adopted_s"] or 0, color="tab:orange", label="adopted" if i == 0 else None)
        ax.barh(
            i,
            (r["applied_s"] or 0) - (r["adopted_s"] or 0),
            left=r["adopted_s"] or 0,
            color="tab:green",
            label="decisions applied" if i == 0 else None,
        )
    ax.axvline(args.lease, color="gray", linestyle=":", label=f"lease {args.lease:g} s")
    ax.set_yticks(range(len(reps)), [f"run {i + 1}" for i in range(len(reps))])
    ax.set_xlabel(f"seconds after kill -9 of a worker holding {args.parked} parked runs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "failover.png", dpi=110)
    pyplot.close(fig)
    ok = all(ch["ok"] for ch in checks) and summary["failover_lost"]["value"] == 0
    data = {
        "config": {
            "parked": args.parked,
            "load": args.load,
            "rate": args.rate,
            "lease_seconds": args.lease,
            "repeat": args.repeat,
        },
        "machine": {**machine(), **versions, **busy},
        "summary": summary,
        "repeats": reps,
        "exactly_once": {**checks[-1], "ok": ok, "all": checks},
        "plots": ["failover.png"],
        "seconds": round(time.monotonic() - t0, 1),
    }
    path = write_json(out, "failover", data)
    log(f"failover: wrote {path}; lost {summary['failover_lost']['value']}; ok {ok}")
    if not ok:
        log("failover: EXACTLY-ONCE / LOST CHECK FAILED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
