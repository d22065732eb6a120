"""Server child processes: spawned so they die with us, waited for, stopped in order.

Shared by :mod:`signoff.embedded.postgres` and :mod:`signoff.embedded.valkey`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import importlib.util
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

from signoff.runtime.errors import ConfigError
from signoff.runtime.secret_file import read_or_create

HOST = "127.0.0.1"
START_TIMEOUT = 30.0
_PASSWORD = re.compile(r"[A-Za-z0-9_.~-]{16,}")  # nothing to quote in a URL, SQL or config
_PORT_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1


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
            terminate(self._process, self._stop_signal, timeout)

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedServer {self.name} pid={self.pid} {redacted(self.url)} {state}>"


def terminate(process: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int


def start_with_retries(port: int | None, launch: Callable[[int], EmbeddedServer]) -> EmbeddedServer:
    """Launch on ``port``; with an automatic port, retry when another process grabbed it."""
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    for attempt in range(attempts):
        chosen = port if port is not None else free_port()
        if not port_is_free(chosen):
            if port is not None:
                raise ConfigError(f"port {chosen} on {HOST} is already in use", port=chosen)
            continue
        try:
            return launch(chosen)
        except PortTaken:
            if attempt + 1 == attempts:
                break
    raise ConfigError(f"could not find a free port on {HOST} after {attempts} attempts")


class PortTaken(Exception):
    pass


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def wait_ready(
    server: EmbeddedServer, process: subprocess.Popen[bytes], ready: Callable[[], bool]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    delay = 0.005
    while True:
        rc = process.poll()
        if rc is not None:
            server.stop()
            tail = log_tail(server.log_path)
            if "Address already in use" in tail:
                raise PortTaken
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
                f"{START_TIMEOUT:.0f} s; log {server.log_path}:\n{log_tail(server.log_path)}",
                log=str(server.log_path),
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.1)


def clean_env() -> dict[str, str]:
    """The caller's environment without libpq/Postgres variables that would redirect tools."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def make_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def read_password(path: Path) -> tuple[str, bool]:
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
def open_log(path: Path) -> Iterator[IO[bytes]]:
    # Holds the last start's output. Truncate, then append (O_APPEND), so a server still
    # writing to an older descriptor never leaves a hole in the file.
    path.write_bytes(b"")
    with open(path, "ab") as log:
        yield log


def log_tail(path: Path, limit: int = 4000) -> str:
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
def package_dir(name: str) -> Path:
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


def spawn(
    argv: list[str],
    *,
    log: IO[bytes],
    cwd: Path,
    run_as: Account | None,
    stdin: bytes | None = None,
) -> subprocess.Popen[bytes]:
    def create() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=clean_env(),
            close_fds=True,
            start_new_session=True,
            preexec_fn=_parent_death_hook(),
            user=None if run_as is None else run_as.uid,
            group=None if run_as is None else run_as.gid,
            extra_groups=None if run_as is None else [],
        )

    process = _from_long_lived_thread(create)
    if process.stdin is not None:
        # A child that died before reading is reported by wait_ready, with its log.
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
            # Its own session: a Ctrl-C at the terminal goes to this process, which stops
            # its children in order (they died first and the tests using them failed).
            start_new_session=True,
            preexec_fn=_parent_death_hook(),
        )

    return _from_long_lived_thread(create)


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
