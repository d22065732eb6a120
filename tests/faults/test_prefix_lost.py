"""A process that started while Redis was away claims its key prefix once Redis answers,
and stops when another app or database holds it (runtime/prefix_owner.py). An operator
probe: such a process only logged the conflict and went on, its worker taking the other
app's inbox messages (each accepted with a 202, never run). Real Redis behind a TCP
proxy that refuses connections at first, real processes."""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from signoff.embedded import free_port
from signoff.runtime import prefix_owner
from signoff.runtime.bus.protocol import Job
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.errors import Unavailable
from signoff.runtime.keys import Keys
from signoff.testing.cluster import Proc
from tests import services
from tests.faults.proxy import Proxy

pytestmark = [pytest.mark.timeout(90), pytest.mark.no_store]  # no card is touched

OTHER = prefix_owner.owner_of("helpdesk", "another-database")


@pytest.fixture
def redis_proxy() -> Iterator[Proxy]:
    port = int(services.redis_url().rsplit(":", 1)[1].split("/")[0])
    with Proxy(port) as proxy:
        yield proxy


def _claim_for_other(prefix: str) -> redis.Redis:
    client = redis.Redis.from_url(services.redis_url())
    client.set(Keys(prefix).owner, OTHER, px=120_000)
    return client


@pytest.mark.anyio
@pytest.mark.parametrize("allow_skew", [False, True])
async def test_a_claim_made_late_that_finds_another_owner_is_lost(
    redis_proxy: Proxy, monkeypatch: pytest.MonkeyPatch, allow_skew: bool
) -> None:
    monkeypatch.setattr(prefix_owner, "BEAT_SECONDS", 0.2)
    prefix = f"pl-{secrets.token_hex(4)}:"
    redis_proxy.refuse()
    bus = RedisBus.from_url(redis_proxy.url_for(services.redis_url()), Keys(prefix))
    client = _claim_for_other(prefix)
    client.delete(Keys(prefix).owner)
    try:
        mine = prefix_owner.owner_of("payments", "db-1")
        async with prefix_owner.hold(bus, mine, where="test", allow_skew=allow_skew) as claim:
            client.set(Keys(prefix).owner, OTHER, px=120_000)  # taken while we were cut off
            await asyncio.sleep(0.5)
            assert not claim.lost.is_set()  # Redis still away: nothing known yet
            redis_proxy.refuse(False)
            if allow_skew:  # a rename in a rolling deploy: warned, and it goes on
                await asyncio.sleep(1.0)
                assert not claim.lost.is_set()
            else:
                await asyncio.wait_for(claim.lost.wait(), 5)
                assert "helpdesk" in claim.why and "payments" in claim.why
        assert client.get(Keys(prefix).owner) == OTHER.encode()  # never overwritten
    finally:
        client.delete(Keys(prefix).owner)
        client.close()
        await bus.close()


@pytest.mark.anyio
async def test_nothing_is_taken_or_queued_before_the_late_claim_is_confirmed(
    redis_proxy: Proxy,
) -> None:
    """A review's finding: a process started while Redis was away went on as if the prefix
    were its own, and its first claim came a beat (5 s) after Redis answered: meanwhile
    its worker took another app's inbox entries (and acknowledged them, no such thread
    here: accepted with a 202, never run), and its gateway queued onto that app's inbox.
    The inbox is now shut until Redis confirms the claim, tried every half second."""
    prefix = f"pl-{secrets.token_hex(4)}:"
    redis_proxy.refuse()
    mine = RedisBus.from_url(redis_proxy.url_for(services.redis_url()), Keys(prefix))
    theirs = RedisBus.from_url(services.redis_url(), Keys(prefix))
    client = _claim_for_other(prefix)
    client.delete(Keys(prefix).owner)
    job = Job(thread_id="t-other", text="hello", user="u", tenant="t", message_id="m-1")
    try:
        async with prefix_owner.hold(
            mine, prefix_owner.owner_of("payments", "db-1"), where="t"
        ) as claim:
            client.set(Keys(prefix).owner, OTHER, px=120_000)  # the other app holds it
            await theirs.enqueue(job)  # ... and has a message waiting for its workers
            redis_proxy.refuse(False)  # Redis answers again
            t0 = time.monotonic()
            taken = []
            while not claim.lost.is_set() and time.monotonic() - t0 < 5:
                taken += await mine.take("mine-1", 0.1)
            assert claim.lost.is_set()
            assert time.monotonic() - t0 < 2.5  # known within a confirm try, not a beat
            assert taken == []
            with pytest.raises(Unavailable) as refused:
                await mine.enqueue(job)
            assert "not confirmed" in str(refused.value) and not refused.value.maybe_applied
        (delivered,) = await theirs.take("theirs-1", 1.0)  # still there for the other app
        assert delivered.job == job
    finally:
        client.delete(Keys(prefix).owner)
        client.close()
        await mine.close()
        await theirs.close()


