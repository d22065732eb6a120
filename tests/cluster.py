"""Real multi-process signoff for tests: N `signoff gateway` and M `signoff worker`
processes on one Postgres database and one Redis, with the offline demo model."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from signoff.embedded import free_port
from signoff.gateway.auth import Tokens

SECRET = "cluster-secret-" + "y" * 40


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    port: int = 0

    def start(self) -> None:
        self.log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv, env=self.env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        assert self.popen is not None
        return self.popen.wait(timeout)

    def stop(self) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.wait(20)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.wait(10)
        if self.log is not None:
            self.log.close()
            self.log = None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Cluster:
    database_url: str
    redis_url: str
    workdir: Path
    tenant: str = field(default_factory=lambda: "c-" + secrets.token_hex(4))
    prefix: str = field(default_factory=lambda: f"so-{secrets.token_hex(4)}:")
    env_extra: dict[str, str] = field(default_factory=dict)
    gateways: list[Proc] = field(default_factory=list)
    workers: list[Proc] = field(default_factory=list)
    tokens: Tokens = field(default_factory=lambda: Tokens(SECRET))

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}
        env.update(
            {
                "SIGNOFF_DATABASE_URL": self.database_url,
                "SIGNOFF_REDIS_URL": self.redis_url,
                "SIGNOFF_SECRET": SECRET,
                "SIGNOFF_KEY_PREFIX": self.prefix,
                "SIGNOFF_TENANT": self.tenant,
                "SIGNOFF_OFFLINE_MODEL": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env_extra)
        env.update(extra)
        return env

    def add_gateway(self, **extra: str) -> Proc:
        port = free_port()
        n = len(self.gateways)
        proc = Proc(
            f"gw{n}",
            [sys.executable, "-m", "signoff", "gateway", "--port", str(port)],
            self.env(**extra),
            self.workdir / f"gw{n}.log",
            port=port,
        )
        proc.start()
        self.gateways.append(proc)
        self._wait(lambda: _healthy(proc), proc, "gateway /readyz")
        return proc

    def add_worker(self, worker_id: str | None = None, **extra: str) -> Proc:
        n = len(self.workers)
        wid = worker_id or f"wk{n}-{secrets.token_hex(2)}"
        proc = Proc(
            wid,
            [sys.executable, "-m", "signoff", "worker"],
            self.env(SIGNOFF_WORKER_ID=wid, **extra),
            self.workdir / f"{wid}.log",
        )
        proc.start()
        self.workers.append(proc)
        self._wait(lambda: "running" in proc.output(), proc, "worker start")
        return proc

    def _wait(self, ok: object, proc: Proc, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if callable(ok) and ok():
                return
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited during {what}:\n{proc.output()}")
            time.sleep(0.05)
        raise AssertionError(f"{proc.name}: {what} timed out:\n{proc.output()}")

    def token(self, user: str) -> str:
        return self.tokens.issue(user, self.tenant)

    def stop(self) -> None:
        threads = [threading.Thread(target=p.stop) for p in self.gateways + self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _healthy(proc: Proc) -> bool:
    try:
        return httpx.get(proc.url + "/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def cluster(
    database_url: str,
    redis_url: str,
    workdir: Path,
    *,
    gateways: int = 2,
    workers: int = 2,
    **env: str,
) -> Iterator[Cluster]:
    c = Cluster(database_url=database_url, redis_url=redis_url, workdir=workdir, env_extra=env)
    try:
        for _ in range(workers):
            c.add_worker()
        for _ in range(gateways):
            c.add_gateway()
        yield c
    finally:
        c.stop()
