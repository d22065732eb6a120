"""Which live process serves which app: gateways and workers of one deployment agree.

Every gateway and worker registers itself at start in Postgres (``app_processes``): its
id, its roles, its app's name and fingerprint (``App.fingerprint``) and each tool's
fingerprint, and renews the row every :data:`BEAT_SECONDS`. A row not renewed for
:data:`LIVE_SECONDS` is a process that is gone. At start, under one advisory lock (so two
processes starting at once see each other), a process refuses to start
(:class:`AppMismatch`) when a live process serves the same app name with another
fingerprint — unless ``SIGNOFF_ALLOW_APP_SKEW`` is set for a rolling deploy: then it
warns and starts. A live process of another app name on the same database is warned
about (runs are adopted by any worker of the database: one database per app).

A worker that meets an approved card of a tool it does not serve hands the run to a
live worker that does (``runtime/worker.py``); the registry answers "who serves it".
See docs/design-notes.md, note 21.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

import msgspec

from signoff.runtime.app import App
from signoff.runtime.errors import AppMismatch, ConfigError

log = logging.getLogger("signoff.presence")

BEAT_SECONDS = 5.0
# A process whose row was not renewed for this long is gone (killed, or partitioned).
LIVE_SECONDS = 3 * BEAT_SECONDS
GATEWAY = "gateway"
WORKER = "worker"


class AppProcess(msgspec.Struct, frozen=True, kw_only=True):
    """One process as registered: what it serves."""

    id: str
    app: str
    fingerprint: str
    tools: dict[str, str]  # tool name -> tool fingerprint
    roles: list[str]
    bus: str = ""  # where its hints and inbox live (bus_identity); "" before migration 0013


class PresenceStore(Protocol):
    async def join_app(
        self,
        process: AppProcess,
        live_seconds: float,
        check: Callable[[list[AppProcess]], None],
    ) -> None:
        """Register ``process`` after ``check`` accepted the other live ones (one
        transaction; nothing is written when ``check`` raises)."""

    async def beat_app(self, process: AppProcess) -> None: ...

    async def leave_app(self, process_id: str) -> None: ...


class Leases(Protocol):
    async def lease_of(self, holder: str) -> tuple[datetime, float] | None: ...


def describe(app: App, process_id: str, roles: list[str], bus: str = "") -> AppProcess:
    return AppProcess(
        id=process_id,
        app=app.name,
        fingerprint=app.fingerprint(),
        tools=app.tool_fingerprints(),
        roles=sorted(roles),
        bus=bus,
    )


_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?$")


def bus_identity(redis_url: str | None, key_prefix: str) -> str:
    """Where a process's inbox and hints live, normalised so that two spellings of one
    bus compare equal: scheme, lower-cased host:port (default 6379; a cluster's seeds
    sorted), database (``/N`` or ``?db=N``, default 0) and key prefix. Never credentials:
    a URL whose host part does not parse (a password with an unescaped ``#``, ``?`` or
    ``/``) is named ``<unparsed>``. ``in-process`` (one process on its own) names the
    process too, so two of them on one database are told apart."""
    if not redis_url:
        return f"in-process {socket.gethostname()}:{os.getpid()} prefix {key_prefix}"
    scheme, sep, rest = redis_url.partition("://")
    scheme = scheme.lower()
    if not sep:
        return f"<unparsed> prefix {key_prefix}"
    parts = urlsplit(redis_url)
    query = parse_qs(parts.query)
    if "@" in rest and "@" not in parts.netloc:  # the credentials split the URL elsewhere
        return f"{scheme}://<unparsed> prefix {key_prefix}"
    if scheme == "unix":  # the database comes only from ?db= (as redis-py reads it)
        db = (query.get("db") or ["0"])[0]
        db = db if db.isdigit() else "<unparsed>"
        return f"unix://{parts.path or '<unparsed>'} db {db} prefix {key_prefix}"
    db = (query.get("db") or [""])[0] or parts.path.strip("/") or "0"
    hosts = []
    for item in (parts.netloc.rpartition("@")[2] or "localhost").split(","):
        m = _HOST.match(item)
        if m is None:
            return f"{scheme}://<unparsed> prefix {key_prefix}"
        hosts.append(f"{m.group(1).lower()}:{int(m.group(2) or 6379)}")
    if not db.isdigit():
        db = "<unparsed>"
    return f"{scheme}://{','.join(sorted(hosts))}/{db} prefix {key_prefix}"


def differences(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """How two processes' tools differ, as short phrases."""
    out = [f"{n} differs" for n in sorted(set(mine) & set(theirs)) if mine[n] != theirs[n]]
    out += [f"{n} only here" for n in sorted(set(mine) - set(theirs))]
    out += [f"{n} only there" for n in sorted(set(theirs) - set(mine))]
    return out


