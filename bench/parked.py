#!/usr/bin/env python3
"""Memory per parked run (worker RSS, Redis used_memory) and per idle WebSocket (gateway RSS).

Parked runs. 10k and 100k parked runs are too many to create through the model
path in a bench's time (each is a full turn: inbox, model, prepare, card), so:

1. one run is parked the normal way (WebSocket message -> offline model -> card);
2. that thread, its log, its run and its card are cloned in Postgres with
   ``INSERT ... SELECT ... FROM generate_series`` (fresh ids, a unique
   ``request_key`` and ``operation_id`` each, the pending card's audit row), the
   runs held by a worker whose lease already lapsed (a row in ``workers``);
3. the measured ``signoff worker`` adopts them through its normal lease loop
   (``SIGNOFF_ADOPT_BATCH`` runs per tick), i.e. the production recovery path:
   re-read the run and its cards, set the wait token in Redis, park a future.

Worker RSS and Redis ``used_memory`` are read before the clones exist and once
the worker reports every run parked and no step in flight; the growth divided by
the number of runs is the cost of one parked run (the wait, the per-thread lock,
the Redis token; the conversation stays in Postgres). Two workers adopt (their
RSS growth is summed), because one Python process alone adopts ~500 runs/s here. 10k are measured first, then
the set is grown to 100k. At the end a sample of the clones is approved through
the gateway and the store and demo provider are checked (executed once each).

Idle WebSockets. N authenticated sockets that send nothing are opened to one
gateway (uvicorn + websockets sans-I/O, per-message compression off as signoff serves it);
the gateway's RSS growth divided by N is the cost of one idle socket.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import httpx
import redis.asyncio as aioredis

from bench.common import (
    TMP,
    Cluster,
    Socket,
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
from bench.users import Users

DEAD = "bench-dead-worker"

CLONE = """
WITH t AS (
  SELECT c.id AS card_id, c.thread_id, c.run_id FROM cards c WHERE c.id = $1
), g AS (
  SELECT i,
         md5($3 || ':t:' || i)::uuid AS tid,
         md5($3 || ':r:' || i)::uuid AS rid,
         md5($3 || ':c:' || i)::uuid AS cid,
         md5($3 || ':o:' || i)::uuid AS oid
  FROM generate_series($2::int, $4::int) i
), th AS (
  INSERT INTO threads (id, tenant, owner, last_seq)
  SELECT g.tid, x.tenant, x.owner, x.last_seq FROM g, threads x, t WHERE x.id = t.thread_id
), ms AS (
  INSERT INTO messages (thread_id, seq, run_id, kind, body)
  SELECT g.tid, m.seq, CASE WHEN m.run_id IS NULL THEN NULL ELSE g.rid END, m.kind, m.body
  FROM g, messages m, t WHERE m.thread_id = t.thread_id
), ru AS (
  INSERT INTO runs (id, thread_id, tenant, owner, role, status, worker_id, state)
  SELECT g.rid, g.tid, r.tenant, r.owner, r.role, 'waiting', $5,
         jsonb_build_object('order', r.state -> 'order', 'results', '{}'::jsonb,
                            'waiting', jsonb_build_object(c.tool_use_id, g.cid::text))
  FROM g, runs r, cards c, t WHERE r.id = t.run_id AND c.id = t.card_id
), ca AS (
  INSERT INTO cards (id, thread_id, run_id, tenant, owner, tool, tool_use_id, risk, input,
                     args_snapshot, summary, impact, snapshot_hash, request_key, operation_id,
                     editable, status, expires_at)
  SELECT g.cid, g.tid, g.rid, c.tenant, c.owner, c.tool, c.tool_use_id, c.risk, c.input,
         c.args_snapshot, c.summary, c.impact, c.snapshot_hash, c.request_key || ':' || g.i,
         g.oid, c.editable, 'pending', now() + interval '2 hours'
  FROM g, cards c, t WHERE c.id = t.card_id
)
INSERT INTO card_events (card_id, from_status, to_status, actor, hash_seen)
SELECT g.cid, NULL, 'pending', 'system', c.snapshot_hash FROM g, cards c, t WHERE c.id = t.card_id
"""


async def clone(database_url: str, template: str, start: int, end: int, salt: str) -> float:
    """Clone the template's thread/run/card for i in start..end; returns seconds taken."""
    t = time.monotonic()
    conn = await asyncpg.connect(database_url)
    try:
        step = 5000
        for lo in range(start, end + 1, step):
            hi = min(lo + step - 1, end)
            await conn.execute(
                "INSERT INTO workers (id, lease_until) VALUES ($1, now() - interval '1 second') "
                "ON CONFLICT (id) DO UPDATE SET lease_until = EXCLUDED.lease_until",
                DEAD,
            )
            await conn.execute(CLONE, template, lo, salt, hi, DEAD, timeout=600)
    finally:
        await conn.close()
    return time.monotonic() - t


