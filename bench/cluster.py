#!/usr/bin/env python3
"""Decisions/s and Redis CPU per decision: one Redis node vs. a 3-master Redis Cluster.

In one run, on the same private Postgres: 2 gateways + 2 workers (offline demo model)
on a single Redis server (embedded Valkey, as every other bench), then on a local
3-master + 3-replica Redis Cluster of the machine's ``redis-server``
(``tests/rediscluster.py``). Each phase parks N runs over real WebSockets, then
approves them in a closed loop (C users, each waiting for its card's ``executed``
event before the next click). Figures per phase: decisions/s, Redis CPU (all Redis
processes: one server, or six cluster nodes) per decision, commands per decision
by kind and how the signals spread over the masters. Exits 1 if a card was not
executed exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    TMP,
    Cluster,
    base_parser,
    cluster,
    cpu_seconds,
    exactly_once,
    log,
    machine,
    machine_busy,
    raise_nofile,
    services,
    write_json,
)
from bench.users import Users
from tests.rediscluster import LocalCluster, local_cluster


def parser() -> Any:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--decisions", type=int, default=600, help="decisions per phase")
    p.add_argument("--concurrency", type=int, default=64, help="closed-loop users")
    p.add_argument("--quick", action="store_true", help="a small smoke run (150 decisions)")
    return p


def commandstats(urls: list[str]) -> dict[str, int]:
    """Calls per command, summed over the servers."""
    out: dict[str, int] = {}
    for url in urls:
        client = redis.Redis.from_url(url)
        try:
            stats: dict[str, Any] = client.info("commandstats")
        finally:
            client.close()
        for name, fields in stats.items():
            key = name.removeprefix("cmdstat_")
            out[key] = out.get(key, 0) + int(fields["calls"])
    return out


async def phase(c: Cluster, args: Any, pids: list[int], ports: list[str]) -> dict[str, Any]:
    users = Users(c, args.concurrency, prefix="cu")
    await users.open()
    try:
        cards = await users.park(args.decisions, limit=48)
        by_user: dict[str, list[Any]] = {}
        for card in cards:
            by_user.setdefault(card.user.name, []).append(card)
        users.expect(len(cards))
        cpu0 = sum(cpu_seconds(p) for p in pids)
        cmd0 = commandstats(ports)
        per_master0 = {p: commandstats([p]).get("spublish", 0) for p in ports}

        async def clicker(mine: list[Any]) -> None:
            for card in mine:
                await users.click_and_wait(card, "result")

        t0 = time.perf_counter()
        await asyncio.gather(*(clicker(m) for m in by_user.values()))
        wall = time.perf_counter() - t0
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        cmd1 = commandstats(ports)
        n = len(cards)
        spread = {str(p): commandstats([p]).get("spublish", 0) - per_master0[p] for p in ports}
        return {
            "decisions": n,
            "concurrency": args.concurrency,
            "seconds": round(wall, 3),
            "decisions_per_s": round(n / wall, 1),
            "redis_cpu_ms_per_decision": round(cpu / n * 1000, 3),
            "redis_commands_per_decision": {
                k: round((v - cmd0.get(k, 0)) / n, 2)
                for k, v in sorted(cmd1.items(), key=lambda kv: -(kv[1] - cmd0.get(kv[0], 0)))
                if v - cmd0.get(k, 0) > 0 and k not in ("info", "cluster|nodes", "cluster")
            },
            "spublish_per_node": {k: v for k, v in spread.items() if v},
        }
    finally:
        await users.close()


def main() -> int:
    args = parser().parse_args()
    if args.quick:
        args.decisions, args.concurrency = 150, 32
    raise_nofile()
    busy = machine_busy()
    started = time.monotonic()
    env = {"SIGNOFF_WS_FRAMES_PER_SECOND": "0", "SIGNOFF_POOL_SIZE": "10"}
    phases: dict[str, Any] = {}
    checks: dict[str, Any] = {}
    with services(args, "cluster") as svc:
        assert svc.redis_server is not None, "run without --redis-url: the bench starts its own"
        with cluster(svc, TMP / "cluster-one", gateways=2, workers=2, **env) as c:
            log("cluster bench: one Redis node")
            phases["one_node"] = asyncio.run(
                phase(c, args, [svc.redis_server.pid], [svc.redis_url])
            )
        checks["one_node"] = asyncio.run(exactly_once(svc.database_url))
        lc: LocalCluster
        with local_cluster() as lc:
            on_cluster = dataclasses.replace(svc, redis_url=lc.url, redis_server=None)
            with cluster(on_cluster, TMP / "cluster-3m", gateways=2, workers=2, **env) as c:
                log("cluster bench: 3-master Redis Cluster")
                pids = [p.pid for p in lc.processes.values()]
                masters = [f"redis://127.0.0.1:{p}" for p in lc.masters()]
                phases["cluster_3_masters"] = asyncio.run(phase(c, args, pids, masters))
            checks["cluster_3_masters"] = asyncio.run(exactly_once(svc.database_url))
    one, three = phases["one_node"], phases["cluster_3_masters"]
    data = {
        "config": {"decisions": args.decisions, "concurrency": args.concurrency, "workers": 2},
        "machine": {**machine(), **busy},
        "summary": {
            "decisions_per_s": {
                "one_node": one["decisions_per_s"],
                "cluster": three["decisions_per_s"],
            },
            "redis_cpu_ms_per_decision": {
                "one_node": one["redis_cpu_ms_per_decision"],
                "cluster": three["redis_cpu_ms_per_decision"],
            },
        },
        "phases": phases,
        "exactly_once": checks,
        "seconds": round(time.monotonic() - started, 1),
    }
    path = write_json(args.out, "cluster", data)
    ok = all(check["ok"] for check in checks.values())
    log(f"cluster: wrote {path} in {data['seconds']}s; exactly once: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
