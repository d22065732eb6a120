"""Fixtures of the fault and abuse suite (see docs/guarantees.md).

Profiles: the default one is what CI runs (a few minutes on 2 cores); ``--heavy``
(or ``SIGNOFF_HEAVY=1``) also runs the tests marked ``heavy`` and scales the
others up: more processes, more requests, longer stalls.

    .venv/bin/pytest tests/faults -q -p no:cacheprovider            # CI profile
    .venv/bin/pytest tests/faults -q -p no:cacheprovider --heavy    # by hand

After every test the invariant checker (``tests/faults/invariants.py``) runs over
each tenant the test watched; a test that touched no store is marked ``no_store``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from signoff.embedded import remove_data
from signoff.runtime.config import Settings
from signoff.store.postgres import PostgresStore
from signoff.testing.servers import EmbeddedServer, start_postgres, start_valkey
from tests import services
from tests.cluster import Cluster
from tests.conftest import with_database
from tests.faults.helpers import cluster_pids, signal_all
from tests.faults.invariants import Scope, check

SLACK = 5.0  # scheduling slack on a loaded 2-core machine (as Scope.slack_seconds)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--heavy",
        action="store_true",
        default=False,
        help="fault suite: also run the heavy cases and scale the others up",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "heavy: fault case run only with --heavy")
    config.addinivalue_line("markers", "no_store: fault test that touches no store")


def heavy_enabled(config: pytest.Config) -> bool:
    try:
        flag = bool(config.getoption("--heavy"))
    except ValueError:  # conftest not loaded at start-up (e.g. `pytest tests`)
        flag = False
    return flag or os.environ.get("SIGNOFF_HEAVY") == "1"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("heavy") and not heavy_enabled(item.config):
        pytest.skip("heavy fault case: run with --heavy")


@dataclass(frozen=True)
class Profile:
    heavy: bool
    approvals: int  # concurrent approvals of one card, across gateways
    approval_gateways: int
    stall_seconds: float  # Postgres SIGSTOP
    parked: int  # parked runs in crash/recovery cases
    hypothesis_examples: int


@pytest.fixture(scope="session")
def profile(pytestconfig: pytest.Config) -> Profile:
    if heavy_enabled(pytestconfig):
        return Profile(True, 30_000, 3, 30.0, 100, 600)
    return Profile(False, 10_000, 3, 10.0, 20, 120)


# -- the invariant checker -------------------------------------------------------------


class Invariants:
    """Tenants a test touched; checked at the end of the test and again at teardown."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = []
        self.checked = False

    def watch(
        self,
        database_url: str,
        tenant: str,
        *,
        sweep_seconds: float = 2.0,
        stuck_after_seconds: float = 300.0,
        approved_after_seconds: float | None = None,
        redis_url: str | None = None,
        prefix: str | None = None,
        inbox_idle_seconds: float | None = None,
    ) -> None:
        """Watch one tenant (and, with ``redis_url`` and ``prefix``, its inbox stream).
        Thresholds left out take the runtime's defaults (see ``Scope``)."""
        extra: dict[str, float] = {}
        if approved_after_seconds is not None:
            extra["approved_after_seconds"] = approved_after_seconds
        if inbox_idle_seconds is not None:
            extra["inbox_idle_seconds"] = inbox_idle_seconds
        self.scopes.append(
            Scope(
                database_url,
                tenant,
                sweep_seconds,
                stuck_after_seconds,
                redis_url=redis_url,
                prefix=prefix,
                **extra,
            )
        )

    def watch_cluster(self, c: Cluster, **overrides: Any) -> None:
        """Watch a cluster's tenant and inbox, with thresholds from its settings."""
        settings = Settings()

        def setting(name: str, env: str) -> float:
            return float(c.env_extra.get(env, getattr(settings, name)))

        sweep = setting("sweep_seconds", "SIGNOFF_SWEEP_SECONDS")
        poll = setting("poll_seconds", "SIGNOFF_POLL_SECONDS")
        lease = setting("lease_seconds", "SIGNOFF_LEASE_SECONDS")
        claim_idle = setting("claim_idle_ms", "SIGNOFF_CLAIM_IDLE_MS") / 1000
        args: dict[str, Any] = {
            "sweep_seconds": sweep,
            "stuck_after_seconds": setting("stuck_after_seconds", "SIGNOFF_STUCK_AFTER_SECONDS"),
            # a lost hint waits for the poll; a dead holder's run for its lease and a tick
            "approved_after_seconds": max(poll, lease + 2.0) + sweep + SLACK,
            "redis_url": c.redis_url,
            "prefix": c.prefix,
            # a dead consumer's entry: the claim idle time, then one claim interval
            "inbox_idle_seconds": claim_idle + min(5.0, claim_idle) + SLACK,
        }
        args.update(overrides)
        self.watch(c.database_url, c.tenant, **args)

    async def check(self, *, require_redis: bool = True) -> None:
        """Fail with every violated invariant (call while the system still runs)."""
        self.checked = True
        violations: list[str] = []
        for scope in self.scopes:
            found = await check(scope, require_redis=require_redis)
            violations += [f"[{scope.tenant}] {v}" for v in found]
        assert not violations, "invariants violated:\n  " + "\n  ".join(violations)


