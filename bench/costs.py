"""Cost accounting of the bench: CPU seconds per role, Postgres transactions and WAL,
Redis commands, between two snapshots (split out of ``bench/common.py``)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import Cluster, cpu_seconds


def _children(ppid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{name}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == ppid:
                    out.append(int(name))
    return out


def _cpu_or_zero(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except (OSError, IndexError, ValueError):
        return 0.0


def _machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class Costs:
    """CPU seconds per role, Postgres transactions and Redis commands, between two snapshots.

    Postgres CPU is counted only for the private server (its postmaster and every
    backend); exited backends are lost, so pools keep their connections open.
    """

    def __init__(self, c: Cluster) -> None:
        self.c = c

    async def snapshot(self) -> dict[str, Any]:
        import redis.asyncio as aioredis

        svc = self.c.services
        assert svc is not None
        cpu = {
            "gateways": sum(_cpu_or_zero(p.pid) for p in self.c.gateways if p.alive()),
            "workers": sum(_cpu_or_zero(p.pid) for p in self.c.workers if p.alive()),
            "load_generator": _cpu_or_zero(os.getpid()),
        }
        if svc.pg_server is not None:
            pg = svc.pg_server.pid
            cpu["postgres"] = _cpu_or_zero(pg) + sum(_cpu_or_zero(x) for x in _children(pg))
        if svc.redis_server is not None:
            cpu["redis"] = _cpu_or_zero(svc.redis_server.pid)
        conn = await asyncpg.connect(svc.database_url)
        try:
            row = await conn.fetchrow(
                "SELECT xact_commit, xact_rollback FROM pg_stat_database "
                "WHERE datname = current_database()"
            )
            wal = await _wal_counters(conn)
        finally:
            await conn.close()
        r = aioredis.from_url(svc.redis_url)
        try:
            stats = await r.info("commandstats")
        finally:
            await r.aclose()
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        machine_busy_s = _machine_busy_seconds()
        assert row is not None  # pg_stat_database has the bench's database
        return {
            "cpu": cpu,
            "machine_busy_s": machine_busy_s,
            "pg_commits": int(row["xact_commit"]),
            "wal": wal,
            "redis": calls,
            "t": time.monotonic(),
        }

    @staticmethod
    def per(a: dict[str, Any], b: dict[str, Any], n: int) -> dict[str, Any]:
        n = max(n, 1)
        cpu = {k: round((b["cpu"][k] - a["cpu"].get(k, 0)) / n * 1000, 3) for k in b["cpu"]}
        redis = {
            k: round((v - a["redis"].get(k, 0)) / n, 2)
            for k, v in b["redis"].items()
            if v - a["redis"].get(k, 0) > 0 and k not in ("info",)
        }
        wall = b["t"] - a["t"]
        busy = sum(b["cpu"][k] - a["cpu"].get(k, 0) for k in b["cpu"])
        everyone = b["machine_busy_s"] - a["machine_busy_s"]
        return {
            "decisions": n,
            "cpu_ms_per_decision": {**cpu, "total": round(sum(cpu.values()), 3)},
            "machine_cores_busy": round(busy / wall, 2) if wall > 0 else None,
            # CPU used by processes that are not the bench's (other work on the machine)
            "other_cores_busy": round(max(everyone - busy, 0) / wall, 2) if wall > 0 else None,
            "pg_commits_per_decision": round((b["pg_commits"] - a["pg_commits"]) / n, 2),
            # server-wide (the bench's private server runs nothing else meanwhile)
            "pg_wal_fsyncs_per_decision": round(
                (b["wal"]["fsyncs"] - a["wal"].get("fsyncs", 0)) / n, 2
            ),
            "pg_wal_records_per_decision": round(
                (b["wal"]["records"] - a["wal"].get("records", 0)) / n, 1
            ),
            "pg_wal_bytes_per_decision": round((b["wal"]["bytes"] - a["wal"].get("bytes", 0)) / n),
            "redis_commands_per_decision": dict(sorted(redis.items(), key=lambda kv: -kv[1])),
        }


async def _wal_counters(conn: Any) -> dict[str, int]:
    """WAL fsyncs, records and bytes so far, server-wide (Postgres 18 moved the fsync
    count from ``pg_stat_wal`` to ``pg_stat_io``)."""
    version = int(await conn.fetchval("SELECT current_setting('server_version_num')"))
    row = await conn.fetchrow("SELECT wal_records, wal_bytes FROM pg_stat_wal")
    if version >= 180000:
        fsyncs = await conn.fetchval(
            "SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'"
        )
    else:
        fsyncs = await conn.fetchval("SELECT wal_sync FROM pg_stat_wal")
    return {"fsyncs": int(fsyncs or 0), "records": int(row[0]), "bytes": int(row[1])}
