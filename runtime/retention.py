"""Retention: old threads deleted with everything in them, per tenant (design note 28).

A thread is the unit: it is prunable when it was created and last written to more than
the tenant's retention ago and nothing in it is live (no active run; no card pending,
approved or executing). Deleting it deletes its messages, runs, cards and their audit;
the audit of every card that reached the provider (executed or failed) is first appended
to a JSONL file in the archive folder and synced to disk (at least once: a batch retried
after a lost race writes its lines again; card ids are unique, so a reader dedupes).

The WhatsApp channel's bookkeeping goes with it: finished ``wa_outbound`` rows (sent,
failed, skipped; never one still claimed) of each rule's tenants once older than the
rule, and ``deliveries`` (inbound message ids, no tenant) once older than the policy's
longest rule and never younger than Meta's 7 days of redelivery.

``signoff prune`` runs it by hand (``--dry-run`` counts); workers run it every
``retention_interval_seconds``, one at a time (``RetentionStore.exclusive``). Each batch
is its own transaction, so a prune killed half-way is finished by the next one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import msgspec

from signoff.runtime.config import Settings, data_path
from signoff.runtime.errors import ConfigError, SignoffError
from signoff.runtime.faults import Faults
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.records import PruneCounts, PruneReport

log = logging.getLogger("signoff.retention")

DAY = 86_400.0
DEFAULT_RULE = "*"  # the label of the rule for every tenant without one of its own
# Meta redelivers an unacknowledged webhook for up to about 7 days; a delivery id
# forgotten sooner would let a late redelivery be handled twice (a second model turn, a
# second reply). Delivery ids are kept at least this long whatever the rules say.
DELIVERY_DEDUP_SECONDS = 7 * DAY


class ArchiveFailed(SignoffError):
    """The audit could not be written to the archive folder: the batch is rolled back."""

    code = "archive_failed"


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """Days to keep a quiet thread: ``default_days`` for every tenant, ``tenants`` for
    those with a rule of their own. 0 keeps forever."""

    default_days: float = 0.0
    tenants: dict[str, float] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        return cls.parse(settings.retention_days, settings.retention_tenants)

    @classmethod
    def parse(cls, default_days: float, tenant_rules: tuple[str, ...] | list[str]) -> Policy:
        """``tenant_rules``: ``"tenant=days"`` items (``SIGNOFF_RETENTION_TENANTS``)."""
        tenants: dict[str, float] = {}
        for item in tenant_rules:
            tenant, sep, days = item.partition("=")
            try:
                value = float(days)
            except ValueError:
                value = -1.0
            if not sep or not tenant.strip() or value < 0:
                raise ConfigError(
                    f"bad retention rule {item!r}: expected tenant=days (days >= 0, e.g. acme=30)"
                )
            tenants[tenant.strip()] = value
        if default_days < 0:
            raise ConfigError(f"retention days must be >= 0, not {default_days}")
        return cls(default_days=default_days, tenants=tenants)

    def rules(self, only: str | None = None) -> list[tuple[str | None, float]]:
        """(tenant or None for the default rule, seconds) for every rule that deletes;
        ``only``: that tenant's rule alone."""
        if only is not None:
            days = self.tenants.get(only, self.default_days)
            return [(only, days * DAY)] if days > 0 else []
        found: list[tuple[str | None, float]] = [
            (tenant, days * DAY) for tenant, days in sorted(self.tenants.items()) if days > 0
        ]
        if self.default_days > 0:
            found.append((None, self.default_days * DAY))
        return found

    @property
    def enabled(self) -> bool:
        return bool(self.rules())


class RetentionStore(Protocol):
    """What retention needs of the store (``store/retention.py``)."""

    async def dry_run(
        self, tenant: str | None, older_than_seconds: float, exclude: list[str]
    ) -> PruneCounts: ...

    async def prune_batch(
        self,
        tenant: str | None,
        older_than_seconds: float,
        exclude: list[str],
        limit: int,
        archive: Callable[[list[dict[str, Any]]], Awaitable[None]],
    ) -> tuple[PruneCounts, int]: ...

    async def prune_outbound(
        self, tenant: str | None, older_than_seconds: float, exclude: list[str], limit: int
    ) -> int: ...

    async def count_outbound(
        self, tenant: str | None, older_than_seconds: float, exclude: list[str]
    ) -> int: ...

    async def prune_deliveries(self, older_than_seconds: float, limit: int) -> int: ...

    async def count_deliveries(self, older_than_seconds: float) -> int: ...

    def exclusive(self, lease_seconds: float = 300.0) -> AbstractAsyncContextManager[bool]: ...


def archive_dir(settings: Settings) -> Path:
    """Where the audit of pruned cards goes: ``SIGNOFF_RETENTION_ARCHIVE_DIR`` or
    ``<data_dir>/audit``."""
    if settings.retention_archive_dir:
        return Path(settings.retention_archive_dir).resolve()
    return data_path(settings) / "audit"


_enc = msgspec.json.Encoder()