def check_peers(me: AppProcess, peers: list[AppProcess], *, allow_skew: bool) -> list[str]:
    """Raise :class:`AppMismatch` when a live peer serves another version of this app
    (unless ``allow_skew``); returns the warnings to log."""
    warnings: list[str] = []
    others = sorted({p.app for p in peers if p.app != me.app})
    if others:
        warnings.append(
            f"live processes on this database serve other apps ({', '.join(others)}): "
            "workers adopt any app's runs; give each app its own database"
        )
    apart = sorted(
        {p.bus for p in peers if p.app == me.app and p.bus and me.bus and p.bus != me.bus}
    )
    if apart:
        warnings.append(
            f"live processes of app {me.app!r} use another bus ({'; '.join(apart)}) than "
            f"this one ({me.bus}): messages a gateway accepts reach only workers on its "
            "own bus; give them the same SIGNOFF_REDIS_URL and SIGNOFF_KEY_PREFIX"
        )
    skewed = [p for p in peers if p.app == me.app and p.fingerprint != me.fingerprint]
    if not skewed:
        return warnings
    detail = "; ".join(
        f"{'+'.join(p.roles)} {p.id}: {', '.join(differences(me.tools, p.tools)) or 'same tools'}"
        for p in skewed[:3]
    )
    more = f" (and {len(skewed) - 3} more)" if len(skewed) > 3 else ""
    text = (
        f"app {me.app!r} {me.fingerprint} differs from what live processes on this database "
        f"serve — {detail}{more}"
    )
    if not allow_skew:
        raise AppMismatch(
            text + ". Deploy one version of the app to every gateway and worker, or set "
            "SIGNOFF_ALLOW_APP_SKEW=1 during a rolling deploy (a process killed less than "
            f"{LIVE_SECONDS:.0f}s ago still counts as live)",
            app=me.app,
            fingerprint=me.fingerprint,
        )
    warnings.append(text + " (allowed: SIGNOFF_ALLOW_APP_SKEW)")
    return warnings


async def join(store: PresenceStore, me: AppProcess, *, allow_skew: bool) -> None:
    def check(peers: list[AppProcess]) -> None:
        for warning in check_peers(me, peers, allow_skew=allow_skew):
            log.warning("%s", warning)

    await store.join_app(me, LIVE_SECONDS, check)


async def _beat(store: PresenceStore, me: AppProcess) -> None:
    while True:
        await asyncio.sleep(BEAT_SECONDS)
        try:
            await store.beat_app(me)
        except Exception as exc:  # the store away: the next beat tries again
            log.warning("app presence not renewed: %s", exc)


@asynccontextmanager
async def present(
    store: PresenceStore,
    app: App,
    process_id: str,
    roles: list[str],
    *,
    allow_skew: bool,
    bus: str = "",
) -> AsyncIterator[AppProcess]:
    """Registered (or refused) for the duration of the block; the row goes at the end."""
    me = describe(app, process_id, roles, bus)
    await join(store, me, allow_skew=allow_skew)
    beat = asyncio.create_task(_beat(store, me), name="signoff-presence")
    try:
        yield me
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
        with contextlib.suppress(Exception):
            await store.leave_app(me.id)


async def sole_worker(store: Leases, worker_id: str, watch: float, grace: float = 0.5) -> None:
    """A worker id is one process's (``SIGNOFF_WORKER_ID``): two processes under one id
    would both hold its runs and step them at once. A live lease under this id is watched
    for ``watch`` seconds (two of a worker's renewal intervals) or until it lapses: renewed
    meanwhile, it is a live process's, and this one refuses to start
    (:class:`ConfigError`); not renewed, it was a crashed predecessor's, and this one
    takes the id (and its runs) over."""
    lease = await store.lease_of(worker_id)
    if lease is None or lease[1] <= 0:
        return
    until, left = lease
    log.warning(
        "worker id %s has a live lease for %.1fs more: watching it for %.1fs (a live "
        "process renewing it would make this one refuse to start)",
        worker_id,
        left,
        min(left, watch),
    )
    await asyncio.sleep(min(left, watch) + grace)
    again = await store.lease_of(worker_id)
    if again is not None and again[0] > until:
        raise ConfigError(
            f"worker id {worker_id!r} is in use by a live worker (its lease was renewed "
            "while this one waited): give each worker its own SIGNOFF_WORKER_ID"
        )
