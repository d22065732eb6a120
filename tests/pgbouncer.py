"""PgBouncer in front of the test Postgres, in transaction pooling mode.

``SIGNOFF_TEST_PGBOUNCER=1`` makes the test fixtures (``tests/conftest.py``) hand out
database URLs that go through a PgBouncer started here, from Debian's ``pgbouncer``
package (``scripts/test.sh`` installs it when missing), on a free port, in a temporary
folder; it dies with the test process. The store then runs with asyncpg's statement
cache off (PgBouncer < 1.21 keeps no prepared statements across server connections;
design note 32). The same suite runs both ways.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import asyncpg

from signoff.embedded.process import popen_with_parent

ENV = "SIGNOFF_TEST_PGBOUNCER"
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

_lock = threading.Lock()
_running: dict[str, tuple[subprocess.Popen[bytes], int, Path]] = {}


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def statement_cache_size() -> int:
    """asyncpg's statement cache for stores the tests open: 0 through PgBouncer < 1.21."""
    return 0 if enabled() else 100


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(
    server_url: str, *, pool_size: int = 20, port: int | None = None
) -> tuple[subprocess.Popen[bytes], int, Path]:
    """A PgBouncer (transaction pooling) in front of ``server_url``'s host and port."""
    parts = urlsplit(server_url)
    user = parts.username or "postgres"
    root = Path(tempfile.mkdtemp(prefix="signoff-pgbouncer-"))
    port = port or _free_port()
    # Clients are not checked (trust); the password, if any, is PgBouncer's to the server.
    password = unquote(parts.password or "")
    (root / "users.txt").write_text(f'"{user}" "{password}"\n')
    conf = root / "pgbouncer.ini"
    conf.write_text(
        "[databases]\n"
        f"* = host={parts.hostname or '127.0.0.1'} port={parts.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 1000\n"
        "server_reset_query =\nignore_startup_parameters = extra_float_digits\n"
        f"logfile = {root / 'pgbouncer.log'}\npidfile = {root / 'pgbouncer.pid'}\n"
    )
    if os.geteuid() == 0:  # PgBouncer refuses to run as root: -u drops to nobody
        nobody = pwd.getpwnam("nobody")
        for path in (root, *root.iterdir()):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
    argv = [PGBOUNCER, *(["-u", "nobody"] if os.geteuid() == 0 else []), str(conf)]
    log = (root / "stdout.log").open("ab")
    proc = popen_with_parent(argv, env=dict(os.environ), stdout=log, cwd=root)
    log.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited: {(root / 'stdout.log').read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc, port, root
        time.sleep(0.05)
    raise RuntimeError("pgbouncer did not start")


def through(url: str) -> str:
    """``url`` (a database on the test server) rewritten to go through this process's
    PgBouncer, started on first use."""
    parts = urlsplit(url)
    server = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    with _lock:
        if server not in _running:
            _running[server] = start(server)
            atexit.register(_stop, server)
        _, port, _ = _running[server]
    netloc = f"{parts.username or 'postgres'}@127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def revive() -> None:
    """Start again, on the same port, a PgBouncer that died (between tests).

    Debian's PgBouncer (1.18-1.19) aborts on a cancel request whose client went away
    while another cancel was in flight ("FATAL ... disconnect_client(): bad client state:
    0"), which a harness's teardown can cause (its worker's loops are cancelled
    mid-statement, then its pool is closed). Seen twice in CI: every later test then
    failed on a refused port. What it logged is printed; the next test gets a new one."""
    with _lock:
        for server, (proc, port, root) in list(_running.items()):
            if proc.poll() is None:
                continue
            _said(proc, root)
            shutil.rmtree(root, ignore_errors=True)
            _running[server] = start(server, port=port)


def _said(proc: subprocess.Popen[bytes], root: Path) -> None:
    for name in ("stdout.log", "pgbouncer.log"):
        with contextlib.suppress(OSError):
            tail = (root / name).read_text(errors="replace")[-3000:]
            sys.stderr.write(f"pgbouncer exited {proc.returncode} early; {name}:\n{tail}\n")


def direct(url: str) -> str:
    """The same database without PgBouncer (for tests about Postgres sessions themselves:
    server pids, terminated backends)."""
    parts = urlsplit(url)
    for server, (_, port, _) in _running.items():
        if parts.port == port:
            netloc = urlsplit(server).netloc
            return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return url


def _stop(server: str) -> None:
    proc, _, root = _running.pop(server)
    if proc.poll() is not None:
        _said(proc, root)  # it died before the session ended: keep what it said
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
    shutil.rmtree(root, ignore_errors=True)


async def connect(url: str, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect`` with the statement cache this run's fixtures use."""
    conn: asyncpg.Connection = await asyncpg.connect(
        url, statement_cache_size=statement_cache_size(), **kwargs
    )
    return conn


def child_env() -> dict[str, str]:
    """The environment for a signoff process a test starts: none of this process's
    ``SIGNOFF_*`` settings, except the statement cache setting PgBouncer mode needs."""
    keep = {"SIGNOFF_DB_STATEMENT_CACHE_SIZE"}
    return {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_") or k in keep}
