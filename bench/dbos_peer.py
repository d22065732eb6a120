"""DBOS Transact as a peer of signoff's click -> executed, for ``compare_langgraph.py``.

The work is the same as signoff's decision path: a workflow parked in
``DBOS.recv_async`` (its process: ``bench/dbos_side.py``, LISTEN/NOTIFY on) is woken
by ``DBOSClient.send`` from ANOTHER process (this one), then runs one durable step
(``@DBOS.step``) that inserts the charge. The span, **recv + step**, is the
sender's clock just before ``send`` -> the step's insert done (the DBOS process's
clock: ``time.time_ns`` of one host, the same kernel clock). It stops before DBOS
records the step's output, which favours DBOS slightly.

* latency: ``n`` workflows woken one at a time (``rate`` 0: each sent once the
  previous one's step is done, as signoff's and LangGraph's concurrency-1 figures;
  an open loop at 50/s queued on a slower machine where DBOS did ~40 wakes/s, and its
  p50 was then queueing, not the span);
* throughput: ``n`` workflows woken by ``senders`` concurrent senders; per second =
  woken / (first send -> last step done). The senders do not wait for the steps, so
  more work is in flight than with signoff's users who each wait for their result:
  that can only favour DBOS.

DBOS runs on a database of its own on the same Postgres server.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from bench import dbos_side
from bench.common import log, summarize_ms


def _figures(rows: list[dict[str, int]], offered: int) -> dict[str, Any]:
    if not rows:
        return {"offered": offered, "woken": 0, "latency_ms": {"n": 0}, "per_s": 0.0}
    first = min(r["sent_ns"] for r in rows)
    last = max(r["done_ns"] for r in rows)
    return {
        "offered": offered,
        "woken": len(rows),
        "latency_ms": summarize_ms([r["done_ns"] - r["sent_ns"] for r in rows]),
        "recv_ms": summarize_ms([r["woke_ns"] - r["sent_ns"] for r in rows]),
        "per_s": round(len(rows) / max((last - first) / 1e9, 1e-9), 1),
    }


async def run(
    server_url: str,
    workdir: Path,
    *,
    latency_n: int,
    rate: float,
    throughput_n: int,
    senders: int,
    runs: int,
    bar: Any = None,
) -> dict[str, Any]:
    """``runs`` latency runs and ``runs`` throughput runs on one DBOS process."""
    name = f"signoff_bench_dbos_peer_{os.getpid()}"
    url = await dbos_side.create_database(server_url, name)
    out: dict[str, Any] = {"latency": [], "throughput": []}
    try:
        proc = await asyncio.to_thread(dbos_side.DbosProc, url, workdir / "dbos-peer.log")
        try:
            for r in range(runs):
                for kind, n, pace, k in (
                    ("latency", latency_n, rate, 1),
                    ("throughput", throughput_n, None, senders),
                ):
                    prefix = f"{kind}-{r}"
                    ids = [f"{prefix}-{i}" for i in range(n)]
                    await asyncio.to_thread(proc.command, {"op": "park", "n": n, "prefix": prefix})
                    sent = await dbos_side.send_all(url, ids, pace, k)
                    rows = await dbos_side.wake_rows(url, ids, 120)
                    fig = {**_figures(rows, n), **sent}
                    out[kind].append(fig)
                    if bar is not None:
                        bar.update(n)
                    log(f"dbos {kind} run {r + 1}: {fig['latency_ms']} {fig['per_s']}/s")
        finally:
            await asyncio.to_thread(proc.stop)
    finally:
        await dbos_side.drop_database(server_url, name)
    return out
