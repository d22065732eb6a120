"""signoff as separate processes: N ``signoff gateway`` and M ``signoff worker`` on one
Postgres database and one Redis, for multi-process tests and benchmarks.

::

    with cluster(database_url, redis_url, tmp_path, gateways=2, workers=2) as c:
        token = c.token("alice")
        httpx.post(c.gateways[0].url + "/v1/threads", headers=...)

Every process is started with the parent-death signal (``PR_SET_PDEATHSIG=SIGKILL`` on
Linux, the same mechanism as the embedded servers'): if the test or bench process dies,
even by ``kill -9``, its gateways and workers die with it. Each process writes its
output to ``workdir/<name>.log`` (:meth:`Proc.output`).

``app`` (``module:attribute``) is handed to the processes as ``SIGNOFF_APP``; by default
they serve the demo with the offline model (``SIGNOFF_OFFLINE_MODEL=1``). Workers serve
``/metrics`` on a port of their own (:attr:`Proc.metrics_port`; gateways too), read by
:meth:`Cluster.scrape`, :meth:`Cluster.worker_gauge` and the decision-latency helpers.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from signoff.gateway.auth import Tokens
from signoff.testing.servers import free_port, popen_with_parent

__all__ = ["SECRET", "Cluster", "ClusterError", "Proc", "cluster"]

SECRET = "cluster-secret-" + "y" * 40  # the default token signing key of a cluster
START_TIMEOUT = 60.0
_PAGE = os.sysconf("SC_PAGE_SIZE")
# Local traffic only: a proxy configured for the outside world must not see it.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ClusterError(AssertionError):
    """A process of the cluster exited or did not get ready in time (its log attached)."""


@dataclass
class Proc:
    """One child process (a gateway or a worker)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    port: int = 0
    metrics_port: int = 0
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    def start(self) -> None:
        self.log = self.log_path.open("ab")
        self.popen = popen_with_parent(self.argv, env=self.env, stdout=self.log, cwd=self.cwd)

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was not started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        assert self.popen is not None, f"{self.name} was not started"
        return self.popen.wait(timeout)

    def stop(self) -> None:
        """SIGTERM (a graceful drain), SIGKILL after 20 s; closes the log."""
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

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def rss(self) -> int:
        """Resident memory in bytes."""
        with open(f"/proc/{self.pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE


DEMO = "signoff.demo:app"


@dataclass
class Cluster:
    """Gateways and workers of one tenant and one Redis key prefix (both fresh by default)."""

    database_url: str
    redis_url: str
    workdir: Path
    tenant: str = field(default_factory=lambda: "c-" + secrets.token_hex(4))
    prefix: str = field(default_factory=lambda: f"so-{secrets.token_hex(4)}:")
    env_extra: dict[str, str] = field(default_factory=dict)
    secret: str = SECRET
    app: str | None = DEMO  # what every process serves (SIGNOFF_APP)
    cwd: Path | None = None
    gateways: list[Proc] = field(default_factory=list)
    workers: list[Proc] = field(default_factory=list)
    tokens: Tokens = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = Tokens(self.secret)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        """A process's environment: this one's minus signoff, Anthropic and proxy settings,
        plus the cluster's."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SIGNOFF_", "ANTHROPIC")) and "proxy" not in k.lower()
        }
        env.update(
            {
                "SIGNOFF_DATABASE_URL": self.database_url,
                "SIGNOFF_REDIS_URL": self.redis_url,
                "SIGNOFF_SECRET": self.secret,
                "SIGNOFF_KEY_PREFIX": self.prefix,
                "SIGNOFF_TENANT": self.tenant,
                "SIGNOFF_OFFLINE_MODEL": "1",
                # No load balancer has to see /readyz fail before a stopping gateway
                # closes (2 s by default): a test that wants the delay sets it.
                "SIGNOFF_DRAIN_SECONDS": "0",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.app is not None:
            env["SIGNOFF_APP"] = self.app
        env.update(self.env_extra)
        env.update(extra)
        return env

    def add_gateway(self, wait: bool = True, **extra: str) -> Proc:
        """Start ``signoff gateway`` on a free port; with ``wait``, until ``/readyz`` is 200."""
        port = free_port()
        mport = free_port()
        n = len(self.gateways)
        proc = Proc(
            f"gw{n}",
            [sys.executable, "-m", "signoff", "gateway", "--port", str(port)],
            self.env(SIGNOFF_METRICS_PORT=str(mport), **extra),
            self.workdir / f"gw{n}-{port}.log",
            port=port,
            metrics_port=mport,
            cwd=self.cwd,
        )
        proc.start()
        self.gateways.append(proc)
        if wait:
            self.wait_ready(proc)
        return proc

    def add_worker(self, worker_id: str | None = None, wait: bool = True, **extra: str) -> Proc:
        """Start ``signoff worker``; with ``wait``, until it reports running."""
        n = len(self.workers)
        wid = worker_id or f"wk{n}-{secrets.token_hex(2)}"
        mport = free_port()
        proc = Proc(
            wid,
            [sys.executable, "-m", "signoff", "worker"],
            self.env(SIGNOFF_WORKER_ID=wid, SIGNOFF_METRICS_PORT=str(mport), **extra),
            self.workdir / f"{wid}.log",
            metrics_port=mport,
            cwd=self.cwd,
        )
        proc.start()
        self.workers.append(proc)
        if wait:
            self.wait_ready(proc)
        return proc

    def launch(self, *, gateways: int, workers: int) -> None:
        """Start workers and gateways at once, then wait until every one is ready."""
        for _ in range(workers):
            self.add_worker(wait=False)
        for _ in range(gateways):
            self.add_gateway(wait=False)
        for p in self.workers + self.gateways:
            self.wait_ready(p)

    def wait_ready(self, proc: Proc, timeout: float = START_TIMEOUT) -> None:
        """Wait until a gateway answers ``/readyz`` or a worker logged that it runs."""
        if proc.port:
            self._wait(
                lambda: _status(proc.url + "/readyz") == 200, proc, "gateway /readyz", timeout
            )
        else:
            self._wait(lambda: "running" in proc.output(), proc, "worker start", timeout)

    def _wait(self, ok: Callable[[], bool], proc: Proc, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            if not proc.alive():
                raise ClusterError(f"{proc.name} exited during {what}:\n{proc.output()[-3000:]}")
            time.sleep(0.05)
        raise ClusterError(f"{proc.name}: {what} timed out:\n{proc.output()[-3000:]}")

    def token(self, user: str) -> str:
        """A bearer token for ``user`` in the cluster's tenant."""
        return self.tokens.issue(user, self.tenant)

    def pids(self) -> list[int]:
        """The process ids of every started gateway and worker."""
        return [p.pid for p in self.gateways + self.workers if p.popen is not None]

    def stop(self) -> None:
        """Stop every process at once (each: SIGTERM, then SIGKILL)."""
        threads = [threading.Thread(target=p.stop) for p in self.gateways + self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # -- the workers' own records (their /metrics port) ----------------------------------

    def latency_counts(self, what: str = "decision") -> dict[str, int]:
        """Per live worker: how many decision-latency samples it has recorded so far
        (``what="workflow"``: resume/event -> the holder claimed the run)."""
        out = {}
        for w in self._live_workers():
            data = _json(f"{_metrics(w)}/{what}-latency?after=1e18")
            out[w.name] = int(data["count"])
        return out

    def latency_samples(self, after: dict[str, int], what: str = "decision") -> list[int]:
        """Decision (or ``what="workflow"``) latency samples (ns) the workers recorded
        after the given counts."""
        samples: list[int] = []
        for w in self._live_workers():
            data = _json(f"{_metrics(w)}/{what}-latency?after={after.get(w.name, 0)}")
            samples += data["samples_ns"]
        return samples

    def worker_gauge(self, name: str) -> float:
        """Sum of one gauge over the live workers' ``/metrics``."""
        total = 0.0
        for w in self._live_workers():
            for line in _get(_metrics(w)).decode().splitlines():
                if line.startswith(name + " "):
                    total += float(line.split()[1])
        return total

    def scrape(self, proc: Proc) -> str:
        """A gateway's or worker's ``/metrics`` (its metrics port), as text."""
        return _get(_metrics(proc)).decode()

    def steps_in_flight(self) -> int:
        """Continuations holding a step slot now, over the live workers."""
        return int(self.worker_gauge("signoff_steps_in_flight"))

    def worker_tasks(self) -> int:
        """Turns, continuations and hints running or waiting to, over the live workers
        (0: every worker is idle)."""
        return int(self.worker_gauge("signoff_worker_tasks"))

    def _live_workers(self) -> list[Proc]:
        return [w for w in self.workers if w.alive()]


def _metrics(worker: Proc) -> str:
    return f"http://127.0.0.1:{worker.metrics_port}/metrics"


def _get(url: str, timeout: float = 5) -> bytes:
    with _NO_PROXY.open(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def _json(url: str) -> Any:
    return json.loads(_get(url))


def _status(url: str) -> int:
    try:
        with _NO_PROXY.open(url, timeout=1) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return 0


@contextmanager
def cluster(
    database_url: str,
    redis_url: str,
    workdir: Path,
    *,
    gateways: int = 2,
    workers: int = 2,
    app: str | None = DEMO,
    secret: str = SECRET,
    cwd: Path | None = None,
    **env: str,
) -> Iterator[Cluster]:
    """A started cluster (all processes ready), stopped at the end. ``env``: extra
    ``SIGNOFF_*`` settings for every process."""
    c = Cluster(
        database_url=database_url,
        redis_url=redis_url,
        workdir=workdir,
        env_extra=env,
        secret=secret,
        app=app,
        cwd=cwd,
    )
    try:
        c.launch(gateways=gateways, workers=workers)
        yield c
    finally:
        c.stop()
