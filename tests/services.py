"""The Postgres and Redis servers a test session uses.

:func:`postgres_url` and :func:`redis_url` decide once per process, in this order:

1. ``SIGNOFF_TEST_DATABASE_URL`` / ``SIGNOFF_TEST_REDIS_URL`` when set (used as given);
2. the machine's services — ``postgresql://postgres@127.0.0.1:5432/test`` (then user
   ``root``) and ``redis://127.0.0.1:6379/0`` — when they answer within 1 s;
3. private embedded servers (:mod:`signoff.testing.servers`, the same ones a user's suite
   gets) on free ports, kept under ``/tmp/signoff-test-<uid>/slot-<n>``. A slot is held
   with an exclusive ``flock`` for the life of the process, so parallel test processes
   never share a cluster while a later run reuses a warm one. The servers stop at exit
   (and die with the process if it is killed). Their URLs carry the passwords kept in
   the slot (a slot made by an older version, with trust authentication, is converted on
   its next start).

The choice is printed to stderr once per service.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import sys
import threading
from urllib.parse import urlsplit

import asyncpg

from signoff.testing import servers

DATABASE_ENV = servers.DATABASE_ENV
REDIS_ENV = servers.REDIS_ENV
MACHINE_POSTGRES = (
    "postgresql://postgres@127.0.0.1:5432/test",
    "postgresql://root@127.0.0.1:5432/test",
)
MACHINE_REDIS = "redis://127.0.0.1:6379/0"
PROBE_TIMEOUT = 1.0

_lock = threading.RLock()
_urls: dict[str, str] = {}


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
    server = servers.embedded_postgres()
    return _announce("postgres", server.url, f"embedded, pid {server.pid}, {servers.slot_dir()}")


def _choose_redis() -> str:
    url = os.environ.get(REDIS_ENV)
    if url:
        return _announce("redis", url, f"from ${REDIS_ENV}")
    if _redis_answers(MACHINE_REDIS):
        return _announce("redis", MACHINE_REDIS, "the machine's service")
    server = servers.embedded_valkey()
    return _announce(
        "redis", server.url, f"embedded valkey, pid {server.pid}, {servers.slot_dir()}"
    )


def _announce(service: str, url: str, how: str) -> str:
    shown = servers.redacted(url)
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