async def redis_used(redis_url: str) -> int:
    r = aioredis.from_url(redis_url)
    try:
        return int((await r.info("memory"))["used_memory"])
    finally:
        await r.aclose()


async def wait_parked(c: Cluster, n: int, timeout: float, bar: Any) -> tuple[float, int]:
    """Seconds until n runs are parked and nothing is in flight, and how many are parked.

    Past ``timeout`` the count so far is returned (the memory is then divided by it)."""
    t = time.monotonic()
    last = 0
    while time.monotonic() - t < timeout:
        parked = int(await asyncio.to_thread(c.worker_gauge, "signoff_parked_runs"))
        bar.update(max(parked - last, 0))
        last = max(last, parked)
        if parked >= n and await asyncio.to_thread(c.worker_tasks) == 0:
            return time.monotonic() - t, parked
        await asyncio.sleep(0.5)
    log(f"parked: only {last} of {n} runs parked after {timeout}s; measuring those")
    return time.monotonic() - t, last


async def settle_rss(proc: Any, seconds: float = 2.0) -> int:
    """RSS once it stopped moving (freed memory is not always returned at once)."""
    await asyncio.sleep(seconds)
    return int(proc.rss())


async def workers_rss(c: Cluster) -> int:
    await asyncio.sleep(2.0)
    return sum(int(w.rss()) for w in c.workers)


