"""The Postgres and Redis servers a test session uses.

:func:`postgres_url` and :func:`redis_url` decide once per process, in this order:

1. ``SIGNOFF_TEST_DATABASE_URL`` / ``SIGNOFF_TEST_REDIS_URL`` when set (used as given);
2. the machine's services — ``postgresql://postgres@127.0.0.1:5432/test`` (then user
   ``root``) and ``redis://127.0.0.1:6379/0`` — when they answer within 1 s;
3. private embedded servers (:mod:`signoff.embedded`) on free ports, kept under
   ``/tmp/signoff-test-<uid>/slot-<n>``. A slot is held with an exclusive ``flock`` for
   the life of the process, so parallel test processes never share a cluster while a
   later run reuses a warm one. The servers stop at exit (and die with the process if
   it is killed). Their URLs carry the passwords kept in the slot (a slot made by an
   older version, with trust authentication, is converted on its next start).

The choice is printed to stderr once per service.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import os
import socket
import stat
import sys
import threading
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import asyncpg

from signoff import embedded

DATABASE_ENV = "SIGNOFF_TEST_DATABASE_URL"
REDIS_ENV = "SIGNOFF_TEST_REDIS_URL"
MACHINE_POSTGRES = (
    "postgresql://postgres@127.0.0.1:5432/test",
    "postgresql://root@127.0.0.1:5432/test",
)
MACHINE_REDIS = "redis://127.0.0.1:6379/0"
EMBEDDED_DATABASE = "test"
PROBE_TIMEOUT = 1.0

_lock = threading.RLock()
_urls: dict[str, str] = {}
_servers: list[embedded.EmbeddedServer] = []
_slot: tuple[Path, IO[bytes]] | None = None


def postgres_url() -> str:
    """A Postgres URL for this test process (chosen once, then cached)."""
    with _lock:
        if "postgres" not in _urls:
            _urls["postgres"] = _choose_postgres()
        return _urls["postgres"]


def redis_url() -> str:
    """A Redis URL for this test process (chosen once, then cached)."""
    with _lock:
        if "redis" not in _urls:
            _urls["redis"] = _choose_redis()
        return _urls["redis"]


def _choose_postgres() -> str:
    url = os.environ.get(DATABASE_ENV)
    if url:
        return _announce("postgres", url, f"from ${DATABASE_ENV}")
    for url in MACHINE_POSTGRES:
        if _postgres_answers(url):
            return _announce("postgres", url, "the machine's service")
    server = embedded.start_postgres(_slot_dir(), database=EMBEDDED_DATABASE)
    _servers.append(server)
    return _announce("postgres", server.url, f"embedded, pid {server.pid}, {_slot_dir()}")


def _choose_redis() -> str:
    url = os.environ.get(REDIS_ENV)
    if url:
        return _announce("redis", url, f"from ${REDIS_ENV}")
    if _redis_answers(MACHINE_REDIS):
        return _announce("redis", MACHINE_REDIS, "the machine's service")
    server = embedded.start_valkey(_slot_dir())
    _servers.append(server)
    return _announce("redis", server.url, f"embedded valkey, pid {server.pid}, {_slot_dir()}")


def _announce(service: str, url: str, how: str) -> str:
    shown = embedded.redacted(url)
    print(f"signoff tests: {service} = {shown} ({how})", file=sys.stderr, flush=True)
    return url


def _postgres_answers(url: str) -> bool:
    async def probe() -> bool:
        try:
            connection = await asyncpg.connect(url, timeout=PROBE_TIMEOUT)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        try:
            return bool(await connection.fetchval("SELECT 1", timeout=PROBE_TIMEOUT) == 1)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        finally:
            await connection.close(timeout=PROBE_TIMEOUT)

    # A thread of its own, so this works from inside a running event loop too.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, probe()).result()


def _redis_answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 6379), timeout=PROBE_TIMEOUT
        ) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _slot_dir() -> Path:
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
            return _slot[0]
        raise RuntimeError(f"all 64 embedded-server slots under {base} are in use")
