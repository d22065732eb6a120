"""A worker keeps its promises through Postgres errors that are not a lost connection.

Before: a server-side timeout (statement_timeout, lock_timeout), a server starting up or
shutting down, or too many connections reached callers as raw driver errors. The
worker's lease, poll and sweep loops caught only signoff's own errors, so one such error
ended the loop for good: the worker lived on without renewing its lease (its runs were
adopted under it), without its slow poll and without its sweeps. A message whose start
failed that way stayed held by the live worker's inbox until the process ended. And a
worker whose lease had lapsed still continued a waiting run another worker had adopted:
both called the model, and the one that lost the run could run the card.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from signoff.runtime.bus.protocol import Delivery, Job
from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Resolution
from signoff.runtime.errors import Unavailable
from signoff.runtime.records import RunStatus
from signoff.runtime.worker import Worker
from tests import services
from tests.conftest import migrated_database
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix
from tests.integration.test_wake_spans import elsewhere, executed

pytestmark = pytest.mark.anyio


LOOPS = ("signoff-listen", "signoff-inbox", "signoff-lease", "signoff-poll", "signoff-sweep")


def ended(worker: Worker) -> list[str]:
    """The worker's background loops that are no longer running."""
    running = {t.get_name() for t in worker.loops + worker.ticks.tasks if not t.done()}
    return [name for name in LOOPS if name not in running]


@pytest.fixture(scope="module")
def own_database() -> Iterator[str]:
    # Session settings (statement_timeout on the database) and counts of every worker in it.
    yield from migrated_database("so_resil", pooled=False)


async def test_server_side_timeouts_are_unavailable_and_retryable(own_database: str) -> None:
    async with harness(own_database, model=Scripted(), start_worker=False) as h:
        db = h.store.db

        async def slow(conn: asyncpg.Connection) -> None:
            await conn.execute("SET LOCAL statement_timeout = '50ms'")
            await conn.execute("SELECT pg_sleep(2)")

        with pytest.raises(Unavailable):
            await db.transaction(slow)
        holder = await asyncpg.connect(own_database)
        try:
            await holder.execute(
                "INSERT INTO workers VALUES ('lock-me', now()) ON CONFLICT DO NOTHING"
            )
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT 1 FROM workers WHERE id = 'lock-me' FOR UPDATE")

            async def locked(conn: asyncpg.Connection) -> None:
                await conn.execute("SET LOCAL lock_timeout = '50ms'")
                await conn.execute("SELECT 1 FROM workers WHERE id = 'lock-me' FOR UPDATE")

            with pytest.raises(Unavailable):
                await db.transaction(locked)
            await tx.rollback()
        finally:
            await holder.close()


async def test_the_lease_loop_lives_through_a_statement_timeout(own_database: str) -> None:
    """The reviewer's repro: a database statement_timeout, and the worker's lease row held
    locked past it, so one renewal is cancelled by the server."""
    admin = await asyncpg.connect(own_database)
    name = await admin.fetchval("SELECT current_database()")
    await admin.execute(f"ALTER DATABASE \"{name}\" SET statement_timeout = '300ms'")
    try:
        fast = Settings(lease_seconds=1.2)
        async with harness(own_database, model=Scripted(), settings=fast) as h:
            me = h.worker.worker_id
            await asyncio.sleep(0.5)
            tx = admin.transaction()
            await tx.start()
            await admin.execute("SELECT 1 FROM workers WHERE id = $1 FOR UPDATE", me)
            await asyncio.sleep(1.0)  # renewals wait on the lock and are cancelled at 300 ms
            await tx.rollback()
            await asyncio.sleep(1.0)
            assert not ended(h.worker), "a background loop ended"
            left = await admin.fetchval(
                "SELECT extract(epoch FROM lease_until - now()) FROM workers WHERE id = $1", me
            )
            assert left is not None and left > 0.5  # renewed after the lock went
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" RESET statement_timeout')
        await admin.close()


