#!/usr/bin/env python3
"""The DBOS Transact side of ``bench/workflows.py``: a workflow parked in ``DBOS.recv``.

Run as a process of its own (``python bench/dbos_side.py --database-url URL``): it
launches DBOS on its own database (LISTEN/NOTIFY on, the library's default), then
reads one JSON command a line on stdin and answers one JSON line on stdout:

* ``{"op": "park", "n": N, "prefix": P}``: starts N workflows ``P-0 .. P-(N-1)``
  (``DBOS.start_workflow_async``), each of which parks in
  ``await DBOS.recv_async("wake")``; answers once all N wait (DBOS's in-memory
  waiter map holds N entries): ``{"parked": N, "seconds": s}``.
* ``{"op": "quit"}``.

Woken, a workflow runs one durable step (``@DBOS.step``) that inserts a row
``(id, sent_ns, woke_ns, step_ns)`` into ``dbos_wakes``: ``sent_ns`` comes in the
message (the sender's clock, the same machine), ``woke_ns`` is when ``recv``
returned, ``step_ns`` when the step started. The sender is another process
(:func:`send_all`, a ``DBOSClient``), as in a deployment where the event arrives
at an API process and the workflow runs on a worker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg

from bench.common import log, rss_bytes, summarize_ms

WARM_UP = 32  # workflows woken before a phase's measured ones (the sender's pool)
TABLE = (
    "CREATE TABLE IF NOT EXISTS dbos_wakes (id text PRIMARY KEY, sent_ns bigint NOT NULL, "
    "woke_ns bigint NOT NULL, step_ns bigint NOT NULL, done_ns bigint NOT NULL)"
)


def sqlalchemy_url(url: str) -> str:
    """DBOS takes SQLAlchemy URLs; psycopg 3 is the driver it depends on."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme) :]
    return url


def psycopg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


async def serve(database_url: str, pool_size: int) -> None:
    from dbos import DBOS, DBOSConfig
    from psycopg_pool import AsyncConnectionPool

    pool: Any = AsyncConnectionPool(
        psycopg_url(database_url), min_size=2, max_size=8, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    async with pool.connection() as conn:
        await conn.execute(TABLE)

    @DBOS.step()
    async def record(wid: str, sent_ns: int, woke_ns: int) -> int:
        step_ns = time.time_ns()
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO dbos_wakes (id, sent_ns, woke_ns, step_ns, done_ns) "
                "VALUES (%s, %s, %s, %s, %s)",
                (wid, sent_ns, woke_ns, step_ns, time.time_ns()),
            )
        return step_ns

    @DBOS.workflow()
    async def parked(wid: str) -> None:
        msg = await DBOS.recv_async("wake", timeout_seconds=24 * 3600)
        woke = time.time_ns()
        await record(wid, int(msg["sent_ns"]), woke)

    config: DBOSConfig = {
        "name": "signoff-bench-dbos",
        "system_database_url": sqlalchemy_url(database_url),
        "sys_db_pool_size": pool_size,
        "log_level": "WARNING",
    }
    dbos = DBOS(config=config)
    DBOS.launch()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: list[Any] = []

    def waiting() -> int:
        return len(dbos._sys_db.notifications_map.snapshot())

    def answer(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    answer({"ready": True})
    try:
        while line := await reader.readline():
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "park":
                t = time.monotonic()
                before = waiting()
                sem = asyncio.Semaphore(64)

                async def start(wid: str, sem: asyncio.Semaphore = sem) -> Any:
                    async with sem:
                        from dbos import SetWorkflowID

                        with SetWorkflowID(wid):
                            return await DBOS.start_workflow_async(parked, wid)

                handles = await asyncio.gather(
                    *(start(f"{cmd['prefix']}-{i}") for i in range(cmd["n"]))
                )
                tasks.extend(handles)
                while waiting() < before + cmd["n"]:
                    await asyncio.sleep(0.1)
                answer({"parked": cmd["n"], "seconds": round(time.monotonic() - t, 2)})
    finally:
        DBOS.destroy(destroy_registry=True)
        await pool.close()


async def send_all(
    database_url: str,
    ids: list[str],
    rate: float | None,
    senders: int,
    warm: list[str] | None = None,
) -> dict[str, Any]:
    """Send one message to each workflow from this process (a ``DBOSClient``).

    ``rate``: open loop at that many messages/s (a send that falls behind goes at
    once); ``None``: as fast as ``senders`` concurrent senders go (saturation); ``0``:
    one at a time, each sent once the previous one's step is done (what LangGraph's
    and signoff's concurrency-1 figures are: no queueing on a slow machine).
    ``warm``: workflows woken first, not measured (the client's pool and threads).
    Returns the wall time of the sends."""
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=sqlalchemy_url(database_url))
    try:
        loop = asyncio.get_running_loop()
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=senders)
        errors = 0

        def send(wid: str) -> None:
            nonlocal errors
            try:
                client.send(wid, {"sent_ns": time.time_ns()}, topic="wake")
            except Exception:
                errors += 1

        if warm:
            await asyncio.gather(*(loop.run_in_executor(pool, send, w) for w in warm))
            await wake_rows(database_url, warm, 60)
        t0 = time.monotonic()
        if rate == 0:
            await _one_at_a_time(
                database_url, ids, lambda wid: loop.run_in_executor(pool, send, wid)
            )
            pool.shutdown()
            return {"send_seconds": round(time.monotonic() - t0, 3), "send_errors": errors}
        futs = []
        for i, wid in enumerate(ids):
            if rate is not None:
                due = t0 + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            futs.append(loop.run_in_executor(pool, send, wid))
        await asyncio.gather(*futs)
        pool.shutdown()
        return {"send_seconds": round(time.monotonic() - t0, 3), "send_errors": errors}
    finally:
        client.destroy()


