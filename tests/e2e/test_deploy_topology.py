"""deploy/compose.yml's topology as local processes: its one-shot migration on an empty
database, then its two gateways and two workers, each with the command and environment
the file gives it (merges resolved); only the hosts and ports are this machine's (and a
fresh Redis key prefix, to share the test server). A card proposed through one gateway
is approved through the other and executed."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from signoff.embedded import free_port
from signoff.gateway.auth import Tokens
from signoff.testing.cluster import Proc
from tests import deploy, services
from tests.conftest import drop_database, fresh_database

pytestmark = pytest.mark.timeout(180)

COMPOSE_DATABASE = "postgresql://signoff:signoff@postgres:5432/signoff"
COMPOSE_REDIS = "redis://redis:6379/0"


def local(p: deploy.Process, database_url: str, prefix: str, workdir: Path) -> Proc:
    """The compose service as a process here: same command, same variables, but this
    machine's Postgres/Redis, 127.0.0.1 and free ports."""
    env = dict(p.env)
    assert env["SIGNOFF_DATABASE_URL"] == COMPOSE_DATABASE, p.name
    env["SIGNOFF_DATABASE_URL"] = database_url
    if p.role != "migrate":
        assert env["SIGNOFF_REDIS_URL"] == COMPOSE_REDIS, p.name
    env["SIGNOFF_REDIS_URL"] = services.redis_url()
    env["SIGNOFF_KEY_PREFIX"] = prefix
    env["SIGNOFF_DATA_DIR"] = str(workdir / p.name)
    env["SIGNOFF_METRICS_PORT"] = str(free_port())
    if "SIGNOFF_HOST" in env:
        env["SIGNOFF_HOST"] = "127.0.0.1"
    env["PYTHONUNBUFFERED"] = "1"
    argv = list(p.argv[1:])
    port = 0
    for i, arg in enumerate(argv[:-1]):
        if arg == "--host":
            argv[i + 1] = "127.0.0.1"
        if arg == "--port":
            port = free_port()
            argv[i + 1] = str(port)
    return Proc(
        p.name,
        [sys.executable, "-m", "signoff", *argv],
        {k: v for k, v in _base_env().items()} | env,
        workdir / f"{p.name}.log",
        port=port,
    )


def _base_env() -> dict[str, str]:
    import os

    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SIGNOFF_", "ANTHROPIC")) and "proxy" not in k.lower()
    }


def wait_for(fn: Any, what: str, procs: list[Proc], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        for p in procs:
            assert p.alive(), f"{p.name} exited:\n{p.output()[-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"{what} timed out:\n" + "\n".join(p.output()[-1500:] for p in procs))


@pytest.fixture
def empty_database() -> Iterator[str]:
    url, name = fresh_database("so_deploy")
    yield url
    drop_database(name)


@pytest.mark.slow  # 9 s: every process of deploy/compose.yml started as a local process
def test_the_compose_topology_runs_as_local_processes(empty_database: str, tmp_path: Path) -> None:
    secret = secrets.token_urlsafe(48)
    doc = deploy.compose({"SIGNOFF_APP": "signoff.demo:app", "SIGNOFF_SECRET": secret})
    prefix = f"so-deploy-{secrets.token_hex(4)}:"
    procs = {
        p.name: local(p, empty_database, prefix, tmp_path) for p in deploy.compose_processes(doc)
    }

    migrate = procs.pop("migrate")
    once = subprocess.run(migrate.argv, env=migrate.env, capture_output=True, text=True, timeout=60)
    assert once.returncode == 0, once.stderr
    assert "0001_init" in once.stdout and "0009_retention" in once.stdout

    running = list(procs.values())
    try:
        for p in running:
            p.start()
        gateways = [p for p in running if p.port]
        assert len(gateways) == 2 and len(running) == 4
        for gw in gateways:
            wait_for(lambda gw=gw: _status(gw.url + "/readyz") == 200, f"{gw.name} ready", running)
        for wk in (p for p in running if not p.port):
            wait_for(lambda wk=wk: "running" in wk.output(), f"{wk.name} running", running)

        token = Tokens(secret).issue("demo", "demo")
        headers = {"Authorization": f"Bearer {token}"}
        a, b = (httpx.Client(base_url=gw.url, headers=headers, timeout=10) for gw in gateways)
        with a, b:
            thread = a.post("/v1/threads").json()["thread"]["id"]
            sent = a.post(f"/v1/threads/{thread}/messages", json={"text": "cobre 150 do João"})
            assert sent.status_code == 202, sent.text
            card = wait_for(
                lambda: a.get(f"/v1/threads/{thread}").json()["pending_cards"], "card", running
            )[0]
            r = b.post(
                f"/v1/cards/{card['id']}/resolve",
                json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
            )
            assert r.status_code == 200, r.text
            wait_for(
                lambda: a.get(f"/v1/cards/{card['id']}").json()["card"]["status"] == "executed",
                "executed",
                running,
            )
        again = subprocess.run(
            migrate.argv, env=migrate.env, capture_output=True, text=True, timeout=60
        )
        assert "nothing (up to date)" in again.stdout, again
    finally:
        for p in running:
            p.stop()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0
