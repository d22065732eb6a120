"""``signoff prune``: apply the retention policy now (``--dry-run``: only count).

Prints what was deleted (or would be) per rule, then the channel delivery ids (they
carry no tenant: pruned by a whole prune, never by one of ``--tenant``). Safe beside
running workers and another prune: threads and rows are taken with ``FOR UPDATE SKIP
LOCKED``, each batch is its own transaction (runtime/retention.py).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import msgspec

from signoff.runtime import retention
from signoff.runtime.cli_ops import operator_settings
from signoff.runtime.config import Settings
from signoff.runtime.faults import Faults


def add_parser(
    sub: Any, common: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    pr: argparse.ArgumentParser = sub.add_parser(
        "prune",
        help="delete threads past their tenant's retention (audit of executed cards "
        "exported to JSONL first); --dry-run counts",
    )
    common(pr)
    pr.add_argument(
        "--dry-run", action="store_true", help="count what would be deleted; change nothing"
    )
    pr.add_argument(
        "--days",
        type=float,
        help="keep this many days for every tenant without a rule of its own "
        "(SIGNOFF_RETENTION_DAYS; fractions allowed)",
    )
    pr.add_argument(
        "--tenant",
        help="prune this tenant only (its own rule, else the default days); channel "
        "delivery ids, which carry no tenant, are left for a whole prune",
    )
    pr.add_argument(
        "--batch",
        type=int,
        help="threads (or WhatsApp bookkeeping rows) deleted per transaction "
        "(SIGNOFF_RETENTION_BATCH, 200)",
    )
    pr.add_argument(
        "--archive-dir",
        help="where the audit JSONL files go (SIGNOFF_RETENTION_ARCHIVE_DIR, <data-dir>/audit)",
    )
    pr.add_argument("--json", action="store_true", help="print the counts as JSON")
    return pr


async def run(args: argparse.Namespace, settings: Settings) -> int:
    from signoff.store.postgres import PostgresStore

    if args.days is not None:
        settings = settings.with_(retention_days=args.days)
    if args.batch is not None:
        settings = settings.with_(retention_batch=args.batch)
    if args.archive_dir is not None:
        settings = settings.with_(retention_archive_dir=args.archive_dir)
    policy = retention.Policy.from_settings(settings)
    if not policy.rules(args.tenant):
        print(
            "signoff prune: no retention configured"
            + (f" for tenant {args.tenant!r}" if args.tenant else "")
            + ": set SIGNOFF_RETENTION_DAYS (or --days) or SIGNOFF_RETENTION_TENANTS; "
            "nothing deleted"
        )
        return 0
    settings = operator_settings(settings)
    assert settings.database_url is not None
    archive = retention.JsonlArchive(retention.archive_dir(settings))
    store = await PostgresStore.connect(
        settings.database_url, statement_cache_size=settings.db_statement_cache_size
    )
    try:
        done = await retention.prune(
            store.retention,
            policy,
            archive=archive,
            batch=settings.retention_batch,
            dry_run=args.dry_run,
            only=args.tenant,
            faults=Faults(settings.faults),
        )
    finally:
        await store.close()
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, **msgspec.to_builtins(done)}))
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    for label, counts in done.rules.items():
        who = "every other tenant" if label == retention.DEFAULT_RULE else f"tenant {label}"
        print(
            f"{who}: {verb} {counts.threads} threads, {counts.messages} messages, "
            f"{counts.runs} runs, {counts.cards} cards ({counts.audited} audited cards"
            + ("" if args.dry_run else f" exported to {archive.folder}")
            + f"), {counts.wa_outbound} finished WhatsApp outbound rows"
        )
    if done.deliveries_days:
        print(
            f"channel deliveries: {verb} {done.deliveries} delivery ids older than "
            f"{done.deliveries_days:g} days (kept at least 7 days for Meta's redelivery)"
        )
    return 0