@pytest.mark.anyio
async def test_a_late_claim_that_is_ours_opens_the_inbox_soon_after_redis_answers(
    redis_proxy: Proxy,
) -> None:
    prefix = f"pl-{secrets.token_hex(4)}:"
    redis_proxy.refuse()
    bus = RedisBus.from_url(redis_proxy.url_for(services.redis_url()), Keys(prefix))
    client = redis.Redis.from_url(services.redis_url())
    job = Job(thread_id="t-mine", text="hi", user="u", tenant="t", message_id="m-2")
    try:
        async with prefix_owner.hold(
            bus, prefix_owner.owner_of("payments", "db-1"), where="t"
        ) as claim:
            assert not claim.confirmed.is_set()
            assert await bus.take("mine-1", 0.2) == []
            redis_proxy.refuse(False)
            await asyncio.wait_for(claim.confirmed.wait(), 3)
            await bus.enqueue(job)
            (delivered,) = await bus.take("mine-1", 1.0)
            assert delivered.job == job and not claim.lost.is_set()
    finally:
        client.delete(Keys(prefix).owner)
        client.close()
        await bus.close()


def _env(database_url: str, redis_url: str, prefix: str) -> dict[str, str]:
    import os

    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SIGNOFF_", "ANTHROPIC")) and "proxy" not in k.lower()
    }
    return base | {
        "SIGNOFF_DATABASE_URL": database_url,
        "SIGNOFF_REDIS_URL": redis_url,
        "SIGNOFF_KEY_PREFIX": prefix,
        "SIGNOFF_APP": "signoff.demo:app",
        "SIGNOFF_SECRET": secrets.token_urlsafe(40),
        "SIGNOFF_DB_STATEMENT_CACHE_SIZE": "0",
        "SIGNOFF_LOG_FORMAT": "human",
        "PYTHONUNBUFFERED": "1",
    }


def _ready(url: str) -> tuple[int, str]:
    try:
        r = httpx.get(url + "/readyz", timeout=5)  # a loaded machine (two test processes)
    except httpx.HTTPError:
        return 0, ""
    return r.status_code, r.text


def _gateway(env: dict[str, str], tmp_path: Path) -> Proc:
    port = free_port()
    return Proc(
        "gateway",
        [sys.executable, "-m", "signoff", "gateway", "--host", "127.0.0.1", "--port", str(port)],
        env | {"SIGNOFF_DATA_DIR": str(tmp_path / "gw")},
        tmp_path / "gateway.log",
        port=port,
    )


def _worker(env: dict[str, str], tmp_path: Path, name: str = "worker") -> Proc:
    metrics = free_port()
    return Proc(
        name,
        [sys.executable, "-m", "signoff", "worker"],
        env
        | {
            "SIGNOFF_DATA_DIR": str(tmp_path / name),
            "SIGNOFF_WORKER_ID": f"pl-{secrets.token_hex(3)}",
            "SIGNOFF_METRICS_PORT": str(metrics),
        },
        tmp_path / f"{name}.log",
        metrics_port=metrics,
    )


def _until_exit(proc: Proc, seconds: float, probe: str = "") -> set[str]:
    """Waits for ``proc`` to exit; the bodies of the 503s ``probe`` (a /readyz) gave."""
    bodies = set()
    deadline = time.monotonic() + seconds
    while proc.alive():
        assert time.monotonic() < deadline, proc.output()
        if probe:
            status, body = _ready(probe)
            if status == 503:
                bodies.add(body)
        time.sleep(0.05)
    return bodies


def test_a_gateway_started_without_redis_stops_when_another_app_holds_the_prefix(
    redis_proxy: Proxy, database_url: str, tmp_path: Path
) -> None:
    prefix = f"pl-{secrets.token_hex(4)}:"
    redis_proxy.refuse()
    gateway = _gateway(
        _env(database_url, redis_proxy.url_for(services.redis_url()), prefix), tmp_path
    )
    client = _claim_for_other(prefix)
    client.delete(Keys(prefix).owner)
    try:
        gateway.start()
        deadline = time.monotonic() + 40
        while "listening" not in gateway.output():
            assert gateway.alive() and time.monotonic() < deadline, gateway.output()
            time.sleep(0.1)
        assert "key prefix not claimed yet" in gateway.output()
        assert _ready(gateway.url)[0] == 503  # Redis away: not ready, but serving
        lenient = httpx.get(gateway.url + "/readyz?redis=optional", timeout=5)
        assert lenient.status_code == 200, lenient.text  # what decisions need answers
        client.set(Keys(prefix).owner, OTHER, px=120_000)  # another app took it meanwhile
        redis_proxy.refuse(False)
        bodies = _until_exit(gateway, 30, gateway.url)
        assert gateway.wait(5) == 1, gateway.output()
        out = gateway.output()
        assert "is used by app 'helpdesk'" in out and "SIGNOFF_KEY_PREFIX" in out, out
        assert "Traceback" not in out, out
        assert client.get(Keys(prefix).owner) == OTHER.encode()
        assert bodies <= {
            '{"ok":false,"error":"redis unavailable"}',
            '{"ok":false,"error":"key prefix held by another app"}',
        }, bodies
    finally:
        gateway.stop()
        client.delete(Keys(prefix).owner)
        client.close()


