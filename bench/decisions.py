#!/usr/bin/env python3
"""Decision latency and throughput: simulated users over real WebSockets, G gateways, W workers.

Each simulated user chats on one gateway (asks for a write in a new thread and
waits for its card: a parked run) and approves on *another* gateway. Figures:

* decision latency - the gateway received the decision -> the owning worker's
  future resolved. Read from the workers themselves (``/metrics/decision-latency``
  on ``SIGNOFF_METRICS_PORT``), which record it from ``CardSignal.at_ns``.
* click -> resolved - the client sent ``resolve`` -> the gateway answered (committed).
* decision-to-result - the client sent ``resolve`` -> the chat socket, on the other
  gateway, got the card's ``card_update`` with status ``executed``.

Open loop (a fixed arrival rate, sends never wait for answers) gives the latency
figures; closed loop (N users each approving their next card as soon as the last
was answered) gives throughput at concurrency N. Parking the next phase's runs
overlaps the previous phase's drain; nothing else runs while a phase is measured.
The offline demo model keeps the model's own time out of every figure.

At the end the store and the demo provider are checked: every approved card
executed once (executing events == executed cards == provider charges); the
script exits 1 otherwise.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    TMP,
    Cluster,
    base_parser,
    cdf_points,
    cluster,
    exactly_once,
    log,
    machine,
    machine_busy,
    plt,
    progress,
    raise_nofile,
    server_versions,
    services,
    spread,
    summarize_ms,
    write_json,
)
from bench.costs import Costs
from bench.users import Card, Users


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parser() -> Any:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--gateways", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--users", type=int, default=200, help="users of the open-loop phases")
    p.add_argument("--rates", type=ints, default=[25, 100, 1000], help="open-loop decisions/s")
    p.add_argument(
        "--seconds", type=floats, default=[4.0, 2.0, 0.4], help="seconds of arrivals per rate"
    )
    p.add_argument("--open-runs", type=ints, default=[2, 3, 2], help="runs per rate")
    p.add_argument("--concurrency", type=ints, default=[1, 64, 256, 1000])
    p.add_argument(
        "--closed-decisions", type=ints, default=[60, 192, 256, 1000], help="per concurrency"
    )
    p.add_argument("--closed-runs", type=ints, default=[2, 2, 1, 1], help="runs per concurrency")
    p.add_argument("--park-limit", type=int, default=48, help="parkings in flight")
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument(
        "--max-seconds",
        type=float,
        default=130.0,
        help="start no new phase after this long (the rest is reported as skipped)",
    )
    p.add_argument("--quick", action="store_true", help="a small smoke run (seconds, not minutes)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the gateways and workers (A/B runs, bench/ab.py)",
    )
    return p


# --------------------------------------------------------------------------- phases


class Bench:
    def __init__(self, c: Cluster, users: Users, args: Any) -> None:
        self.c = c
        self.users = users
        self.args = args
        self.clicked: list[Card] = []
        self.costs = Costs(c)
        self.parking: dict[str, Any] = {}  # of the last park_for

    async def park_for(self, n: int, user_count: int, desc: str) -> list[Card]:
        """n parked runs on the first ``user_count`` users (round robin)."""
        bar = progress(n, f"park {desc}", self.args.no_progress, "run")
        sub = Users.__new__(Users)
        sub.__dict__.update(self.users.__dict__)
        sub.users = self.users.users[:user_count]
        cost0 = await self.costs.snapshot()
        t0 = time.perf_counter_ns()
        try:
            cards = await sub.park(n, limit=self.args.park_limit, bar=bar)
        finally:
            bar.close()
        seconds = (time.perf_counter_ns() - t0) / 1e9
        await asyncio.sleep(1.0)  # Postgres publishes its counters about once a second
        # The message path (a new thread, its first message, the model's proposal, the
        # card on the chat socket), with at most park_limit messages in flight: a
        # diagnostic beside the decision figures, not a target.
        self.parking = {
            "runs": len(cards),
            "runs_per_s": round(len(cards) / seconds, 1) if seconds else None,
            "message_to_card_ms": summarize_ms([int(c.asked_ms * 1e6) for c in cards]),
            "in_flight": self.args.park_limit,
            "cost": Costs.per(cost0, await self.costs.snapshot(), len(cards)),
        }
        return cards

    async def drain(self, cards: list[Card]) -> bool:
        """Wait until every clicked card's result arrived (or errored), then for idle workers."""
        deadline = time.monotonic() + self.args.drain_timeout
        while time.monotonic() < deadline:
            if all(c.result_ns or c.error or c.final for c in cards):
                break
            await asyncio.sleep(0.05)
        else:
            return False
        while time.monotonic() < deadline:
            if await asyncio.to_thread(self.c.worker_tasks) == 0:
                return True
            await asyncio.sleep(0.05)
        return False

    async def marks(self) -> tuple[dict[str, int], dict[str, int]]:
        """The workers' record counts now (decision latency, spans), to read what follows."""
        return (
            await asyncio.to_thread(self.c.latency_counts),
            await asyncio.to_thread(self.c.span_counts),
        )

    async def server_side(self, marks: tuple[dict[str, int], dict[str, int]]) -> dict[str, Any]:
        """Per-process spans recorded since ``marks``: ``{name: {path: summary}}``. Every
        resolution is there, whatever woke it, timed by one process's monotonic clock."""
        spans = await asyncio.to_thread(self.c.span_samples, marks[1])
        grouped: dict[str, dict[str, list[int]]] = {}
        for name, path, ns in spans:
            grouped.setdefault(name, {}).setdefault(path, []).append(ns)
        return {
            name: {path: summarize_ms(v) for path, v in sorted(paths.items())}
            for name, paths in grouped.items()
        }

    def stats(
        self, cards: list[Card], samples: list[int], t0: int, t1: int, offered: float | None
    ) -> dict[str, Any]:
        ok = [c for c in cards if not c.error]
        resolved = sorted(c.resolved_ns for c in ok if c.resolved_ns)
        span = max((resolved[-1] - t0) / 1e9, 1e-9) if resolved else float("nan")
        timeline = []
        if resolved:
            bins: dict[int, int] = {}
            for r in resolved:
                k = int((r - t0) / 1e8)
                bins[k] = bins.get(k, 0) + 1
            timeline = [[k / 10, n * 10] for k, n in sorted(bins.items())]
        results = sorted(c.result_ns for c in ok if c.result_ns)
        rspan = (results[-1] - t0) / 1e9 if results else float("nan")
        return {
            "decisions": len(cards),
            "ended_otherwise": sorted({c.final for c in cards if c.final}),
            "results_per_s": round(len(results) / rspan, 1) if results else 0.0,
            "errors": len(cards) - len(ok),
            "error_messages": sorted({c.error or "" for c in cards if c.error})[:5],
            "offered_per_s": offered,
            "send_seconds": round((t1 - t0) / 1e9, 3),
            "decisions_per_s": round(len(resolved) / span, 1) if resolved else 0.0,
            "runtime_samples": len(samples),
            "decision_latency_ms": summarize_ms(samples),
            "click_to_resolved_ms": summarize_ms(
                [c.resolved_ns - c.click_ns for c in resolved_of(ok)]
            ),
            "decision_to_result_ms": summarize_ms(
                [c.result_ns - c.click_ns for c in ok if c.result_ns]
            ),
            "click_to_run_done_ms": summarize_ms(
                [c.run_done_ns - c.click_ns for c in ok if c.run_done_ns]
            ),
            "timeline_decisions_per_s": timeline,
            "_latency_ms": [round(s / 1e6, 4) for s in samples],
        }

    async def open_loop(self, cards: list[Card], rate: float) -> dict[str, Any]:
        """Send at t0 + i/rate, whatever the answers; latency figures come from here."""
        before = await self.marks()
        cost0 = await self.costs.snapshot()
        self.users.expect(len(cards))
        t0 = time.perf_counter_ns()
        step = 1e9 / rate
        for i, card in enumerate(cards):
            due = t0 + int(i * step)
            wait = (due - time.perf_counter_ns()) / 1e9
            if wait > 0.0005:
                await asyncio.sleep(wait)
            await self.users.click(card)
        t1 = time.perf_counter_ns()
        self.clicked += cards
        drained = await self.drain(cards)
        samples = await asyncio.to_thread(self.c.latency_samples, before[0])
        out = self.stats(cards, samples, t0, t1, rate)
        out["worker_spans_ms"] = await self.server_side(before)
        out["drained"] = drained
        await asyncio.sleep(1.0)  # Postgres publishes its counters about once a second
        out["cost"] = Costs.per(cost0, await self.costs.snapshot(), len(cards))
        return out

    async def closed_loop(
        self, cards: list[Card], concurrency: int, until: str = "ack"
    ) -> dict[str, Any]:
        """``concurrency`` users, each approving its next card once the last was answered
        (``until="ack"``: the gateway committed it; ``"result"``: it was executed)."""
        before = await self.marks()
        cost0 = await self.costs.snapshot()
        by_user: dict[str, list[Card]] = {}
        for card in cards:
            by_user.setdefault(card.user.name, []).append(card)
        self.users.expect(len(cards))

        async def clicker(mine: list[Card]) -> None:
            for card in mine:
                try:
                    await self.users.click_and_wait(card, until)
                except TimeoutError:
                    card.error = card.error or "no answer within 60 s"

        t0 = time.perf_counter_ns()
        await asyncio.gather(*(clicker(m) for m in by_user.values()))
        t1 = time.perf_counter_ns()
        self.clicked += cards
        drained = await self.drain(cards)
        samples = await asyncio.to_thread(self.c.latency_samples, before[0])
        out = self.stats(cards, samples, t0, t1, None)
        out["worker_spans_ms"] = await self.server_side(before)
        out["concurrency"] = concurrency
        out["users"] = len(by_user)
        out["waits_for"] = until
        out["drained"] = drained
        await asyncio.sleep(1.0)  # Postgres publishes its counters about once a second
        out["cost"] = Costs.per(cost0, await self.costs.snapshot(), len(cards))
        return out