async def test_every_loop_lives_through_an_unexpected_error(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = Settings(lease_seconds=0.9, poll_seconds=0.1, sweep_seconds=0.1)
    async with harness(own_database, model=Scripted(), settings=fast) as h:
        calls = {"renew": 0, "poll": 0, "sweep": 0}
        renew, poll, sweep = h.store.renew_leases, h.worker.poll, h.worker.sweep

        async def bad_renew(*a: object) -> None:
            calls["renew"] += 1
            if calls["renew"] == 1:
                raise RuntimeError("a bug in the lease tick")
            await renew(*a)  # type: ignore[arg-type]

        async def bad_poll(tick: int = 0) -> None:
            calls["poll"] += 1
            if calls["poll"] == 1:
                raise RuntimeError("a bug in the poll")
            await poll(tick)

        async def bad_sweep() -> object:
            calls["sweep"] += 1
            if calls["sweep"] == 1:
                raise KeyError("a bug in the sweep")
            return await sweep()

        monkeypatch.setattr(h.store, "renew_leases", bad_renew)
        monkeypatch.setattr(h.worker, "poll", bad_poll)
        monkeypatch.setattr(h.worker, "sweep", bad_sweep)
        await asyncio.sleep(1.2)
        assert calls["renew"] >= 2 and calls["poll"] >= 2 and calls["sweep"] >= 2
        assert not ended(h.worker)


async def test_an_inbox_entry_whose_start_fails_oddly_is_handed_back(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that fails with an error that is not Unavailable while the run cannot be
    read either: the entry was held by the live worker forever (its task ended)."""
    async with harness(own_database, model=Scripted(pix()), settings=Settings()) as h:
        w = h.worker
        failing = {"on": True}
        start, get_run = w.agent.start, h.store.get_run

        async def bad_start(*a: object, **k: object) -> object:
            if failing["on"]:
                raise asyncpg.exceptions.CannotConnectNowError("the database system is starting up")
            return await start(*a, **k)  # type: ignore[arg-type]

        async def bad_get_run(run_id: str) -> object:
            if failing["on"]:
                raise asyncpg.exceptions.CannotConnectNowError("the database system is starting up")
            return await get_run(run_id)

        monkeypatch.setattr(w.agent, "start", bad_start)
        monkeypatch.setattr(h.store, "get_run", bad_get_run)
        with pytest.raises(Unavailable):
            await w.run_message(await h.thread("alice"), "cobre", user="alice", message_id="m-odd")
        failing["on"] = False
        run = await w.run_message(
            await h.thread("alice"), "cobre", user="alice", message_id="m-odd2"
        )
        assert run is not None


async def test_a_worker_that_lost_its_run_does_not_continue_it(own_database: str) -> None:
    model_a = Scripted(pix())
    async with (
        harness(own_database, model=model_a, worker_id="lost-a") as a,
        harness(own_database, model=Scripted(pix()), worker_id="lost-b") as b,
    ):
        card = await one_card(a)
        assert model_a.calls == 1
        # a stalls (its lease loop stops) while alive, its lease lapses and b adopts the
        # run; a still parks it.
        (lease,) = [t for t in a.worker.ticks.tasks if t.get_name() == "signoff-lease"]
        lease.cancel()
        await a.store.db.execute(
            "UPDATE workers SET lease_until = now() - interval '1 second' WHERE id = 'lost-a'"
        )
        assert card.run_id in await b.worker.adopt()
        await asyncio.sleep(0.3)
        assert b.worker.waits.is_parked(card.id) and a.worker.waits.is_parked(card.id)
        await elsewhere(a).resolve(
            card.id,
            Resolution(decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash),
            principal="alice",
            channel="test",
        )
        await a.worker.poll(tick=0)  # a's full re-read finds the approval of a run it parked
        await asyncio.sleep(0.3)
        assert not a.worker.waits.is_parked(card.id)  # woken, and let go
        assert (await a.store.get_card(card.id)).status is Status.APPROVED  # a ran nothing
        await b.worker.poll(tick=1)  # b, the holder, finds the approval
        await executed(b, card.id)
        assert model_a.calls == 1  # a never asked its model again


async def test_a_worker_whose_lease_lapsed_lets_go_of_the_runs_taken_over(
    own_database: str,
) -> None:
    # An operator probe: Postgres read-only for a minute, every lease lapsed; once it took
    # writes again one worker took over the other's 98 parked runs, and both reported
    # them parked (signoff_parked_runs) until a card of each was decided. The renewal
    # that follows a lapse now looks for what was taken over and lets it go.
    fast = Settings(lease_seconds=1.0)
    async with harness(
        own_database, model=Scripted(pix()), worker_id="lapse-a", settings=fast
    ) as a:
        card = await one_card(a)
        kept = await one_card(a)
        (lease,) = [t for t in a.worker.ticks.tasks if t.get_name() == "signoff-lease"]
        lease.cancel()
        await asyncio.sleep(fast.lease_seconds)  # by a's own clock, its lease lapsed
        # Meanwhile another worker adopted one of its runs (as its adoption writes it).
        await a.store.db.execute("UPDATE runs SET worker_id = 'lapse-b' WHERE id = $1", card.run_id)
        await a.worker.renew()  # the renewal after the lapse
        for _ in range(100):
            if not a.worker.waits.is_parked(card.id):
                break
            await asyncio.sleep(0.02)
        assert not a.worker.waits.is_parked(card.id)  # let go: the other worker holds it
        assert a.worker.waits.is_parked(kept.id)  # still its own
        assert len(a.worker.waits) == 1


async def test_a_stopping_worker_lets_a_tick_finish_its_statement(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: stop cancelled the lease, poll and sweep loops wherever they were, so a tick
    waiting on a statement had the driver send a cancel request (behind PgBouncer 1.18-1.19
    two at once can abort PgBouncer). Now the tick's statement runs to its end first."""
    fast = Settings(poll_seconds=0.1)
    async with harness(own_database, model=Scripted(), settings=fast) as h:
        seen: dict[str, object] = {}
        poll = h.worker.poll

        async def slow_poll(tick: int = 0) -> None:
            if "started" in seen:
                return await poll(tick)
            seen["started"] = True
            try:
                seen["slept"] = await h.store.db.fetchval("SELECT 1 FROM pg_sleep(0.6)")
            except asyncio.CancelledError:
                seen["cancelled"] = True
                raise

        monkeypatch.setattr(h.worker, "poll", slow_poll)
        for _ in range(50):
            if "started" in seen:
                break
            await asyncio.sleep(0.02)
        tasks = h.worker.ticks.tasks
        await h.worker.stop()
        assert seen == {"started": True, "slept": 1}
        assert all(t.done() and not t.cancelled() for t in tasks)


async def test_a_tick_past_the_grace_is_cancelled_so_stop_ends() -> None:
    from signoff.runtime.ticks import Ticks

    ticks, seen = Ticks(), []

    async def stuck(tick: int) -> None:
        seen.append(tick)
        await asyncio.sleep(60)

    ticks.every("stuck", 0.01, stuck, now=True)
    tasks = ticks.tasks
    await asyncio.sleep(0.05)
    started = asyncio.get_running_loop().time()
    await ticks.stop(0.2)
    assert asyncio.get_running_loop().time() - started < 2
    assert seen == [1] and all(t.cancelled() for t in tasks)


async def test_a_stopping_worker_adopts_nothing(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reviewer's case: a lease tick still running in the stop's grace period adopted
    lapsed runs for a worker about to cancel whatever it started."""
    async with harness(own_database, model=Scripted(pix()), worker_id="gone-a") as a:
        card = await one_card(a)
        await a.worker.stop(release=False)
        await a.store.db.execute(
            "UPDATE workers SET lease_until = now() - interval '1 second' WHERE id = 'gone-a'"
        )
        async with harness(own_database, model=Scripted(), start_worker=False) as b:
            b.worker.draining = True  # what stop() sets first
            assert await b.worker.adopt() == []
            b.worker.draining = False
            assert card.run_id in await b.worker.adopt()  # without the stop, it is adopted


async def test_a_message_whose_step_failed_after_its_run_began_is_continued(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator probe's repro (Postgres refusing connections at a burst's start): the
    run was committed, its first step failed, and reading it back failed too; the
    message's retry found the run and stopped there. The run stayed `running` on the
    live worker (no lease lapsed for anyone to adopt it), no card was ever proposed, and
    a card it had proposed was approved and never run. Now the retry continues it."""
    async with harness(own_database, model=Scripted(pix()), settings=Settings()) as h:
        w = h.worker
        thread = await h.thread("alice")
        away = {"conversation": 1, "get_run": 1}
        conversation, get_run = h.store.conversation, h.store.get_run

        def refusing(name: str, real: Any) -> Any:
            async def call(*a: Any, **k: Any) -> Any:
                if away[name] > 0:
                    away[name] -= 1
                    raise Unavailable("Postgres refused: sorry, too many clients already")
                return await real(*a, **k)

            return call

        monkeypatch.setattr(h.store, "conversation", refusing("conversation", conversation))
        monkeypatch.setattr(h.store, "get_run", refusing("get_run", get_run))
        job = Job(thread_id=thread, text="cobre", user="alice", tenant=h.tenant, message_id="m1")
        await w._handle(Delivery("1-0", job))
        assert away == {"conversation": 0, "get_run": 0}  # both refusals were met
        (card,) = await h.store.pending_cards(thread)
        run = await h.store.get_run(card.run_id)
        assert run.status is RunStatus.WAITING and w.waits.is_parked(card.id)
        await h.approve(card)
        await executed(h, card.id)


async def test_the_sweep_continues_an_approved_run_we_hold_but_do_not_park(
    own_database: str,
) -> None:
    """Whatever left a run of ours waiting but not parked in this process (a step that
    failed between `waiting` and its park), its approved card was signalled again every
    sweep, to this very worker, which had nothing parked on it: the card stayed approved
    while the worker lived. The sweep now continues such a run itself."""
    settings = Settings(approved_stale_seconds=0.05)
    async with harness(own_database, model=Scripted(pix()), settings=settings) as h:
        w = h.worker
        card = await one_card(h)
        w.waits.drop_run(card.run_id)  # parked nowhere here, as after the failed step
        await elsewhere(h).resolve(  # a signal that reaches nobody
            card.id,
            Resolution(decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash),
            principal="alice",
            channel="test",
        )
        await asyncio.sleep(0.1)
        assert (await h.store.get_card(card.id)).status is Status.APPROVED
        await w.sweep_approved()
        await executed(h, card.id)


async def test_a_second_worker_under_a_live_workers_id_refuses_to_start(
    own_database: str,
) -> None:
    """The operator probe's #9: a second `signoff worker` with the SIGNOFF_WORKER_ID of a
    live one "took over" that worker's runs (held, to it, by no live worker) and on stop
    released them from under it: two processes under one holder id step the same runs.
    A lease renewed while the newcomer waits is a live process's: it refuses to start.
    A lapsing one (a crashed predecessor) is waited out."""
    from signoff.runtime import presence
    from signoff.runtime.errors import ConfigError
    from signoff.store.postgres import PostgresStore

    store = await PostgresStore.connect(own_database)
    try:
        await presence.sole_worker(store, "never-ran", watch=5)  # no row: at once
        await store.renew_leases("live-one", 1.0)

        async def renewing() -> None:
            while True:
                await asyncio.sleep(0.2)
                await store.renew_leases("live-one", 1.0)

        beat = asyncio.create_task(renewing())
        try:
            with pytest.raises(ConfigError, match="in use by a live worker"):
                await presence.sole_worker(store, "live-one", watch=0.5, grace=0.1)
        finally:
            beat.cancel()
        await store.renew_leases("crashed-one", 30)  # never renewed again
        loop = asyncio.get_running_loop()
        began = loop.time()
        await presence.sole_worker(store, "crashed-one", watch=0.5, grace=0.1)
        assert 0.5 <= loop.time() - began < 5  # watched it, not renewed: went on
    finally:
        await store.close()


async def test_the_sweep_leaves_a_run_to_its_own_continuation(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review's D1 and D2: a run of ours not parked here because its continuation is
    running (a slow revalidation), queued or waiting out a retry's backoff is not an
    orphan. The sweep started another continuation each time (each one holding a step
    slot while it queued for the run's lock, each failure starting its own retry chain)
    until no slot was left and the worker ran nothing else. It starts none while one is
    running or due."""
    settings = Settings(approved_stale_seconds=0.01, tool_timeout_seconds=0.2)
    async with harness(own_database, model=Scripted(pix()), settings=settings) as h:
        w = h.worker
        card = await one_card(h)
        tool = w.agent.tools.get("create_pix_charge")
        assert tool is not None

        async def hanging(snapshot: Any, ctx: Any) -> Any:
            await asyncio.sleep(3600)

        monkeypatch.setattr(tool, "revalidate", hanging)
        real = w.agent.continue_run
        running, most, calls = 0, 0, 0

        async def counted(run_id: str) -> Any:
            nonlocal running, most, calls
            running, calls = running + 1, calls + 1
            most = max(most, running)
            try:
                return await real(run_id)
            finally:
                running -= 1

        monkeypatch.setattr(w.agent, "continue_run", counted)
        await h.decide(card, Decision.APPROVE)
        for _ in range(30):  # a sweep every 50 ms for 1.5 s
            w.sweeper.signalled_again.clear()
            await w.sweep_approved()
            await asyncio.sleep(0.05)
        assert most == 1, most
        assert calls <= 4, calls  # the first, then its own retries (0.5 s, 1 s later)
        assert w._step_slots.free >= w._step_slots.size - 1  # the others are free


async def test_a_hanging_app_teardown_does_not_hold_a_stop(
    own_database: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """The operator probe: a worker cut off by a half-open Postgres link did not exit on
    SIGTERM (its app's pool close waited on the dead connections for over a minute,
    past any orchestrator's grace period). An app's teardown has a bound."""
    import time

    from signoff.demo import app as demo_app
    from signoff.runtime import node as node_module
    from signoff.runtime.config import from_env

    monkeypatch.setattr(node_module, "TEARDOWN_SECONDS", 0.3)
    the_app = demo_app()

    async def hang() -> None:
        await asyncio.sleep(3600)

    the_app.teardown = hang
    settings = from_env(
        {
            "SIGNOFF_DATABASE_URL": own_database,
            "SIGNOFF_REDIS_URL": services.redis_url(),
            "SIGNOFF_KEY_PREFIX": f"teardown-{uuid.uuid4().hex[:8]}:",  # its database's own
        }
    )
    async with node_module.running(settings, the_app, worker=True, gateway=False):
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 5
    assert "teardown took over 0.3s" in caplog.text
    await the_app.services.close()  # what the hung teardown left open