async def poll_cost(database_url: str, repeats: int = 5) -> dict[str, Any]:
    """What one worker's slow poll costs at this park, timed from the client (statement
    round trips on one connection, the worker's own statements): before 2026-12-03 each
    tick sent every parked card id in one statement (``cards_decided_among``); now a tick
    reads the approved cards its runs hold (``cards_approved_held``) and every
    ``POLL_FULL_EVERY``-th tick re-reads the park in chunks of ``RECHECK_CHUNK`` ids."""
    from signoff.runtime.poller import POLL_FULL_EVERY, RECHECK_CHUNK
    from signoff.store.queries import SQL

    conn = await asyncpg.connect(database_url)
    try:
        holder, ids = None, []
        for row in await conn.fetch(
            "SELECT r.worker_id, array_agg(c.id::text) AS ids FROM runs r "
            "JOIN cards c ON c.run_id = r.id AND c.status = 'pending' "
            "WHERE r.status = 'waiting' GROUP BY r.worker_id ORDER BY count(*) DESC LIMIT 1"
        ):
            holder, ids = row["worker_id"], list(row["ids"])

        async def timed(call: Any) -> float:
            best: list[float] = []
            for _ in range(repeats):
                t = time.perf_counter()
                await call()
                best.append((time.perf_counter() - t) * 1000)
            return round(sorted(best)[len(best) // 2], 3)

        whole = await timed(lambda: conn.fetch(SQL.cards_decided_among, ids))

        async def chunked() -> None:
            for lo in range(0, len(ids), RECHECK_CHUNK):
                await conn.fetch(SQL.cards_decided_among, ids[lo : lo + RECHECK_CHUNK])

        full = await timed(chunked)
        tick = await timed(lambda: conn.fetch(SQL.cards_approved_held, holder, 1000, None))
    finally:
        await conn.close()
    every = POLL_FULL_EVERY
    return {
        "parked_cards_of_one_worker": len(ids),
        "before_ms_per_tick": whole,
        "after_approved_tick_ms": tick,
        "after_full_reread_ms": full,
        "after_ms_per_tick_amortized": round(((every - 1) * tick + full) / every, 3),
    }


async def parked_runs(c: Cluster, svc: Any, sizes: list[int], args: Any) -> dict[str, Any]:
    (gw,) = c.gateways
    users = Users(c, 1, prefix="pk")
    await users.open()
    template = (await users.park(1))[0]
    await users.close()
    await wait_parked(c, 1, 30, progress(1, "template", True))
    deadline = time.monotonic() + args.adopt_timeout
    base_rss = await workers_rss(c)
    base_redis = await redis_used(svc.redis_url)
    out: dict[str, Any] = {"baseline_worker_rss": base_rss, "baseline_redis_used": base_redis}
    done = cloned = 0
    for n in sizes:
        bar = progress(n - done, f"clone+adopt {n}", args.no_progress, "run")
        seeded = await clone(svc.database_url, template.id, cloned + 1, n, svc.dbname)
        cloned = n
        adopted, count = await wait_parked(c, n + 1, max(deadline - time.monotonic(), 1), bar)
        count -= 1  # the template run
        bar.close()
        rss = await workers_rss(c)
        used = await redis_used(svc.redis_url)
        tokens = await _count_tokens(svc.redis_url, c.prefix)
        out[str(n)] = {
            "runs": n,
            "parked": count,
            "clone_seconds": round(seeded, 1),
            "adopt_seconds": round(adopted, 1),
            "adopted_per_s": round((count - done) / adopted, 1) if adopted else None,
            "worker_rss": rss,
            "redis_used_memory": used,
            "wait_tokens": tokens,
            "worker_bytes_per_run": round((rss - base_rss) / max(count, 1), 1),
            "redis_bytes_per_run": round((used - base_redis) / max(count, 1), 1),
            "poll": await poll_cost(svc.database_url),
        }
        log(
            f"parked: {count} runs: worker +{(rss - base_rss) / max(count, 1):.0f} B/run, "
            f"redis +{(used - base_redis) / max(count, 1):.0f} B/run "
            f"(clone {seeded:.1f}s, adopt {adopted:.1f}s); slow poll per tick "
            f"{out[str(n)]['poll']['before_ms_per_tick']} ms before, "
            f"{out[str(n)]['poll']['after_ms_per_tick_amortized']} ms now"
        )
        done = count
    # exactly once on a sample: approve some clones through the gateway, let them run
    out["sample_approved"] = await approve_sample(c, svc, gw, template.user.name, args.sample)
    return out


async def _count_tokens(redis_url: str, prefix: str) -> int:
    r = aioredis.from_url(redis_url)
    try:
        n = 0
        async for _ in r.scan_iter(match=f"{prefix}wait:*", count=5000):
            n += 1
        return n
    finally:
        await r.aclose()


async def approve_sample(c: Cluster, svc: Any, gw: Any, owner: str, n: int) -> int:
    conn = await asyncpg.connect(svc.database_url)
    try:
        rows = await conn.fetch(
            "SELECT id::text, snapshot_hash FROM cards WHERE status = 'pending' "
            "ORDER BY random() LIMIT $1",
            n,
        )
        headers = {"Authorization": f"Bearer {c.token(owner)}"}
        async with httpx.AsyncClient(base_url=gw.url, trust_env=False, timeout=60) as http:

            async def one(row: Any) -> int:
                r = await http.post(
                    f"/v1/cards/{row['id']}/resolve",
                    json={"decision": "approve", "snapshot_hash": row["snapshot_hash"]},
                    headers=headers,
                )
                return r.status_code

            codes = await gather_limited([one(r) for r in rows], 8)
        if any(code != 200 for code in codes):
            raise RuntimeError(f"sample approvals answered {sorted(set(codes))}")
        ids = [r["id"] for r in rows]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            left = await conn.fetchval(
                "SELECT count(*) FROM cards WHERE id = ANY($1::uuid[]) "
                "AND status NOT IN ('executed', 'failed')",
                ids,
            )
            if left == 0:
                break
            await asyncio.sleep(0.25)
        return len(rows)
    finally:
        await conn.close()


def wait_registry_bytes(n: int = 20_000) -> float:
    """The wait itself, in this process: one run parked on one card in a real WaitRegistry
    (future, callbacks, dict entries, deadline timer, the two id strings), by tracemalloc."""
    import tracemalloc
    import uuid

    from signoff.runtime.waits import WaitRegistry

    async def go() -> float:
        reg = WaitRegistry(on_ready=lambda run_id: None)
        loop = asyncio.get_running_loop()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(n):
            reg.park(str(uuid.uuid4()), [str(uuid.uuid4())], loop.time() + 3600)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        reg.drop_all()
        return (after - before) / n

    return asyncio.run(go())


async def idle_sockets(c: Cluster, sizes: list[int], args: Any) -> dict[str, Any]:
    (gw,) = c.gateways
    token = c.token("ws-idle")
    sockets: list[Socket] = []
    gc.collect()
    base = await settle_rss(gw, 1.0)
    out: dict[str, Any] = {"baseline_gateway_rss": base}
    for n in sizes:
        bar = progress(n - len(sockets), f"open {n} sockets", args.no_progress, "socket")

        async def one(bar: Any = bar) -> Socket:
            s = Socket(gw.ws_url, token, lambda f, t: None)
            await s.open()
            bar.update(1)
            return s

        sockets += await gather_limited([one() for _ in range(n - len(sockets))], 64)
        bar.close()
        rss = await settle_rss(gw)
        out[str(n)] = {
            "sockets": n,
            "gateway_rss": rss,
            "bytes_per_socket": round((rss - base) / n, 1),
        }
        log(f"parked: {n} idle sockets: gateway +{(rss - base) / n:.0f} B/socket")
    await gather_limited([s.close() for s in sockets], 256)
    return out


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 100_000]
    )
    p.add_argument("--sockets", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 5000])
    p.add_argument("--adopt-batch", type=int, default=2000, help="SIGNOFF_ADOPT_BATCH")
    p.add_argument("--poll", type=float, default=60.0, help="SIGNOFF_POLL_SECONDS")
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="adopting workers (their RSS growth is summed; two adopt faster on two cores)",
    )
    p.add_argument("--adopt-timeout", type=float, default=210, help="for all adoptions together")
    p.add_argument("--sample", type=int, default=50, help="clones approved at the end")
    p.add_argument("--repeat", type=int, default=1, help="repeat the whole measurement")
    args = p.parse_args(argv)
    nofile = raise_nofile(65536)
    busy = machine_busy()
    t0 = time.monotonic()
    reps: list[dict[str, Any]] = []
    checks = []
    for rep in range(args.repeat):
        with services(args, "parked") as svc:
            versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
            env = {
                "SIGNOFF_ADOPT_BATCH": str(args.adopt_batch),
                "SIGNOFF_WS_FRAMES_PER_SECOND": "0",
                # The slow poll re-reads every parked card (100k ids every 5 s by default);
                # it is not what this measures, and it would slow the adoption down.
                "SIGNOFF_POLL_SECONDS": str(args.poll),
            }
            with cluster(svc, TMP / f"parked{rep}", gateways=1, workers=args.workers, **env) as c:
                runs = asyncio.run(parked_runs(c, svc, args.runs, args))
                socks = asyncio.run(idle_sockets(c, args.sockets, args))
                # A graceful stop would delete 100k wait tokens one by one: not measured here.
                for w in c.workers:
                    w.signal(signal.SIGKILL)
            check = asyncio.run(exactly_once(svc.database_url))
            checks.append(check)
        reps.append({"parked_runs": runs, "idle_sockets": socks})

    summary: dict[str, Any] = {}
    for n in args.runs:
        summary[f"parked_worker_bytes_{n}"] = spread(
            [r["parked_runs"][str(n)]["worker_bytes_per_run"] for r in reps], "B", 0
        )
        summary[f"parked_redis_bytes_{n}"] = spread(
            [r["parked_runs"][str(n)]["redis_bytes_per_run"] for r in reps], "B", 0
        )
    for n in args.sockets:
        summary[f"ws_idle_bytes_{n}"] = spread(
            [r["idle_sockets"][str(n)]["bytes_per_socket"] for r in reps], "B", 0
        )
    big, most = max(args.runs), max(args.sockets)
    summary["parked_runs_measured"] = spread(
        [r["parked_runs"][str(big)]["parked"] for r in reps], "runs", 0
    )
    summary["parked_worker_bytes"] = summary[f"parked_worker_bytes_{big}"]
    summary["parked_redis_bytes"] = summary[f"parked_redis_bytes_{big}"]
    summary["ws_idle_bytes"] = summary[f"ws_idle_bytes_{most}"]
    # One worker's slow poll at the largest park: Postgres round trips per tick.
    summary["slow_poll_ms_per_tick"] = spread(
        [r["parked_runs"][str(big)]["poll"]["after_ms_per_tick_amortized"] for r in reps], "ms", 3
    )
    summary["slow_poll_ms_per_tick_before"] = spread(
        [r["parked_runs"][str(big)]["poll"]["before_ms_per_tick"] for r in reps], "ms", 3
    )

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(10, 4))
    first = reps[0]
    xs = [str(n) for n in args.runs]
    axes[0].bar(
        [x + "\nworker" for x in xs],
        [first["parked_runs"][x]["worker_bytes_per_run"] for x in xs],
        color="tab:blue",
    )
    axes[0].bar(
        [x + "\nredis" for x in xs],
        [first["parked_runs"][x]["redis_bytes_per_run"] for x in xs],
        color="tab:red",
    )
    axes[0].set_title("bytes per parked run")
    xs = [str(n) for n in args.sockets]
    axes[1].bar(xs, [first["idle_sockets"][x]["bytes_per_socket"] for x in xs], color="tab:green")
    axes[1].set_title("gateway bytes per idle WebSocket")
    axes[1].set_xlabel("sockets")
    fig.tight_layout()
    fig.savefig(out / "parked_memory.png", dpi=110)
    pyplot.close(fig)

    registry = [wait_registry_bytes() for _ in range(3)]
    summary["wait_registry_bytes"] = spread(registry, "B", 0)
    ok = all(ch["ok"] for ch in checks)
    data = {
        "config": {
            "runs": args.runs,
            "sockets": args.sockets,
            "adopt_batch": args.adopt_batch,
            "sample_approved": args.sample,
            "repeat": args.repeat,
            "nofile_limit": nofile,
            "method": "one run parked through the model path, cloned in Postgres, adopted by "
            "the worker's lease loop (see the script's docstring)",
        },
        "machine": {**machine(), **versions, **busy},
        "summary": summary,
        "repeats": reps,
        "exactly_once": {**checks[-1], "ok": ok},
        "plots": ["parked_memory.png"],
        "seconds": round(time.monotonic() - t0, 1),
    }
    path = write_json(out, "parked", data)
    log(f"parked: wrote {path} in {data['seconds']}s; exactly once: {ok}")
    if not ok:
        log(f"parked: EXACTLY-ONCE CHECK FAILED: {checks}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