@pytest.fixture(autouse=True)
def invariants(request: pytest.FixtureRequest) -> Iterator[Invariants]:
    """Runs the checker after every fault test, whether it passed or failed."""
    inv = Invariants()
    yield inv
    if request.node.get_closest_marker("no_store"):
        return
    assert inv.scopes, "a fault test must watch the tenants it touched (or be marked no_store)"
    # Again after teardown of the system: nothing may have changed for the worse. A
    # private Redis the test's fixtures already stopped took its inbox with it.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, inv.check(require_redis=False)).result()


# -- servers ------------------------------------------------------------------------


@pytest.fixture
def redis_url() -> str:
    """The test session's Redis (shared; tests use their own key prefix)."""
    return services.redis_url()


@pytest.fixture
def valkey(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A private, non-persistent Redis server for tests that reconfigure or restart it."""
    server = start_valkey(tmp_path / "valkey")
    try:
        yield server
    finally:
        server.stop()


class PrivatePostgres:
    """A Postgres cluster of our own, to stall (SIGSTOP) and restart — never the machine's."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.server = start_postgres(data_dir, database="postgres")
        self.port = self.server.port
        self.url = self.server.url
        self._stalled: list[int] = []

    def stall(self) -> None:
        """SIGSTOP the postmaster and every backend: sockets stay open, nothing answers."""
        self._stalled = cluster_pids(self.server.pid)
        signal_all(self._stalled, signal.SIGSTOP)

    def resume(self) -> None:
        signal_all(self._stalled, signal.SIGCONT)
        self._stalled = []

    def restart(self) -> None:
        """Fast shutdown (running transactions are rolled back), then start on the same port."""
        self.resume()
        self.server.stop()
        self.server = start_postgres(self.data_dir, port=self.port, database="postgres")

    def stop(self) -> None:
        self.resume()
        self.server.stop()


@pytest.fixture(scope="module")
def private_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres(tmp_path_factory.mktemp("pg"))
    try:
        yield pg
    finally:
        pg.stop()
        # Its cluster, relocated under /var/tmp when run as root, outlives the test's
        # folder (a newcomer's test run left one behind).
        remove_data(pg.data_dir)


def fresh_migrated_db(server_url: str) -> str:
    """A new, migrated database on ``server_url``'s server."""
    import asyncpg

    name = "so_f_" + secrets.token_hex(5)

    async def make() -> str:
        conn = await asyncpg.connect(server_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        url = with_database(server_url, name)
        store = await PostgresStore.connect(url)
        try:
            await store.migrate()
        finally:
            await store.close()
        return url

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, make()).result()
