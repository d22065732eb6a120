#!/usr/bin/env python3
"""Waking a parked workflow: signoff's event gate beside DBOS Transact's ``recv``, one run.

Both sides park workflows on a wait, then a sender in ANOTHER process wakes each one
and the woken workflow runs one durable step that records the time and a row:

* DBOS Transact (``bench/dbos_side.py``): a workflow parked in
  ``DBOS.recv_async("wake")`` (LISTEN/NOTIFY on, its default), woken by
  ``DBOSClient.send`` from this process; then a ``@DBOS.step`` inserts a row.
  DBOS runs on its own database on the same Postgres server.
* signoff (``bench/workflow_app.py``): a workflow parked at
  ``await_event("wake")`` on a real ``signoff worker``, woken by
  ``POST /v1/workflow-runs/{id}/events`` on a real ``signoff gateway``; then a plain
  step inserts a row (``sent_ns``, ``step_ns``) through the app's own pool.

Latency is "sent" (the sender's clock just before the send / the HTTP request) ->
"the next step started" (the worker's clock; one machine). Two loads each: open
loop at ``--rate``/s, and saturation (every parked workflow woken as fast as
``--senders`` concurrent senders go; wakes/s = woken / (first send -> last row)).
Memory: RSS growth of the process holding the parked workflows, divided by their
number (DBOS: its one process; signoff: the worker), at the sizes asked.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import dbos_side, workflow_side
from bench.common import (
    TMP,
    base_parser,
    log,
    machine,
    machine_busy,
    raise_nofile,
    server_versions,
    services,
    spread,
    write_json,
)


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def figure(value: Any, unit: str, digits: int = 3) -> dict[str, Any]:
    return spread([value] if value is not None else [], unit, digits)


def summarize(dbos: dict[str, Any] | None, so: dict[str, Any] | None) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for tag, side in (("dbos", dbos), ("workflow", so)):
        if not side:
            continue
        op = side.get("open", {})
        sat = side.get("saturation", {})
        s[f"{tag}_wake_p50_ms"] = figure(op.get("wake_ms", {}).get("p50"), "ms")
        s[f"{tag}_wake_p99_ms"] = figure(op.get("wake_ms", {}).get("p99"), "ms")
        s[f"{tag}_wake_per_s"] = figure(sat.get("wakes_per_s"), "1/s", 1)
        s[f"{tag}_wake_p50_ms_saturation"] = figure(sat.get("wake_ms", {}).get("p50"), "ms")
        s[f"{tag}_wake_p99_ms_saturation"] = figure(sat.get("wake_ms", {}).get("p99"), "ms")
        mem = side.get("memory", {})
        if mem:
            for n, m in mem.items():
                s[f"{tag}_parked_bytes_{n}"] = figure(m["bytes_per_workflow"], "B", 0)
            big = max(mem, key=int)
            key = "workflow_parked_bytes" if tag == "workflow" else "dbos_parked_bytes"
            s[key] = {**figure(mem[big]["bytes_per_workflow"], "B", 0), "at": int(big)}
    if dbos and so:
        d, w = s.get("dbos_wake_p50_ms", {}), s.get("workflow_wake_p50_ms", {})
        if d.get("value") and w.get("value"):
            s["ratio_workflow_wake_p50"] = figure(d["value"] / w["value"], "x", 2)
        d, w = s.get("dbos_wake_per_s", {}), s.get("workflow_wake_per_s", {})
        if d.get("value") and w.get("value"):
            s["ratio_workflow_wake_per_s"] = figure(w["value"] / d["value"], "x", 2)
    return s


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=100.0, help="open loop wakes/s offered")
    p.add_argument("--latency-wakes", type=int, default=1000, help="wakes at --rate")
    p.add_argument("--saturation-wakes", type=int, default=2000, help="wakes at saturation")
    p.add_argument("--senders", type=int, default=16, help="concurrent senders at saturation")
    p.add_argument("--parked", type=ints, default=[10_000, 100_000], help="signoff parked sizes")
    p.add_argument(
        "--dbos-parked",
        type=ints,
        default=[10_000],
        help="DBOS parked sizes (DBOS starts ~200 workflows/s here: 100k takes ~9 minutes)",
    )
    p.add_argument("--sides", default="dbos,signoff", help="which sides to run")
    p.add_argument("--drain-timeout", type=float, default=120.0)
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.latency_wakes, args.saturation_wakes = 200, 300
        args.parked, args.dbos_parked = [1000, 3000], [1000]
    raise_nofile()
    busy = machine_busy()
    t0 = time.monotonic()
    sides = set(args.sides.split(","))
    workdir = TMP / "workflows"
    workdir.mkdir(parents=True, exist_ok=True)
    dbos: dict[str, Any] | None = None
    so: dict[str, Any] | None = None
    with services(args, "workflows") as svc:
        versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
        if "dbos" in sides:
            dbos = asyncio.run(dbos_side.run_phases(args, svc.server_url, workdir))
        if "signoff" in sides:
            so = workflow_side.run(args, svc, workdir)
    summary = summarize(dbos, so)
    from importlib import metadata

    info = machine()
    info["packages"]["dbos"] = metadata.version("dbos")
    data = {
        "config": {
            "rate": args.rate,
            "latency_wakes": args.latency_wakes,
            "saturation_wakes": args.saturation_wakes,
            "senders": args.senders,
            "parked": args.parked,
            "dbos_parked": args.dbos_parked,
            "dbos": "one DBOS process (async workflows, LISTEN/NOTIFY), DBOSClient sender in "
            "the bench process, its own database on the same Postgres server",
            "signoff": "1 gateway + 1 worker processes; HTTP deliver_event from the bench process",
        },
        "machine": {**info, **versions, **busy},
        "summary": summary,
        "dbos": dbos,
        "signoff": so,
        "seconds": round(time.monotonic() - t0, 1),
    }
    path = write_json(args.out, "workflows", data)
    for k, v in summary.items():
        log(f"  {k:40s} {v.get('value')} {v.get('unit', '')}")
    log(f"workflows: wrote {path} in {data['seconds']}s")
    lost = [
        side[ph]["offered"] - side[ph]["woken"]
        for side in (dbos, so)
        if side
        for ph in ("open", "saturation")
        if ph in side
    ]
    if any(lost):
        log(f"workflows: WAKES LOST: {lost}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