async def _one_at_a_time(
    database_url: str, ids: list[str], send: Callable[[str], Awaitable[None]]
) -> None:
    """Send to each workflow once the previous one's step has written its row."""
    conn = await asyncpg.connect(database_url)
    try:
        for wid in ids:
            await send(wid)
            deadline = time.monotonic() + 30
            while not await conn.fetchval("SELECT 1 FROM dbos_wakes WHERE id = $1", wid):
                if time.monotonic() > deadline:
                    return  # the rows found tell how many were woken
                await asyncio.sleep(0.002)
    finally:
        await conn.close()


class DbosProc:
    """The DBOS process, driven over its stdin/stdout (it exits when its stdin closes)."""

    def __init__(self, database_url: str, log_path: Path) -> None:
        self.log = log_path.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--database-url", database_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        ready = self._read(120)
        if not ready.get("ready"):
            raise RuntimeError(f"DBOS side did not start: {ready}")

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.popen.stdout is not None
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        line = self.popen.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"DBOS side gave no answer in {timeout}s (see {self.log.name})")
        out: dict[str, Any] = json.loads(line)
        return out

    def command(self, cmd: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(cmd) + "\n")
        self.popen.stdin.flush()
        return self._read(timeout)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            assert self.popen.stdin is not None
            self.popen.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.popen.stdin.close()
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
        self.log.close()


async def create_database(server_url: str, name: str) -> str:
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def drop_database(server_url: str, name: str) -> None:
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def wake_rows(database_url: str, ids: list[str], timeout: float) -> list[dict[str, int]]:
    """The rows the woken workflows wrote, once all ``ids`` have one (or ``timeout``)."""
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            rows = await conn.fetch("SELECT * FROM dbos_wakes WHERE id = ANY($1::text[])", ids)
            if len(rows) >= len(ids) or time.monotonic() > deadline:
                return [dict(r) for r in rows]
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


def phase_figures(rows: list[dict[str, int]], offered: int) -> dict[str, Any]:
    """Latency (sent -> the step started) and wakes/s (first send -> last step done)."""
    if not rows:
        return {"woken": 0, "offered": offered}
    first = min(r["sent_ns"] for r in rows)
    last = max(r["done_ns"] for r in rows)
    return {
        "offered": offered,
        "woken": len(rows),
        "wake_ms": summarize_ms([r["step_ns"] - r["sent_ns"] for r in rows]),
        "recv_ms": summarize_ms([r["woke_ns"] - r["sent_ns"] for r in rows]),
        "wakes_per_s": round(len(rows) / max((last - first) / 1e9, 1e-9), 1),
    }


def phases(args: Any) -> list[tuple[int, str, int, float | None]]:
    """(repeat, phase, wakes, rate): latency at ``args.rate``/s, then saturation, repeated."""
    out: list[tuple[int, str, int, float | None]] = []
    for rep in range(args.repeat):
        out += [
            (rep, "open", args.latency_wakes, args.rate),
            (rep, "saturation", args.saturation_wakes, None),
        ]
    return out


async def run_phases(args: Any, server_url: str, workdir: Path) -> dict[str, Any]:
    """Latency at ``args.rate``/s, then saturation, on one DBOS process; then the memory
    of ``args.dbos_parked`` parked workflows on a fresh one."""
    name = f"signoff_bench_dbos_{os.getpid()}"
    url = await create_database(server_url, name)
    out: dict[str, Any] = {}
    try:
        proc = await asyncio.to_thread(DbosProc, url, workdir / "dbos.log")
        try:
            for rep, phase, n, rate in phases(args):
                prefix = f"{phase}{rep}"
                ids = [f"{prefix}-{i}" for i in range(n + WARM_UP)]
                parked = await asyncio.to_thread(
                    proc.command, {"op": "park", "n": n + WARM_UP, "prefix": prefix}
                )
                warm, ids = ids[:WARM_UP], ids[WARM_UP:]
                sent = await send_all(url, ids, rate, args.senders, warm)
                rows = await wake_rows(url, ids, args.drain_timeout)
                figs = {**phase_figures(rows, n), **sent, "park_seconds": parked["seconds"]}
                out.setdefault(phase, []).append(figs)
                log(f"dbos {phase}: {figs.get('wake_ms')} {figs.get('wakes_per_s')}/s")
        finally:
            await asyncio.to_thread(proc.stop)
        out["memory"] = {}
        for n in args.dbos_parked:
            proc = await asyncio.to_thread(DbosProc, url, workdir / "dbos-memory.log")
            try:
                await asyncio.sleep(2)
                base = rss_bytes(proc.pid)
                parked = await asyncio.to_thread(
                    proc.command, {"op": "park", "n": n, "prefix": f"m{n}"}
                )
                await asyncio.sleep(2)
                rss = rss_bytes(proc.pid)
                out["memory"][str(n)] = {
                    "parked": n,
                    "baseline_rss": base,
                    "rss": rss,
                    "bytes_per_workflow": round((rss - base) / n, 1),
                    "park_seconds": parked["seconds"],
                }
                log(f"dbos memory: {n} parked: {(rss - base) / n:.0f} B/workflow")
            finally:
                await asyncio.to_thread(proc.stop)
    finally:
        await drop_database(server_url, name)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", required=True)
    p.add_argument("--pool-size", type=int, default=20)
    args = p.parse_args()
    asyncio.run(serve(args.database_url, args.pool_size))


if __name__ == "__main__":
    main()
