"""The soak's figures as Markdown in bench/README.md (``bench/soak.py`` writes them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.soak import series


def readme_table(data: dict[str, Any]) -> str:
    """The soak's figures as Markdown, for bench/README.md (between soak markers)."""
    labels = {
        "rss_mb": "RSS (MB)",
        "fds": "open fds",
        "redis_keys": "Redis keys",
        "redis_clients": "Redis connected clients",
        "redis_used_mb": "Redis used_memory (MB)",
        "pg_size_mb": "Postgres database size (MB)",
        "pg_signoff_tables_mb": "Postgres, signoff's tables + indexes (MB)",
        "pg_connections": "Postgres connections",
    }
    rows = [
        "| resource | first sample | end of warm-up (first quarter after) | last quarter "
        "| change | slope after warm-up (/min) | max after warm-up | flat |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    first = series(data["samples"])
    for name, f in data["flat"].items():
        base, _, proc = name.partition(":")
        label = labels[base] + (f" {proc}" if proc else "")
        mark = {True: "yes", False: "**no**", None: "?"}[f["flat"]]
        rows.append(
            f"| {label} | {first[name][0]:g} | {f['after_warmup_first_quarter']:g} | "
            f"{f['last_quarter']:g} | {f['change']:+g} ({f['change_pct']:+g} %) | "
            f"{f['slope_per_min']:+g} | {f['max']:g} | {mark} |"
        )
    c, x = data["config"], data["exactly_once"]
    lat = [s for s in data["samples"] if "p99_ms" in s]
    after = [s for s in lat if s["t"] >= data["warmup_s"]]
    p50s = sorted(s["p50_ms"] for s in after) or [0.0]
    p99s = sorted(s["p99_ms"] for s in after) or [0.0]
    return "\n".join(
        [
            f"Run {data['at']}: {c['minutes']:g} min at {c['rate']:g} conversations/s offered "
            f"({data['conversations_per_s']:g}/s done, {data['conversations_done']:,} "
            f"conversations, {data['conversations_failed']} failed), retention "
            f"{c['retention_seconds']:g} s pruned every {c['prune_interval']:g} s, "
            f"warm-up {data['warmup_s'] / 60:g} min, pools capped at "
            f"`SIGNOFF_POOL_SIZE={c['pool_size']}`, "
            f"`SIGNOFF_REDIS_MAX_CONNECTIONS={c['redis_max_connections']}`. Machine busy "
            f"before start: {100 * data['cpu_busy_before_start']:.0f} % "
            f"(load average {data['loadavg_1m']:g}; other sessions share the 2 cores).",
            "",
            *rows,
            "",
            f"Exactly once: {x['executed']:,} executed cards still live + "
            f"{x['archive']['executed']:,} pruned (their audit exported, "
            f"{x['archive']['duplicate_lines']} repeated lines) = {x['provider_charges']:,} "
            f"provider charges; executed twice: {x['double_executions']} live, "
            f"{x['archive']['executed_twice']} archived; lost {x['lost']}. Connection bounds "
            f"(Postgres {data['bounds']['pg_connections']}, Redis "
            f"{data['bounds']['redis_clients']}) held: "
            f"{all(data['bounds_held'].values())}. Click → executed per 10 s window after "
            f"warm-up: median of the windows' p50 {p50s[len(p50s) // 2]:g} ms, of their p99 "
            f"{p99s[len(p99s) // 2]:g} ms, worst p99 {p99s[-1]:g} ms.",
        ]
    )


def update_readme(path: Path, table: str) -> None:
    begin, end = "<!-- soak:begin -->", "<!-- soak:end -->"
    text = path.read_text()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + table + "\n" + end + rest.split(end, 1)[1]
        path.write_text(text)
