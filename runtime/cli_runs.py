"""``signoff runs list|show``: where each run stands, workflow runs and agent runs.

Registered by ``runtime/cli.py`` (:func:`add_parser`, :func:`main`); part of the CLI, so
of the composition root; reads Postgres only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from signoff.runtime import config as cfg
from signoff.runtime.errors import InvalidInput, NotFound, WorkflowNotFound
from signoff.runtime.text import terminal_safe

NO_DATABASE = "set SIGNOFF_DATABASE_URL or --database-url (or run `signoff dev` on this --data-dir)"
KINDS = ("workflow", "agent")
STATUSES = sorted(
    {"running", "awaiting_human", "awaiting_event", "completed", "failed", "cancelled"}
    | {"running", "waiting", "done", "failed", "superseded"}
)


def add_parser(
    sub: Any, common: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    rp: argparse.ArgumentParser = sub.add_parser(
        "runs", help="list or show runs (workflow runs and agent runs) and where each stands"
    )
    common(rp)
    rp.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=["list", "show"],
        help="list runs (the default), or show one run (with run_id)",
    )
    rp.add_argument("run_id", nargs="?", help="the run to show (show only)")
    rp.add_argument("--kind", choices=KINDS, help="only workflow runs or only agent runs")
    rp.add_argument(
        "--status",
        choices=STATUSES,
        help="only runs in this status (workflow: running, awaiting_human, awaiting_event, "
        "completed, failed, cancelled; agent: running, waiting, done, failed, superseded)",
    )
    rp.add_argument("--limit", type=int, default=50, help="at most this many runs (50)")
    rp.add_argument(
        "--json",
        action="store_true",
        help="JSON instead of text (list: an array of runs, newest first; show: every field)",
    )
    return rp


def _shown(out: dict[str, Any]) -> str:
    """One run for a person (``--json`` has every field): where it stands, then its gates
    (a workflow run) or its cards (an agent run)."""
    run = out["run"]
    lines = [f"{out['kind']} run {run['id']}"]
    if out["kind"] == "workflow":
        lines.append(f"  workflow:  {run['workflow']} (app {run['app']})")
        lines.append(f"  status:    {run['status']}   {out['where']}")
    else:
        lines.append(f"  status:    {run['status']}   thread: {run['thread_id']}")
    lines.append(f"  owner:     {run['owner']} ({run['tenant']})   holder: {run['holder'] or '-'}")
    if run.get("error"):
        lines.append(f"  error:     {run['error']}")
    if out["kind"] == "workflow":
        done = [str(s.get("name", "?")) for s in run.get("steps") or []]
        lines.append(f"  steps done: {', '.join(done) or '-'}")
        lines.append("  gates:")
        for i in out["interrupts"]:
            by = f" by {i['resolved_by']}" if i.get("resolved_by") else ""
            lines.append(
                f"    {str(i['created_at'])[:19]}  {i['kind']} at {i['step_name']!r}: "
                f"{i['status']}{by}" + (f"  ({i['reason']})" if i.get("reason") else "")
            )
    else:
        lines.append("  cards:")
        for c in out["cards"]:
            lines.append(f"    {c['id']}  {c['status']:<12} {c['tool']}  {c['summary']}")
    return "\n".join(lines)


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S")


def where_workflow(run: Any) -> str:
    """A workflow run's position in words: its step and what it waits for."""
    last = run.steps[-1]["name"] if run.steps else None
    after = f" after {last!r}" if last else ""
    if str(run.status) in ("awaiting_human", "awaiting_event"):
        return f"{run.workflow}: waiting at step {run.step}{after}"
    if str(run.status) == "running":
        return f"{run.workflow}: running step {run.step}{after}"
    if run.error:
        return f"{run.workflow}: at step {run.step}: {run.error}"
    return f"{run.workflow}: {len(run.steps)} steps done"


