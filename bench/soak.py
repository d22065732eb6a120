#!/usr/bin/env python3
"""Soak: a steady load for ``--minutes`` (default 10) with retention on; every resource
sampled, and each must be flat after warm-up.

Two gateways and two workers (offline demo model) on a private Postgres and Valkey,
all on 127.0.0.1. The load is ``--rate`` conversations per second (default 20), open
loop: each conversation is a person opening the chat (two WebSockets: chat on one
gateway, decisions on the other), asking for a write in a new thread, getting the card,
approving it and seeing it ``executed``; a person has ``--per-session`` conversations,
then closes the page (as people do; sockets do not live for the whole soak).

Retention is on and short so that it shows within the soak: threads quiet for
``--retention-seconds`` (default 60 s; ``SIGNOFF_RETENTION_DAYS`` as a fraction) are
pruned by the workers every ``--prune-interval`` seconds (default 15), the audit of
executed cards exported to JSONL first (kept under bench/results/tmp, then removed).

Sampled every ``--sample-seconds`` (default 10): RSS and open fds of every gateway and
worker, Redis keys, connected clients and used_memory, Postgres database size, its
connections and live rows of the hot tables, and click -> executed latency. Warm-up is
the first ``--warmup-fraction`` (default 0.4) of the run: it covers the retention
window, the first prunes and autovacuum's first passes. *Flat* = the mean of the last
quarter of the run within ``--tolerance`` (default 10 %, or a small absolute slack) of
the mean of the first quarter after warm-up. Writes ``results/soak.json`` and
``results/soak.png``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import redis.asyncio as aioredis

from bench.common import (
    RESULTS,
    ROOT,
    TMP,
    Cluster,
    base_parser,
    cluster,
    exactly_once,
    log,
    machine,
    machine_busy,
    percentile,
    plt,
    raise_nofile,
    rss_bytes,
    server_versions,
    services,
    write_json,
)
from bench.users import Users

README = ROOT / "bench" / "README.md"
HOT_TABLES = ("threads", "messages", "runs", "cards", "card_events")
# Absolute slack under which a change is noise, whatever the relative change.
SLACK = {
    "rss_mb": 8.0,
    "fds": 8,
    "redis_keys": 30,
    "redis_clients": 4,
    "redis_used_mb": 2.0,
    "pg_size_mb": 4.0,
    "pg_signoff_tables_mb": 4.0,
    "pg_connections": 4,
}


def archive_check(folder: Path) -> dict[str, int]:
    """The pruned cards' exported audit: how many, executed, executed twice, repeated."""
    import json

    lines = [
        json.loads(line)
        for f in sorted(folder.glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    ids = [c["id"] for c in lines]
    twice = sum(
        1
        for c in lines
        if sum(1 for e in c["events"] if e["from"] == "approved" and e["to"] == "executing") > 1
    )
    return {
        "lines": len(lines),
        "executed": sum(1 for c in lines if c["status"] == "executed"),
        "executed_twice": twice,
        "duplicate_lines": len(ids) - len(set(ids)),
    }


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Load:
    """Open-loop conversations at a fixed rate, by sessions of a few conversations."""

    def __init__(self, c: Cluster, rate: float, per_session: int) -> None:
        self.c = c
        self.rate = rate
        self.per_session = per_session
        self.done = 0
        self.failed = 0
        self.latencies_ms: list[float] = []  # click -> executed, since the last sample
        self.errors: list[str] = []
        self._sessions = 0

    async def session(self, slot: int, first_at: float, every: float, stop_at: float) -> None:
        users = Users(self.c, 1, prefix=f"s{self._sessions}-")
        self._sessions += 1
        try:
            await users.open()
            u = users.users[0]
            for i in range(self.per_session):
                at = first_at + i * every
                if at > stop_at:
                    break
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                try:
                    card = await users.ask(u, timeout=60)
                    await users.click_and_wait(card, until="result", timeout=60)
                    if card.result_ns:
                        self.latencies_ms.append((card.result_ns - card.click_ns) / 1e6)
                        self.done += 1
                    else:
                        self.failed += 1
                    u.by_card.pop(card.id, None)  # keep the generator's memory flat too
                    u.by_thread.pop(card.thread_id, None)
                except Exception as exc:
                    self.failed += 1
                    if len(self.errors) < 50:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            await users.close()

    async def run(self, seconds: float) -> None:
        """``rate`` conversations/s: ``sessions`` people at once, each one conversation
        every ``sessions / rate`` seconds; a person leaves after ``per_session``."""
        sessions = max(1, round(self.rate * 2))  # ~2 s between a person's conversations
        every = sessions / self.rate
        start = time.monotonic()
        stop_at = start + seconds
        running: set[asyncio.Task[None]] = set()

        async def slot(k: int) -> None:
            first = start + k / self.rate
            while first < stop_at:
                await self.session(k, first, every, stop_at)
                first += self.per_session * every

        for k in range(sessions):
            running.add(asyncio.create_task(slot(k)))
        await asyncio.gather(*running)


async def sample(
    c: Cluster, db: asyncpg.Connection, r: aioredis.Redis, dbname: str
) -> dict[str, Any]:
    procs = {p.name: p for p in c.gateways + c.workers}
    info = await r.info()
    rows = await db.fetchrow(
        "SELECT pg_database_size($1) AS size, "
        "(SELECT count(*) FROM pg_stat_activity WHERE datname = $1) AS conns",
        dbname,
    )
    tables = await db.fetch(
        "SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid) AS bytes, "
        "autovacuum_count FROM pg_stat_user_tables"
    )
    live = {t["relname"]: int(t["n_live_tup"]) for t in tables if t["relname"] in HOT_TABLES}
    dead = {t["relname"]: int(t["n_dead_tup"]) for t in tables if t["relname"] in HOT_TABLES}
    vacuums = sum(int(t["autovacuum_count"]) for t in tables)
    # signoff's own tables (the demo provider's demo_* rows are the app's business data,
    # which signoff's retention does not touch: they grow with every charge).
    signoff_bytes = sum(int(t["bytes"]) for t in tables if not t["relname"].startswith("demo_"))
    app_bytes = sum(int(t["bytes"]) for t in tables if t["relname"].startswith("demo_"))
    assert rows is not None
    return {
        "rss_mb": {n: round(rss_bytes(p.pid) / 2**20, 1) for n, p in procs.items()},
        "fds": {n: fds(p.pid) for n, p in procs.items()},
        "redis_keys": int(await r.dbsize()),
        "redis_clients": int(info["connected_clients"]),
        "redis_used_mb": round(int(info["used_memory"]) / 2**20, 2),
        "pg_size_mb": round(int(rows["size"]) / 2**20, 1),
        "pg_signoff_tables_mb": round(signoff_bytes / 2**20, 2),
        "pg_app_tables_mb": round(app_bytes / 2**20, 2),
        "pg_connections": int(rows["conns"]),
        "live_rows": live,
        "dead_rows": dead,
        "autovacuums": vacuums,
    }


def series(samples: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Every sampled resource as one named series (per process for RSS and fds)."""
    out: dict[str, list[float]] = {}
    for s in samples:
        for key in (
            "redis_keys",
            "redis_clients",
            "redis_used_mb",
            "pg_size_mb",
            "pg_signoff_tables_mb",
            "pg_connections",
        ):
            out.setdefault(key, []).append(float(s[key]))
        for key in ("rss_mb", "fds"):
            for name, value in s[key].items():
                out.setdefault(f"{key}:{name}", []).append(float(value))
    return out


def flatness(
    t: list[float], values: list[float], warmup_s: float, tolerance: float, slack: float
) -> dict[str, Any]:
    """Growth after warm-up: the last quarter's mean against the first quarter's (after
    warm-up). Flat = it grew by at most ``tolerance`` (relative) or ``slack`` (absolute);
    shrinking is flat (retention and vacuum give space back). ``slope_per_min``: the
    least-squares slope over every sample after warm-up, for the record."""
    points = [(x, v) for x, v in zip(t, values, strict=True) if x >= warmup_s]
    if len(points) < 4:
        return {"flat": None, "why": "too few samples after warm-up"}
    after = [v for _, v in points]
    q = max(1, len(after) // 4)
    first, last = statistics.fmean(after[:q]), statistics.fmean(after[-q:])
    change = last - first
    rel = change / first if first else 0.0
    xs = [x / 60 for x, _ in points]
    slope = statistics.linear_regression(xs, after).slope if len(set(xs)) > 1 else 0.0
    return {
        "flat": change <= slack or rel <= tolerance,
        "after_warmup_first_quarter": round(first, 2),
        "last_quarter": round(last, 2),
        "change": round(change, 2),
        "change_pct": round(100 * rel, 1),
        "slope_per_min": round(slope, 3),
        "max": round(max(after), 2),
    }


def plot(
    out: Path,
    t: list[float],
    named: dict[str, list[float]],
    warmup_s: float,
    lat: list[tuple[float, float, float]],
) -> Path:
    pyplot = plt()
    out.mkdir(parents=True, exist_ok=True)
    groups = [
        ("RSS (MB)", "rss_mb:"),
        ("open fds", "fds:"),
        ("Redis keys", "redis_keys"),
        ("Redis clients", "redis_clients"),
        ("Redis used_memory (MB)", "redis_used_mb"),
        ("Postgres database size (MB)", "pg_size_mb"),
        ("Postgres, signoff's tables + indexes (MB)", "pg_signoff_tables_mb"),
        ("Postgres connections", "pg_connections"),
    ]
    fig, axes = pyplot.subplots(3, 3, figsize=(15, 10), sharex=True)
    minutes = [x / 60 for x in t]
    for ax, (title, prefix) in zip(axes.flat, groups, strict=False):
        for name, values in named.items():
            if name == prefix or (name.startswith(prefix) and prefix.endswith(":")):
                ax.plot(minutes, values, label=name.split(":", 1)[-1])
        ax.set_title(title)
        ax.axvspan(0, warmup_s / 60, color="0.9", label="warm-up")
        ax.set_ylim(bottom=0)
        if prefix.endswith(":"):
            ax.legend(fontsize=7)
    ax = axes.flat[-1]
    if lat:
        ax.plot([x / 60 for x, _, _ in lat], [p50 for _, p50, _ in lat], label="p50")
        ax.plot([x / 60 for x, _, _ in lat], [p99 for _, _, p99 in lat], label="p99")
        ax.legend(fontsize=7)
    ax.set_title("click -> executed (ms), per sample window")
    ax.axvspan(0, warmup_s / 60, color="0.9")
    for ax in axes[-1]:
        ax.set_xlabel("minutes")
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=90)
    return path


async def soak(c: Cluster, svc: Any, args: Any) -> dict[str, Any]:
    db = await asyncpg.connect(svc.database_url)
    r = aioredis.Redis.from_url(svc.redis_url)
    load = Load(c, args.rate, args.per_session)
    seconds = args.minutes * 60
    samples: list[dict[str, Any]] = []
    t: list[float] = []
    lat: list[tuple[float, float, float]] = []
    try:
        start = time.monotonic()
        driver = asyncio.create_task(load.run(seconds))
        while not driver.done():
            now = time.monotonic() - start
            s = await sample(c, db, r, svc.dbname)
            s["t"] = round(now, 1)
            s["conversations_done"] = load.done
            s["failed"] = load.failed
            window, load.latencies_ms = load.latencies_ms, []
            if window:
                s["p50_ms"] = round(percentile(window, 50), 1)
                s["p99_ms"] = round(percentile(window, 99), 1)
                lat.append((now, s["p50_ms"], s["p99_ms"]))
            samples.append(s)
            t.append(now)
            log(
                f"soak {now / 60:5.1f} min: {load.done} done, {load.failed} failed, "
                f"pg {s['pg_size_mb']} MB, redis keys {s['redis_keys']}, "
                f"clients {s['redis_clients']}, rss {s['rss_mb']}"
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(driver), args.sample_seconds)
        await driver
        elapsed = time.monotonic() - start
    finally:
        await r.aclose()
        await db.close()
    warmup_s = seconds * args.warmup_fraction
    named = series(samples)
    flat = {
        name: flatness(t, values, warmup_s, args.tolerance, SLACK[name.split(":")[0]])
        for name, values in named.items()
    }
    png = plot(args.out, t, named, warmup_s, lat)
    return {
        "elapsed_s": round(elapsed, 1),
        "conversations_done": load.done,
        "conversations_failed": load.failed,
        "conversations_per_s": round(load.done / elapsed, 2),
        "errors": load.errors,
        "warmup_s": warmup_s,
        "flat": flat,
        "all_flat": all(f["flat"] is not False for f in flat.values()),
        "samples": samples,
        "plot": png.name,
    }


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    p.add_argument("--rate", type=float, default=20.0, help="conversations per second")
    p.add_argument("--per-session", type=int, default=10, help="conversations per person")
    p.add_argument("--retention-seconds", type=float, default=60.0)
    p.add_argument("--prune-interval", type=float, default=15.0)
    p.add_argument("--sample-seconds", type=float, default=10.0)
    p.add_argument("--warmup-fraction", type=float, default=0.4)
    p.add_argument("--tolerance", type=float, default=0.10, help="relative change called flat")
    p.add_argument("--pool-size", type=int, default=5, help="SIGNOFF_POOL_SIZE per process")
    p.add_argument(
        "--redis-max-connections", type=int, default=8, help="SIGNOFF_REDIS_MAX_CONNECTIONS"
    )
    args = p.parse_args(argv)
    raise_nofile()
    busy = machine_busy()
    with services(args, "soak") as svc:
        versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
        workdir = TMP / f"soak-{os.getpid()}"
        env = {
            "SIGNOFF_WS_FRAMES_PER_SECOND": "0",
            # Small pool caps, reached during warm-up: what keeps connections flat is the
            # bound (a pool grows on a burst and keeps its connections; it never passes it).
            "SIGNOFF_POOL_SIZE": str(args.pool_size),
            "SIGNOFF_REDIS_MAX_CONNECTIONS": str(args.redis_max_connections),
            "SIGNOFF_RETENTION_DAYS": repr(args.retention_seconds / 86400),
            "SIGNOFF_RETENTION_INTERVAL_SECONDS": str(args.prune_interval),
            "SIGNOFF_RETENTION_ARCHIVE_DIR": str(workdir / "audit"),
        }
        with cluster(svc, workdir, gateways=2, workers=2, **env) as c:
            res = asyncio.run(soak(c, svc, args))
        check = asyncio.run(exactly_once(svc.database_url))
        archived = archive_check(workdir / "audit")
        shutil.rmtree(workdir / "audit", ignore_errors=True)
    # Retention deleted the pruned cards (their audit is in the archive) but not the demo
    # provider's charges: exactly once = live executed cards + archived executed cards
    # == charges, no card executed twice, none lost.
    check["archive"] = archived
    check["ok"] = (
        check["provider_charges"] == check["executed"] + archived["executed"]
        and check["double_executions"] == 0
        and archived["executed_twice"] == 0
        and archived["duplicate_lines"] == 0
        and check["lost"] == 0
        and check["charged_but_executing"] == 0
    )
    res["exactly_once"] = check
    # What the pools may reach: 4 processes, each with its signoff pool, the demo app's
    # pool (5) and the sampler; Redis: each process's bounded pool + pub/sub + pipe.
    res["bounds"] = {
        "pg_connections": 4 * (args.pool_size + 5) + 2 + 2,
        "redis_clients": 4 * (args.redis_max_connections + 2) + 1,
    }
    seen = {k: max(s[k] for s in res["samples"]) for k in res["bounds"]}
    res["bounds_held"] = {k: seen[k] <= cap for k, cap in res["bounds"].items()}
    data = {
        "config": {
            k: getattr(args, k)
            for k in (
                "minutes",
                "rate",
                "per_session",
                "retention_seconds",
                "prune_interval",
                "sample_seconds",
                "warmup_fraction",
                "tolerance",
                "pool_size",
                "redis_max_connections",
            )
        },
        "machine": machine(),
        "servers": versions,
        **busy,
        **res,
    }
    path = write_json(args.out, "soak", data)
    if args.out.resolve() == RESULTS.resolve():
        import json

        from bench.soak_report import readme_table, update_readme

        update_readme(README, readme_table(json.loads(path.read_text())))
    not_flat = [n for n, f in res["flat"].items() if f["flat"] is False]
    log(
        f"soak: {res['conversations_done']} conversations ({res['conversations_per_s']}/s), "
        f"{res['conversations_failed']} failed; not flat: {not_flat or 'none'}; "
        f"exactly once: {check.get('ok')}; {path}"
    )
    return 0 if res["all_flat"] and check.get("ok") and not res["conversations_failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