def resolved_of(cards: list[Card]) -> list[Card]:
    return [c for c in cards if c.resolved_ns and c.click_ns]


async def run(c: Cluster, args: Any) -> dict[str, Any]:
    plan: list[tuple[str, Any, int, int, int]] = []  # (kind, rate|conc, decisions, users, run#)
    # Every phase's first run, then the repeats: a spent time budget only drops repeats.
    for r in range(max([*args.open_runs, *args.closed_runs])):
        for rate, secs, runs in zip(args.rates, args.seconds, args.open_runs, strict=True):
            if r < runs:
                plan.append(("open", rate, max(1, int(rate * secs)), args.users, r))
        for conc, n, runs in zip(
            args.concurrency, args.closed_decisions, args.closed_runs, strict=True
        ):
            if r < runs:
                plan.append(("closed", conc, max(n, conc), conc, r))
    n_users = max([args.users, *args.concurrency])
    users = Users(c, n_users, prefix="du")
    t = time.monotonic()
    await users.open()
    log(f"decisions: {n_users} users, {2 * n_users} sockets open in {time.monotonic() - t:.1f}s")
    bench = Bench(c, users, args)
    phases: list[dict[str, Any]] = []
    kind, x, n, u, r = plan[0]
    parked = asyncio.create_task(bench.park_for(n, u, f"{kind}-{x}"))
    started = time.monotonic()
    skipped: list[str] = []
    for i, (kind, x, n, _u, r) in enumerate(plan):
        if time.monotonic() - started > args.max_seconds:
            parked.cancel()
            skipped = [f"{k} {xx} run {rr + 1}" for k, xx, _n, _uu, rr in plan[i:]]
            log(f"decisions: time budget spent; skipped {skipped}")
            break
        t = time.monotonic()
        cards = await parked
        parking = bench.parking
        # quiet before measuring: no step in flight anywhere
        await bench.drain([])
        log(f"  {kind} {x}: {n} parked runs ready in {time.monotonic() - t:.1f}s")
        bar = progress(None, f"{kind} {x} run {r + 1}", args.no_progress, "phase")
        if kind == "open":
            out = await bench.open_loop(cards, float(x))
        else:
            out = await bench.closed_loop(cards, int(x))
        bar.close()
        if i + 1 < len(plan):
            nk, nx, nn, nu, _ = plan[i + 1]
            parked = asyncio.create_task(bench.park_for(nn, nu, f"{nk}-{nx}"))
        out.update({"kind": kind, "x": x, "run": r + 1, "parking": parking})
        dl = out["decision_latency_ms"]
        log(
            f"  {kind} {x} run {r + 1}: decision p50 {dl.get('p50')} p99 {dl.get('p99')} ms, "
            f"{out['decisions_per_s']}/s (results {out['results_per_s']}/s), result p50 {out['decision_to_result_ms'].get('p50')} ms, "
            f"errors {out['errors']}"
        )
        phases.append(out)
    await users.close()
    return {"phases": phases, "users": n_users, "skipped": skipped}