@pytest.mark.slow  # 17 s: two worker starts and one 10 s wait for Redis
def test_a_worker_whose_claim_another_app_took_stops_and_restarts_refusing(
    redis_proxy: Proxy, database_url: str, tmp_path: Path
) -> None:
    """A claim that lapsed in a long Redis outage and was taken by another app meanwhile
    (written over here, as that leaves it): the worker exits non-zero; started again,
    it refuses with the same words. Started while Redis is away, it exits saying so."""
    prefix = f"pl-{secrets.token_hex(4)}:"
    env = _env(database_url, services.redis_url(), prefix)
    worker, again = _worker(env, tmp_path), _worker(env, tmp_path, "again")
    cut_env = _env(database_url, redis_proxy.url_for(services.redis_url()), prefix)
    cut = _worker(cut_env, tmp_path, "cut")
    client = _claim_for_other(prefix)
    client.delete(Keys(prefix).owner)
    try:
        worker.start()
        deadline = time.monotonic() + 40
        while "running app" not in worker.output():
            assert worker.alive() and time.monotonic() < deadline, worker.output()
            time.sleep(0.1)
        assert client.get(Keys(prefix).owner) != OTHER.encode()  # its own claim
        client.set(Keys(prefix).owner, OTHER, px=120_000)
        _until_exit(worker, 30)
        assert worker.wait(5) == 1, worker.output()
        out = worker.output()
        assert "stopping: the Redis bus" in out and "is used by app 'helpdesk'" in out, out
        assert "Traceback" not in out, out
        again.start()
        assert again.wait(30) == 1, again.output()
        assert "is used by app 'helpdesk'" in again.output(), again.output()

        redis_proxy.refuse()  # started while Redis is away: a sentence, not a traceback
        cut.start()
        assert cut.wait(40) == 1, cut.output()
        assert "a worker does not start without its bus" in cut.output(), cut.output()
        assert "Traceback" not in cut.output(), cut.output()
    finally:
        for proc in (worker, again, cut):
            proc.stop()
        client.delete(Keys(prefix).owner)
        client.close()


@pytest.mark.anyio
async def test_after_an_outage_the_inbox_waits_for_the_claim_again(redis_proxy: Proxy) -> None:
    """A review's finding: the inbox was shut only until the first confirmation. A
    Redis outage that outlasted the claim, another app taking the prefix meanwhile, then
    left it open: the first beat after Redis came back took that app's messages."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(prefix_owner, "BEAT_SECONDS", 0.3)
    prefix = f"pl-{secrets.token_hex(4)}:"
    mine = RedisBus.from_url(redis_proxy.url_for(services.redis_url()), Keys(prefix))
    theirs = RedisBus.from_url(services.redis_url(), Keys(prefix))
    client = _claim_for_other(prefix)
    client.delete(Keys(prefix).owner)
    job = Job(thread_id="t-other", text="hello", user="u", tenant="t", message_id="m-3")
    try:
        owner = prefix_owner.owner_of("payments", "db-1")
        async with prefix_owner.hold(mine, owner, where="t") as claim:
            assert claim.confirmed.is_set()
            redis_proxy.refuse()  # a long outage: the claim lapses, another app takes it
            redis_proxy.reset()
            t0 = time.monotonic()
            while claim.confirmed.is_set() and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.05)  # until a renewal has failed
            assert not claim.confirmed.is_set()
            client.set(Keys(prefix).owner, OTHER, px=120_000)
            await theirs.enqueue(job)
            redis_proxy.refuse(False)
            taken = []
            t0 = time.monotonic()
            while not claim.lost.is_set() and time.monotonic() - t0 < 5:
                taken += await mine.take("mine-1", 0.1)
            assert claim.lost.is_set() and taken == []
        (delivered,) = await theirs.take("theirs-1", 1.0)
        assert delivered.job == job
    finally:
        monkeypatch.undo()
        client.delete(Keys(prefix).owner)
        client.close()
        await mine.close()
        await theirs.close()
