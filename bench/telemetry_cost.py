"""The hot-path cost of signoff's telemetry, counted: the CPU time of the exact telemetry
calls one decision makes (the card's proposal, its decision and its execution), run in
a loop in this process with the production configuration (JSON log lines at ``info`` to a
file, prometheus-client series, spans with tracing off), divided by the loop count.

The bench machine is shared and noisy, so a before/after difference of whole-system CPU
per decision (``bench/decisions.py``) cannot resolve a few tens of microseconds; counting
can. Compare the result with the CPU per decision of the gateways and workers in
``results/decisions.json`` (``--decisions``) to get the share.

    python bench/telemetry_cost.py [--decisions results/decisions.json] [--out results]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import time
from pathlib import Path
from typing import Any

from signoff.runtime import logs, telemetry
from signoff.runtime.metrics import CLICK_TO_EXECUTED, DECISION_LATENCY, card_moved, decided

TOOL = "create_pix_charge"
IDS = {
    "card_id": "6f1c1f9e-8a53-4f0e-b8b5-3f7a2d1c9e10",
    "run_id": "0b7e2b0a-3c1d-4f5e-9a8b-7c6d5e4f3a21",
    "thread_id": "9a8b7c6d-5e4f-3a21-0b7e-2b0a3c1d4f5e",
}


def gateway_side(log: logging.Logger) -> None:
    """What Decisions.resolve and the gateway add per decision."""
    with telemetry.span("resolve", card_id=IDS["card_id"], channel="ws"):
        telemetry.traceparent()
        card_moved("approved", TOOL)
    decided("ws", "approve")
    log.info(
        "card decided",
        extra={**IDS, "decision": "approve", "channel": "ws", "user": "u1"},
    )


def worker_side(log: logging.Logger) -> None:
    """What the worker adds per decision: proposal, two model calls, continue, execute."""
    token = logs.bind(run_id=IDS["run_id"])
    with telemetry.span("model", run_id=IDS["run_id"]):
        card_moved("pending", TOOL)
    log.info("card proposed", extra={**IDS, "tool": TOOL})
    DECISION_LATENCY.observe(0.002)
    with telemetry.span("continue", run_id=IDS["run_id"]):
        with telemetry.span("execute", card_id=IDS["card_id"], run_id=IDS["run_id"], tool=TOOL):
            card_moved("executing", TOOL)
            card_moved("executed", TOOL)
            CLICK_TO_EXECUTED.observe(0.004)
        log.info("card executed", extra={**IDS, "tool": TOOL, "status": "executed"})
        with telemetry.span("model", run_id=IDS["run_id"]):
            pass
    logs.unbind(token)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(fn: Any, log: logging.Logger, n: int) -> float:
    """CPU microseconds per call (best of three rounds)."""
    best = float("inf")
    for _ in range(3):
        t0 = cpu()
        for _ in range(n):
            fn(log)
        best = min(best, (cpu() - t0) / n * 1e6)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="decisions per round")
    p.add_argument("--decisions", help="a results/decisions.json for CPU ms per decision")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args()
    out: dict[str, Any] = {"n": args.n}
    with open(os.devnull, "w") as sink:
        for level in ("info", "warning"):
            logs.setup("json", level, sink, role="bench")
            log = logging.getLogger("signoff.bench")
            out[f"gateway_us_per_decision_log_{level}"] = round(
                measure(gateway_side, log, args.n), 2
            )
            out[f"worker_us_per_decision_log_{level}"] = round(measure(worker_side, log, args.n), 2)
    if args.decisions:
        data = json.loads(Path(args.decisions).read_text())
        out["share_of_cpu"] = shares(data, out)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "telemetry_cost.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


def shares(data: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """The telemetry's share of the gateways' and workers' CPU per decision, per phase."""
    result = {}
    for phase in data.get("phases", []):
        cost = (phase.get("cost") or {}).get("cpu_ms_per_decision") or {}
        gw, wk = cost.get("gateways"), cost.get("workers")
        if not gw or not wk:
            continue
        spent = out["gateway_us_per_decision_log_info"] + out["worker_us_per_decision_log_info"]
        result[f"{phase.get('kind')} {phase.get('x')} run {phase.get('run')}"] = {
            "gateway_and_worker_cpu_us": round((gw + wk) * 1000, 1),
            "telemetry_us": round(spent, 1),
            "share_percent": round(100 * spent / ((gw + wk) * 1000), 2),
        }
    return result


if __name__ == "__main__":
    t = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t:.1f}s)")