# --------------------------------------------------------------------------- summary and plots


def summarize(phases: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for ph in phases:
        groups.setdefault((ph["kind"], ph["x"]), []).append(ph)
    for (kind, x), runs in groups.items():
        key = f"{kind}_{x}"
        g: dict[str, Any] = {}
        for fig in ("decision_latency_ms", "click_to_resolved_ms", "decision_to_result_ms"):
            for q in ("p50", "p90", "p99", "p99.9", "max"):
                g[f"{fig.removesuffix('_ms')}_{q.replace('.', '')}_ms"] = spread(
                    [r[fig].get(q, float("nan")) for r in runs], "ms"
                )
        g["decisions_per_s"] = spread([r["decisions_per_s"] for r in runs], "1/s", 1)
        g["results_per_s"] = spread([r["results_per_s"] for r in runs], "1/s", 1)
        g["cost_run1"] = runs[0].get("cost")
        parks = [r["parking"] for r in runs if r.get("parking")]
        g["parking_runs_per_s"] = spread([p["runs_per_s"] for p in parks], "1/s", 1)
        g["message_to_card_p50_ms"] = spread(
            [p["message_to_card_ms"].get("p50", float("nan")) for p in parks], "ms"
        )
        g["parking_cost_run1"] = parks[0]["cost"] if parks else None
        g["worker_spans_run1_ms"] = runs[0].get("worker_spans_ms")
        g["errors"] = sum(r["errors"] for r in runs)
        g["decisions"] = sum(r["decisions"] for r in runs)
        out[key] = g
    return out


def plot(phases: list[dict[str, Any]], out: Path) -> list[str]:
    pyplot = plt()
    files = []
    fig, ax = pyplot.subplots(figsize=(8, 5))
    seen = set()
    for ph in phases:
        key = f"{ph['kind']} {ph['x']}"
        if key in seen or not ph["_latency_ms"]:
            continue
        seen.add(key)
        label = f"open loop {ph['x']}/s" if ph["kind"] == "open" else f"closed, {ph['x']} users"
        xs, ys = cdf_points(ph["_latency_ms"])
        ax.plot(xs, ys, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("decision latency, ms (gateway received -> worker future resolved)")
    ax.set_ylabel("fraction of decisions")
    ax.set_title("Decision latency CDF (first run of each phase)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "decisions_latency_cdf.png"
    fig.savefig(path, dpi=110)
    files.append(path.name)
    pyplot.close(fig)

    fig, ax = pyplot.subplots(figsize=(8, 5))
    seen = set()
    for ph in phases:
        key = f"{ph['kind']} {ph['x']}"
        if key in seen or not ph["timeline_decisions_per_s"]:
            continue
        seen.add(key)
        label = f"open loop {ph['x']}/s" if ph["kind"] == "open" else f"closed, {ph['x']} users"
        xs = [p[0] for p in ph["timeline_decisions_per_s"]]
        ys = [p[1] for p in ph["timeline_decisions_per_s"]]
        ax.plot(xs, ys, label=label, drawstyle="steps-post")
    ax.set_xlabel("seconds since the phase started")
    ax.set_ylabel("decisions answered per second (100 ms bins)")
    ax.set_title("Throughput over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "decisions_throughput.png"
    fig.savefig(path, dpi=110)
    files.append(path.name)
    pyplot.close(fig)

    fig, ax = pyplot.subplots(figsize=(8, 5))
    first = next((p for p in phases if p["kind"] == "open" and p["_latency_ms"]), None)
    if first is not None:
        ax.hist(first["_latency_ms"], bins=60, color="tab:blue")
        ax.set_title(f"Decision latency histogram, open loop {first['x']}/s (run 1)")
        ax.set_xlabel("ms")
        ax.set_ylabel("decisions")
    fig.tight_layout()
    path = out / "decisions_latency_hist.png"
    fig.savefig(path, dpi=110)
    files.append(path.name)
    pyplot.close(fig)
    return files


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.rates, args.seconds, args.open_runs = [50, 200], [1.0, 0.5], [1, 1]
        args.concurrency, args.closed_decisions, args.closed_runs = [1, 16], [20, 64], [1, 1]
        args.users = 20
    raise_nofile()
    busy = machine_busy()
    t_start = time.monotonic()
    with services(args, "decisions") as svc:
        versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
        env = {"SIGNOFF_WS_FRAMES_PER_SECOND": "0", "SIGNOFF_POOL_SIZE": "10"}
        env.update(kv.split("=", 1) for kv in args.env)
        with cluster(
            svc, TMP / "decisions", gateways=args.gateways, workers=args.workers, **env
        ) as c:
            result = asyncio.run(run(c, args))
            check = asyncio.run(exactly_once(svc.database_url))
    phases = result["phases"]
    summary = summarize(phases)
    args.out.mkdir(parents=True, exist_ok=True)
    plots = plot(phases, args.out)
    for ph in phases:
        ph["latency_sample_count"] = len(ph.pop("_latency_ms"))
    data = {
        "config": {
            "env": args.env,
            "gateways": args.gateways,
            "workers": args.workers,
            "users": result["users"],
            "rates": args.rates,
            "seconds": args.seconds,
            "open_runs": args.open_runs,
            "concurrency": args.concurrency,
            "closed_decisions": args.closed_decisions,
            "closed_runs": args.closed_runs,
            "ws_frame_limit": "off (SIGNOFF_WS_FRAMES_PER_SECOND=0): one simulated user clicks "
            "far more often than a person",
        },
        "machine": {**machine(), **versions, **busy},
        "summary": summary,
        "skipped_phases": result["skipped"],
        "phases": phases,
        "exactly_once": check,
        "plots": plots,
        "seconds": round(time.monotonic() - t_start, 1),
    }
    path = write_json(args.out, "decisions", data)
    log(f"decisions: wrote {path} in {data['seconds']}s; exactly once: {check['ok']}")
    if not check["ok"]:
        log(f"decisions: EXACTLY-ONCE CHECK FAILED: {check}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