async def _listed(store: Any, args: argparse.Namespace) -> list[tuple[datetime, str, Any]]:
    """The runs to list, newest first: (updated, a line for a person, an object for
    ``--json``: kind, id, status, owner, tenant, holder, where, error, updated_at, and
    for an agent run its thread, for a workflow run its workflow and step)."""
    rows: list[tuple[datetime, str, Any]] = []
    if args.kind in (None, "workflow"):
        for run in await store.workflows.list_workflow_runs(status=args.status, limit=args.limit):
            where = where_workflow(run)
            line = f"workflow  {run.id}  {run.status!s:<15} {run.owner:<12} "
            obj = {
                "kind": "workflow",
                "id": run.id,
                "status": str(run.status),
                "owner": run.owner,
                "tenant": run.tenant,
                "holder": run.holder,
                "workflow": run.workflow,
                "step": run.step,
                "where": where,
                "error": run.error,
                "updated_at": run.updated_at.isoformat(),
            }
            rows.append((run.updated_at, line + where, obj))
    if args.kind in (None, "agent"):
        for r in await store.workflows.list_agent_runs(args.status, args.limit):
            where = f"thread {r['thread_id']}" + (f": {r['error']}" if r["error"] else "")
            line = f"agent     {r['id']}  {r['status']:<15} {r['owner']:<12} "
            obj = {
                "kind": "agent",
                "id": str(r["id"]),
                "status": str(r["status"]),
                "owner": r["owner"],
                "tenant": r["tenant"],
                "holder": r["holder"],
                "thread_id": str(r["thread_id"]),
                "where": where,
                "error": r["error"],
                "updated_at": r["updated_at"].isoformat(),
            }
            rows.append((r["updated_at"], line + where, obj))
    rows.sort(key=lambda x: x[0], reverse=True)
    return rows[: args.limit]


def _error(message: str) -> int:
    print(f"signoff runs: {message}", file=sys.stderr)
    return 2


async def main(args: argparse.Namespace, settings: cfg.Settings) -> int:
    from signoff.runtime.cli_ops import NoDatabase, operator_settings
    from signoff.store.postgres import PostgresStore

    try:  # the running signoff dev's database (as it recorded it), as signoff cards does
        url = operator_settings(settings).database_url
    except NoDatabase:
        url = None
    if url is None:
        return _error(NO_DATABASE)
    if args.action == "show" and not args.run_id:
        return _error("show needs a run id (or a unique prefix of one)")
    store = await PostgresStore.connect(url, statement_cache_size=settings.db_statement_cache_size)
    try:
        if args.action == "list":
            rows = await _listed(store, args)
            if args.json:
                print(json.dumps([obj for _, _, obj in rows], indent=2, ensure_ascii=False))
                return 0
            print(f"{'KIND':<9} {'ID':<36}  {'STATUS':<15} {'OWNER':<12} WHERE (UPDATED)")
            for at, line, _ in rows:
                print(terminal_safe(f"{line}  ({_when(at)})"))
            return 0
        out: dict[str, Any]
        try:
            run_id = await store.operator.run_id(args.run_id)
        except (NotFound, InvalidInput) as exc:  # none, or several (AmbiguousId)
            return _error(exc.message)
        try:
            run = await store.workflows.get_workflow_run(run_id)
            interrupts = await store.workflows.interrupts(run.id)
            out = {
                "kind": "workflow",
                "where": where_workflow(run),
                "run": msgspec.to_builtins(run),
                "interrupts": msgspec.to_builtins(interrupts),
            }
        except WorkflowNotFound:
            agent_run = await store.get_run(run_id)
            cards = await store.cards_of_run(agent_run.id)
            out = {
                "kind": "agent",
                "run": msgspec.to_builtins(agent_run),
                "cards": [c.public() for c in cards],
            }
        if args.json:
            print(json.dumps(out, indent=2, ensure_ascii=False, default=str))
        else:
            print(terminal_safe(_shown(out)))
        return 0
    finally:
        await store.close()