class JsonlArchive:
    """Appends audit rows, one JSON object a line, to ``<folder>/audit-YYYY-MM-DD.jsonl``
    (UTC date of the prune; mode 0600), synced to disk before it returns."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.written = 0

    def path(self) -> Path:
        return self.folder / f"audit-{datetime.now(UTC):%Y-%m-%d}.jsonl"

    async def __call__(self, rows: list[dict[str, Any]]) -> None:
        try:
            await asyncio.to_thread(self._write, rows)
        except OSError as exc:
            raise ArchiveFailed(
                f"cannot write the audit to {self.folder} ({exc}); nothing was deleted"
            ) from exc
        self.written += len(rows)

    def _write(self, rows: list[dict[str, Any]]) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = b"".join(_enc.encode(row) + b"\n" for row in rows)
        fd = os.open(self.path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)


async def _drain(batch: Callable[[], Awaitable[int]], size: int) -> int:
    """Run a batch (one statement deleting at most ``size`` rows) until one comes back
    short; how many went in all."""
    total = 0
    while True:
        gone = await batch()
        total += gone
        if gone < size:
            return total


def deliveries_window(policy: Policy) -> float:
    """Seconds a channel delivery id is kept: ``deliveries`` carries no tenant, so the
    policy's longest deleting rule applies to all of them, and never less than Meta's
    redelivery period (:data:`DELIVERY_DEDUP_SECONDS`). 0: the policy deletes nothing."""
    rules = policy.rules()
    if not rules:
        return 0.0
    return max(max(seconds for _, seconds in rules), DELIVERY_DEDUP_SECONDS)


async def prune(
    store: RetentionStore,
    policy: Policy,
    *,
    archive: Callable[[list[dict[str, Any]]], Awaitable[None]],
    batch: int = 200,
    dry_run: bool = False,
    only: str | None = None,
    faults: Faults | None = None,
) -> PruneReport:
    """Apply every rule of ``policy`` (or ``only`` that tenant's) until nothing is left to
    prune; what was deleted (dry: would be), by rule (tenant, or ``*`` for the default).

    Each rule deletes its quiet threads, then its tenants' finished WhatsApp outbound rows
    older than the rule. Channel delivery ids (no tenant) go last, once for the whole
    policy (:func:`deliveries_window`); a prune of ``only`` one tenant leaves them."""
    named = sorted(policy.tenants)
    size = max(batch, 1)
    done: dict[str, PruneCounts] = {}
    for tenant, seconds in policy.rules(only):
        label = tenant or DEFAULT_RULE
        if dry_run:
            counts = await store.dry_run(tenant, seconds, named)
            outbound = await store.count_outbound(tenant, seconds, named)
            done[label] = counts + PruneCounts(wa_outbound=outbound)
            continue
        total = PruneCounts()
        while True:
            counts, picked = await store.prune_batch(tenant, seconds, named, size, archive)
            total += counts
            if counts.threads and faults is not None:
                faults.hit("prune.after_batch")
            if picked < size:
                break
        outbound = await _drain(partial(store.prune_outbound, tenant, seconds, named, size), size)
        done[label] = total + PruneCounts(wa_outbound=outbound)
    keep = deliveries_window(policy) if only is None else 0.0
    deliveries = 0
    if keep:
        if dry_run:
            deliveries = await store.count_deliveries(keep)
        else:
            deliveries = await _drain(partial(store.prune_deliveries, keep, size), size)
    return PruneReport(rules=done, deliveries=deliveries, deliveries_days=keep / DAY)


async def prune_loop(
    store: RetentionStore, settings: Settings, faults: Faults | None = None
) -> None:
    """A worker's scheduled prune: every ``retention_interval_seconds``, if no other
    process is pruning. Errors are logged; the next tick tries again."""
    policy = Policy.from_settings(settings)
    archive = JsonlArchive(archive_dir(settings))
    while True:
        await asyncio.sleep(settings.retention_interval_seconds)
        try:
            lease = max(settings.retention_interval_seconds * 2, 60.0)
            async with store.exclusive(lease) as mine:
                if not mine:
                    continue
                done = await prune(
                    store, policy, archive=archive, batch=settings.retention_batch, faults=faults
                )
            threads = sum(c.threads for c in done.rules.values())
            outbound = sum(c.wa_outbound for c in done.rules.values())
            COUNTERS.inc("signoff_retention_runs_total")
            COUNTERS.inc("signoff_retention_threads_pruned_total", threads)
            if threads or outbound or done.deliveries:
                log.info(
                    "retention: pruned %d threads, %d WhatsApp outbound rows, %d delivery ids (%s)",
                    threads,
                    outbound,
                    done.deliveries,
                    msgspec.to_builtins(done),
                )
        except SignoffError as exc:
            COUNTERS.inc("signoff_retention_failures_total")
            log.warning("retention: prune failed (%s); trying again later", exc)
        except Exception:
            COUNTERS.inc("signoff_retention_failures_total")
            log.exception("retention: prune failed; trying again later")
