#!/usr/bin/env python3
"""The same human-approval step in LangGraph and in signoff, on the same Postgres, in one run.

LangGraph, the way its users write it: a graph whose ``ask`` node calls
``interrupt({...card...})``; the person's decision comes back with
``graph.ainvoke(Command(resume={"decision": "approve"}), config)`` and the
``AsyncPostgresSaver`` (``langgraph-checkpoint-postgres``, psycopg pool) keeps
the checkpoints in the bench's Postgres database.

* ``resume``: the graph ends right after ``interrupt()`` returns, so the call
  measures "the decision is durable and the paused workflow has it" - the same
  step as signoff's decision latency (the gateway received the decision -> it is
  committed with its audit row -> the parked run's future resolved on the worker).
* ``resume_and_act``: an ``act`` node then inserts the charge (idempotency key =
  thread id) - the step a signoff client sees as decision-to-result (click ->
  ``executed`` event), which additionally revalidates, records ``executing`` and
  ``executed``, and tells the model.

* DBOS Transact (``bench/dbos_peer.py``): a workflow parked in ``DBOS.recv``, woken
  by ``DBOS.send`` from another process, then one durable step inserting the charge
  (recv + step, the same work as click -> executed).

Both sides run closed loop at concurrency 1 and 16 (resumes/s at 16). At
concurrency 1 a signoff user clicks the next card once the last one's result
arrived (one at a time, as each LangGraph resume finishes its work before the
next); at 16, once the gateway answered (decisions/s; results/s is reported
beside it), and again once the card was executed (``signoff_16_executed``: 16
users each waiting for their result, as 16 LangGraph resumers wait for theirs).
LangGraph and DBOS run first, while the signoff processes are not started; then
signoff runs with 2 gateways and 2 workers. Ratios are peer / signoff for latency
and signoff / peer for throughput (> 1: signoff better), and only between spans
that cover the same work: LangGraph resume + act and DBOS recv + step against
signoff's click -> executed (``ratio_vs_langgraph_*``, ``ratio_vs_dbos_*``). The
older ``ratio_resume_*`` keys compare LangGraph's bare resume with signoff's
server-side decision latency, which is not the same work: diagnostics only.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import dbos_peer
from bench.common import (
    TMP,
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


class State(TypedDict, total=False):
    amount_cents: int
    customer: str
    decision: str
    charged: bool


def build_graph(checkpointer: Any, pool: Any, act: bool) -> Any:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    async def propose(state: State) -> State:
        return {"amount_cents": state.get("amount_cents", 1200), "customer": "João Silva"}

    async def ask(state: State) -> State:
        decision = interrupt(
            {"summary": f"Gerar cobrança Pix · {state['customer']} · {state['amount_cents']}"}
        )
        return {"decision": decision["decision"]}

    async def do_act(state: State) -> State:
        from langgraph.config import get_config

        if state.get("decision") != "approve":
            return {"charged": False}
        key = get_config()["configurable"]["thread_id"]
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO lg_charges (idempotency_key, amount) VALUES (%s, %s) "
                "ON CONFLICT DO NOTHING",
                (key, state["amount_cents"]),
            )
        return {"charged": True}

    g = StateGraph(State)
    g.add_node("propose", propose)
    g.add_node("ask", ask)
    g.add_edge(START, "propose")
    g.add_edge("propose", "ask")
    if act:
        g.add_node("act", do_act)
        g.add_edge("ask", "act")
        g.add_edge("act", END)
    else:
        g.add_edge("ask", END)
    return g.compile(checkpointer=checkpointer)


async def langgraph_side(database_url: str, args: Any, bar: Any) -> dict[str, Any]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.types import Command
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    # Any: psycopg_pool cannot express the dict_row connections that `kwargs` asks for, which
    # AsyncPostgresSaver's parameter type wants (and both are untyped without the bench extras)
    pool: Any = AsyncConnectionPool(
        database_url,
        min_size=4,
        max_size=max(args.concurrency) + 2,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
    )
    await pool.open(wait=True)
    try:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        async with pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS lg_charges (idempotency_key text PRIMARY KEY, "
                "amount bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
            )
        out: dict[str, Any] = {}
        for mode, act in (("resume", False), ("resume_and_act", True)):
            graph = build_graph(saver, pool, act)
            for conc, n in zip(args.concurrency, args.decisions, strict=True):
                runs = []
                for r in range(args.runs):
                    prefix = f"{mode}-{conc}-{r}-{time.time_ns()}"
                    threads = [f"{prefix}-{i}" for i in range(n)]

                    async def start(t: str, graph: Any = graph) -> None:
                        res = await graph.ainvoke(
                            {"amount_cents": 1200}, {"configurable": {"thread_id": t}}
                        )
                        assert "__interrupt__" in res, res

                    await _limited([start(t) for t in threads], 16)
                    lat: list[int] = []

                    async def resumer(
                        mine: list[str], graph: Any = graph, lat: list[int] = lat
                    ) -> None:
                        for t in mine:
                            t0 = time.perf_counter_ns()
                            res = await graph.ainvoke(
                                Command(resume={"decision": "approve"}),
                                {"configurable": {"thread_id": t}},
                            )
                            lat.append(time.perf_counter_ns() - t0)
                            assert res.get("decision") == "approve", res
                            bar.update(1)

                    chunks = [threads[i::conc] for i in range(conc)]
                    t0 = time.perf_counter_ns()
                    await asyncio.gather(*(resumer(c) for c in chunks))
                    wall = (time.perf_counter_ns() - t0) / 1e9
                    runs.append(
                        {
                            "latency_ms": summarize_ms(lat),
                            "per_s": round(n / wall, 1),
                            "_ms": [x / 1e6 for x in lat],
                        }
                    )
                out[f"{mode}_{conc}"] = runs
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n, count(DISTINCT idempotency_key) AS d FROM lg_charges"
            )
            row = await cur.fetchone()
        expected = sum(args.decisions) * args.runs
        out["charges"] = {"rows": row["n"], "distinct": row["d"], "expected": expected}
        return out
    finally:
        await pool.close()


async def _limited(coros: list[Any], limit: int) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> None:
        async with sem:
            await c

    await asyncio.gather(*(one(c) for c in coros))


async def signoff_side(c: Any, args: Any, bar: Any) -> dict[str, Any]:
    from bench.decisions import Bench
    from bench.users import Users

    users = Users(c, max(args.concurrency), prefix="lg")
    await users.open()
    bench_args = type(
        "A", (), {"park_limit": 32, "drain_timeout": 120.0, "no_progress": args.no_progress}
    )()
    bench = Bench(c, users, bench_args)
    out: dict[str, Any] = {}
    try:
        for conc, n in zip(args.concurrency, args.decisions, strict=True):
            runs = []
            for _ in range(args.runs):
                cards = await bench.park_for(n, conc, f"signoff {conc}")
                await bench.drain([])
                # one at a time: the next decision once the last one's effects are done
                res = await bench.closed_loop(cards, conc, "result" if conc == 1 else "ack")
                bar.update(n)
                runs.append(
                    {
                        "latency_ms": res["decision_latency_ms"],
                        "decision_to_result_ms": res["decision_to_result_ms"],
                        "click_to_resolved_ms": res["click_to_resolved_ms"],
                        "per_s": res["decisions_per_s"],
                        "click_to_executed_ms": res["decision_to_result_ms"],
                        "results_per_s": res["results_per_s"],
                        "errors": res["errors"],
                        "_ms": res["_latency_ms"],
                        "_result_ms": [
                            (x.result_ns - x.click_ns) / 1e6 for x in cards if x.result_ns
                        ],
                    }
                )
            out[f"signoff_{conc}"] = runs
        hi = args.concurrency[-1]
        runs = []
        for _ in range(args.runs):  # the same work as a peer's resume + act at concurrency hi
            cards = await bench.park_for(args.decisions[-1], hi, f"signoff {hi} executed")
            await bench.drain([])
            res = await bench.closed_loop(cards, hi, "result")
            bar.update(args.decisions[-1])
            runs.append(
                {
                    "per_s": res["results_per_s"],
                    "click_to_executed_ms": res["decision_to_result_ms"],
                    "errors": res["errors"],
                }
            )
        out[f"signoff_{hi}_executed"] = runs
    finally:
        await users.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    p.add_argument("--decisions", type=lambda s: [int(x) for x in s.split(",")], default=[100, 256])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--no-dbos", action="store_true", help="leave the DBOS Transact peer out")
    args = p.parse_args(argv)
    raise_nofile()
    busy = machine_busy()
    t0 = time.monotonic()
    total = sum(args.decisions) * args.runs * 5 + args.decisions[-1] * args.runs
    bar = progress(total, "langgraph vs signoff", args.no_progress, "resume")
    with services(args, "langgraph") as svc:
        versions = asyncio.run(server_versions(svc.database_url, svc.redis_url))
        lg = asyncio.run(langgraph_side(svc.database_url, args, bar))
        dbos = None
        if not args.no_dbos:
            (TMP / "langgraph").mkdir(parents=True, exist_ok=True)
            dbos = asyncio.run(
                dbos_peer.run(
                    svc.server_url,
                    TMP / "langgraph",
                    latency_n=args.decisions[0],
                    rate=0.0,  # one at a time
                    throughput_n=args.decisions[-1],
                    senders=args.concurrency[-1],
                    runs=args.runs,
                    bar=bar,
                )
            )
        env = {"SIGNOFF_WS_FRAMES_PER_SECOND": "0"}
        with cluster(svc, TMP / "langgraph", gateways=2, workers=2, **env) as c:
            so = asyncio.run(signoff_side(c, args, bar))
        check = asyncio.run(exactly_once(svc.database_url))
    bar.close()
    lo, hi = args.concurrency[0], args.concurrency[-1]

    def figs(runs: list[dict[str, Any]], key: str, q: str) -> dict[str, Any]:
        return spread([r[key][q] for r in runs], "ms")

    summary: dict[str, Any] = {
        "langgraph_resume_p50_ms": figs(lg[f"resume_{lo}"], "latency_ms", "p50"),
        "langgraph_resume_p99_ms": figs(lg[f"resume_{lo}"], "latency_ms", "p99"),
        "langgraph_resumes_per_s": spread([r["per_s"] for r in lg[f"resume_{hi}"]], "1/s", 1),
        "langgraph_resume_p50_ms_at_16": figs(lg[f"resume_{hi}"], "latency_ms", "p50"),
        "langgraph_resume_p99_ms_at_16": figs(lg[f"resume_{hi}"], "latency_ms", "p99"),
        "langgraph_resume_and_act_p50_ms": figs(lg[f"resume_and_act_{lo}"], "latency_ms", "p50"),
        "langgraph_resume_and_act_p99_ms": figs(lg[f"resume_and_act_{lo}"], "latency_ms", "p99"),
        "langgraph_resume_and_act_per_s": spread(
            [r["per_s"] for r in lg[f"resume_and_act_{hi}"]], "1/s", 1
        ),
        "signoff_resume_p50_ms": figs(so[f"signoff_{lo}"], "latency_ms", "p50"),
        "signoff_resume_p99_ms": figs(so[f"signoff_{lo}"], "latency_ms", "p99"),
        "signoff_resumes_per_s": spread([r["per_s"] for r in so[f"signoff_{hi}"]], "1/s", 1),
        "signoff_results_per_s": spread(
            [r["results_per_s"] for r in so[f"signoff_{hi}"]], "1/s", 1
        ),
        "signoff_resume_p50_ms_at_16": figs(so[f"signoff_{hi}"], "latency_ms", "p50"),
        "signoff_resume_p99_ms_at_16": figs(so[f"signoff_{hi}"], "latency_ms", "p99"),
        "signoff_decision_to_result_p50_ms": figs(
            so[f"signoff_{lo}"], "decision_to_result_ms", "p50"
        ),
        "signoff_decision_to_result_p99_ms": figs(
            so[f"signoff_{lo}"], "decision_to_result_ms", "p99"
        ),
    }

    def ratio(num: list[float], den: list[float], of: str) -> dict[str, Any]:
        """Median of the paired runs' ratios (run i of one side / run i of the other)."""
        pairs = [a / b for a, b in zip(num, den, strict=False) if a and b]
        return {**spread(pairs, "x", 2), "of": of}

    def pick(runs: list[dict[str, Any]], key: str, q: str) -> list[float]:
        return [r[key][q] for r in runs]

    lg_lo, lg_hi, so_lo, so_hi = (
        lg[f"resume_{lo}"],
        lg[f"resume_{hi}"],
        so[f"signoff_{lo}"],
        so[f"signoff_{hi}"],
    )
    summary["ratio_resume_p50"] = ratio(
        pick(lg_lo, "latency_ms", "p50"), pick(so_lo, "latency_ms", "p50"), "LangGraph / signoff"
    )
    summary["ratio_resume_p99"] = ratio(
        pick(lg_lo, "latency_ms", "p99"), pick(so_lo, "latency_ms", "p99"), "LangGraph / signoff"
    )
    summary["ratio_resumes_per_s"] = ratio(
        [r["per_s"] for r in so_hi], [r["per_s"] for r in lg_hi], "signoff / LangGraph"
    )
    so_exec = so[f"signoff_{hi}_executed"]
    lg_act_lo, lg_act_hi = lg[f"resume_and_act_{lo}"], lg[f"resume_and_act_{hi}"]
    summary["langgraph_resume_act_p50_ms"] = figs(lg_act_lo, "latency_ms", "p50")
    summary["langgraph_resume_act_p99_ms"] = figs(lg_act_lo, "latency_ms", "p99")
    summary["langgraph_resume_act_per_s"] = spread([r["per_s"] for r in lg_act_hi], "1/s", 1)
    summary["signoff_executed_per_s_at_16"] = spread([r["per_s"] for r in so_exec], "1/s", 1)
    summary["ratio_vs_langgraph_p50"] = ratio(
        pick(lg_act_lo, "latency_ms", "p50"),
        pick(so_lo, "decision_to_result_ms", "p50"),
        "LangGraph resume + act / signoff click -> executed, p50, concurrency 1",
    )
    summary["ratio_vs_langgraph_per_s"] = ratio(
        [r["per_s"] for r in so_exec],
        [r["per_s"] for r in lg_act_hi],
        f"signoff executed/s / LangGraph resume + act/s, concurrency {hi}",
    )
    if dbos is not None:
        summary["dbos_recv_step_p50_ms"] = figs(dbos["latency"], "latency_ms", "p50")
        summary["dbos_recv_step_p99_ms"] = figs(dbos["latency"], "latency_ms", "p99")
        summary["dbos_recv_step_per_s"] = spread([r["per_s"] for r in dbos["throughput"]], "1/s", 1)
        summary["ratio_vs_dbos_p50"] = ratio(
            pick(dbos["latency"], "latency_ms", "p50"),
            pick(so_lo, "decision_to_result_ms", "p50"),
            "DBOS recv + step / signoff click -> executed, p50, one at a time",
        )
        summary["ratio_vs_dbos_per_s"] = ratio(
            [r["per_s"] for r in so_exec],
            [r["per_s"] for r in dbos["throughput"]],
            f"signoff executed/s / DBOS recv + step/s, {hi} concurrent",
        )
    summary["ratio_result_p50"] = ratio(
        pick(lg[f"resume_and_act_{lo}"], "latency_ms", "p50"),
        pick(so_lo, "decision_to_result_ms", "p50"),
        "LangGraph resume+act / signoff decision-to-result",
    )

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(8, 5))
    for label, runs in (
        (f"LangGraph resume, concurrency {lo}", lg[f"resume_{lo}"]),
        (f"LangGraph resume + act, concurrency {lo}", lg[f"resume_and_act_{lo}"]),
        (f"signoff decision latency, concurrency {lo}", so[f"signoff_{lo}"]),
        (f"LangGraph resume, concurrency {hi}", lg[f"resume_{hi}"]),
        (f"signoff decision latency, concurrency {hi}", so[f"signoff_{hi}"]),
    ):
        xs, ys = cdf_points(runs[0]["_ms"])
        ax.plot(xs, ys, label=label)
    xs, ys = cdf_points(so[f"signoff_{lo}"][0]["_result_ms"])
    ax.plot(xs, ys, label=f"signoff decision-to-result, concurrency {lo}", linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction")
    ax.set_title("Resume latency: LangGraph interrupt/Command(resume) vs signoff (run 1)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "langgraph_vs_signoff_cdf.png", dpi=110)
    pyplot.close(fig)

    for side in (lg, so):
        for runs in side.values():
            if isinstance(runs, list):
                for r in runs:
                    r.pop("_ms", None)
                    r.pop("_result_ms", None)
    charges = lg.pop("charges")
    lg_ok = charges["rows"] == charges["distinct"] == sum(args.decisions) * args.runs
    data = {
        "config": {
            "concurrency": args.concurrency,
            "decisions": args.decisions,
            "runs": args.runs,
            "signoff": "2 gateways + 2 workers, offline demo model, closed loop over WebSockets",
            "langgraph": "in-process AsyncPostgresSaver on a psycopg AsyncConnectionPool, closed loop",
        },
        "machine": {**machine(), **versions, **busy},
        "summary": summary,
        "langgraph": lg,
        "signoff": so,
        "dbos": dbos,
        "langgraph_charges": charges,
        "exactly_once": {**check, "ok": check["ok"] and lg_ok, "langgraph_charges_ok": lg_ok},
        "plots": ["langgraph_vs_signoff_cdf.png"],
        "seconds": round(time.monotonic() - t0, 1),
    }
    path = write_json(out, "compare_langgraph", data)
    s = summary
    log(
        f"langgraph: resume p50 {s['langgraph_resume_p50_ms']['value']} ms vs signoff "
        f"{s['signoff_resume_p50_ms']['value']} ms ({s['ratio_resume_p50']['value']}x); "
        f"{s['langgraph_resumes_per_s']['value']}/s vs {s['signoff_resumes_per_s']['value']}/s; "
        f"wrote {path}"
    )
    if not data["exactly_once"]["ok"]:
        log(f"compare_langgraph: EXACTLY-ONCE CHECK FAILED: {data['exactly_once']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
