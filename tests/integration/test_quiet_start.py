"""A user message on a quiet thread starts its run in one statement (``run_start_quiet``,
lever ``quiet-start``); anything else is left, with nothing written, to ``start_run``'s
transaction: something to supersede, a message delivered again, an unknown thread, a
write that landed while the statement waited for the thread's lock (real Postgres)."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from signoff.runtime import hints
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Status
from signoff.runtime.errors import Unavailable
from signoff.runtime.keys import Keys
from signoff.runtime.records import NewCard, RunStatus
from signoff.store.cards import _values
from signoff.store.connector import init_connection
from signoff.store.postgres import PostgresStore
from signoff.store.queries import SQL
from tests import pgbouncer, services
from tests.conftest import end_runs
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _end_runs(database_url: str) -> Iterator[None]:
    yield
    end_runs(database_url, "t-quiet")


HOLDER = "w-quiet"


async def a_thread(store: PostgresStore) -> str:
    thread = await store.create_thread("t-quiet", f"u-{secrets.token_hex(3)}")
    return thread.id


async def quiet(store: PostgresStore, thread_id: str, run_id: str | None = None) -> Any:
    return await store.start_quiet_run(
        thread_id,
        run_id or str(uuid.uuid4()),
        owner="someone",
        role="user",
        holder=HOLDER,
        lease_seconds=30,
        content=[{"type": "text", "text": "oi"}],
    )


async def start_run_of(store: PostgresStore, thread_id: str, run_id: str | None = None) -> Any:
    """``start_run`` as the agent calls it (the quiet statement first, then the transaction)."""
    return await store.start_run(
        thread_id,
        owner="someone",
        role="user",
        holder=HOLDER,
        lease_seconds=30,
        content=[{"type": "text", "text": "oi"}],
        actor="someone",
        channel="test",
        run_id=run_id,
    )


async def written(store: PostgresStore, thread_id: str) -> tuple[int, int, int]:
    """The thread's last_seq, its log entries and its runs."""
    async with store.db.tx() as conn:
        seq = await conn.fetchval("SELECT last_seq FROM threads WHERE id = $1", thread_id)
        entries = await conn.fetchval(
            "SELECT count(*) FROM messages WHERE thread_id = $1", thread_id
        )
        runs = await conn.fetchval("SELECT count(*) FROM runs WHERE thread_id = $1", thread_id)
    return int(seq), int(entries), int(runs)


async def finish(store: PostgresStore, run_id: str) -> None:
    await store.db.execute("UPDATE runs SET status = 'done' WHERE id = $1", run_id)


async def test_a_quiet_thread_gets_its_run_and_the_message_in_one_statement(
    store: PostgresStore,
) -> None:
    thread_id = await a_thread(store)
    started = await quiet(store, thread_id)
    assert started is not None
    run, entry = started
    assert (run.thread_id, run.status, run.holder, run.owner) == (
        thread_id,
        RunStatus.RUNNING,
        HOLDER,
        "someone",
    )
    assert (entry.kind, entry.run_id, entry.body) == (
        "user",
        run.id,
        {"content": [{"type": "text", "text": "oi"}]},
    )
    assert await written(store, thread_id) == (entry.seq, 1, 1)
    [logged] = await store.conversation(thread_id)
    assert (logged.seq, logged.body, logged.created_at) == (entry.seq, entry.body, entry.created_at)
    assert (await store.get_run(run.id)).status is RunStatus.RUNNING
    # The run's holder has its lease row: adoption and leases see it as any other.
    lease = await store.db.fetchval("SELECT count(*) FROM workers WHERE id = $1", HOLDER)
    assert lease == 1


async def test_what_is_not_quiet_is_left_to_start_run_with_nothing_written(
    store: PostgresStore,
) -> None:
    thread_id = await a_thread(store)
    started = await quiet(store, thread_id, run_id := str(uuid.uuid4()))
    assert started is not None
    before = await written(store, thread_id)
    # An active run: start_run supersedes it.
    assert await quiet(store, thread_id) is None
    assert await written(store, thread_id) == before
    # The same message again (its run id), even once the run is over (I5).
    await finish(store, run_id)
    assert await quiet(store, thread_id, run_id) is None
    assert await written(store, thread_id) == before
    again = await start_run_of(store, thread_id, run_id)
    assert again[3] is False
    # A thread nobody made.
    assert await quiet(store, str(uuid.uuid4())) is None
    # The next message once the run is over is quiet again.
    assert await quiet(store, thread_id) is not None


async def test_a_pending_card_is_superseded_by_start_run_not_skipped(database_url: str) -> None:
    """A message while a card waits: the quiet statement writes nothing, start_run
    supersedes the card (and its run), as before."""
    async with harness(database_url, model=Scripted(pix(), pix())) as h:
        card = await one_card(h)
        before = await written(h.store, card.thread_id)
        assert await quiet(h.store, card.thread_id) is None
        assert await written(h.store, card.thread_id) == before
        await h.say(card.thread_id, "esquece, outra coisa", card.owner)
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.SUPERSEDED


async def test_a_card_committed_while_it_waited_for_the_lock_sends_it_to_start_run(
    store: PostgresStore, database_url: str
) -> None:
    """The statement's snapshot is older than the thread lock it waited for: a pending card
    committed meanwhile (here on a run that is over) is invisible to its checks. The
    thread's log moved while it waited, so it writes nothing and start_run, which reads
    after the lock, supersedes the card."""
    thread_id = await a_thread(store)
    first = await quiet(store, thread_id)
    assert first is not None
    old_run = first[0]
    await finish(store, old_run.id)
    card = NewCard(
        thread_id=thread_id,
        run_id=old_run.id,
        tenant="t-quiet",
        owner="someone",
        tool="refund",
        tool_use_id="tu-1",
        risk="critical",
        input={},
        args_snapshot={},
        summary="refund",
        impact={},
        snapshot_hash="0" * 64,
        request_key=secrets.token_hex(8),
        editable=[],
        ttl_seconds=300,
    )
    card_id = str(uuid.uuid4())
    holder = await pgbouncer.connect(database_url)
    probe = await pgbouncer.connect(database_url)
    await init_connection(holder)  # jsonb as the store sends it
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM threads WHERE id = $1 FOR NO KEY UPDATE", thread_id)
        holder_pid = await holder.fetchval("SELECT pg_backend_pid()")
        task = asyncio.ensure_future(quiet(store, thread_id))
        await blocked_on(probe, holder_pid, task)
        # A card proposed just before its run ended, committed meanwhile (card_propose
        # writes a card only for an active run: the run ends in the same transaction).
        await holder.execute("UPDATE runs SET status = 'running' WHERE id = $1", old_run.id)
        assert await holder.fetchrow(SQL.card_propose, *_values(card, card_id, str(uuid.uuid4())))
        await holder.execute("UPDATE runs SET status = 'done' WHERE id = $1", old_run.id)
        await tx.commit()
        assert await asyncio.wait_for(task, 10) is None
    finally:
        await holder.close()
        await probe.close()
    runs = await store.db.fetchval(
        "SELECT count(*) FROM runs WHERE thread_id = $1 AND status IN ('running', 'waiting')",
        thread_id,
    )
    assert runs == 0
    _, moved, _, created = await start_run_of(store, thread_id)
    assert created and [c.id for c in moved] == [card_id]
    assert (await store.get_card(card_id)).status is Status.SUPERSEDED


async def blocked_on(probe: asyncpg.Connection, holder_pid: int, task: asyncio.Future[Any]) -> None:
    """Until ``task``'s statement waits behind the session ``holder_pid``."""
    deadline = asyncio.get_running_loop().time() + 10
    while not await probe.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
        holder_pid,
    ):
        assert not task.done(), "the statement did not wait for the thread's lock"
        assert asyncio.get_running_loop().time() < deadline, "the statement never blocked"
        await asyncio.sleep(0.02)


async def test_two_messages_racing_on_a_quiet_thread_start_one_run(store: PostgresStore) -> None:
    """20 rounds of two at once: one starts its run, the other writes nothing (its caller
    goes on to start_run, which supersedes the first)."""
    for _ in range(20):
        thread_id = await a_thread(store)
        results = await asyncio.gather(quiet(store, thread_id), quiet(store, thread_id))
        assert sum(r is not None for r in results) == 1
        [(_, entry)] = [r for r in results if r is not None]
        assert await written(store, thread_id) == (entry.seq, 1, 1)


async def unblocked(probe: asyncpg.Connection, holder_pid: int) -> None:
    """Until no statement waits behind the session ``holder_pid`` any more (the one it held
    back was cancelled on the server); fails after 5 s."""
    deadline = asyncio.get_running_loop().time() + 5
    while await probe.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
        holder_pid,
    ):
        assert asyncio.get_running_loop().time() < deadline, "the statement is still waiting"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("how", ["timeout", "cancelled"])
async def test_abandoned_while_waiting_it_is_cancelled_and_writes_nothing(
    store: PostgresStore, database_url: str, how: str
) -> None:
    """Postgres too slow for the store's timeout (here: the thread's lock held), or the
    caller gone (a cancelled task): the statement is cancelled on the server, not left to
    run once the lock comes free, so neither a run nor a message is written after its
    caller was told it failed (``store/pool.py``: a connection is terminated only once
    asyncpg's cancel request is out). The thread is not wedged."""
    slow = await PostgresStore.connect(database_url, timeout=0.3)
    thread_id = await a_thread(store)
    holder = await pgbouncer.connect(database_url)
    probe = await pgbouncer.connect(database_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM threads WHERE id = $1 FOR NO KEY UPDATE", thread_id)
        holder_pid = await holder.fetchval("SELECT pg_backend_pid()")
        if how == "timeout":
            with pytest.raises(Unavailable):
                await quiet(slow, thread_id)
        else:
            task = asyncio.ensure_future(quiet(store, thread_id))
            await blocked_on(probe, holder_pid, task)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await unblocked(probe, holder_pid)
        await tx.rollback()
    finally:
        await holder.close()
        await probe.close()
        await slow.close()
    assert await written(store, thread_id) == (0, 0, 0)
    assert await quiet(store, thread_id) is not None


async def test_the_agents_hint_carries_the_message_instead_of_a_reload(database_url: str) -> None:
    """Through the agent on a Redis bus: the thread's gateways are sent the user message
    itself (no re-read of the log), then the run goes on as ever."""
    keys = Keys(f"so-quiet-{secrets.token_hex(3)}:")
    bus = RedisBus.from_url(services.redis_url(), keys)
    async with harness(database_url, model=Scripted(pix()), bus=bus) as h:
        keys = Keys(h.settings.key_prefix)
        thread = await h.thread("alice")
        got: list[hints.Hint] = []
        async with bus.subscribe(keys.thread_channel(thread)) as sub:

            async def listen() -> None:
                async for payload in sub:
                    got.append(hints.decode(payload))

            reader = asyncio.create_task(listen())
            try:
                await h.say(thread, "cobre 150 do João", "alice")
                await h.settle()
                for _ in range(100):
                    if any(e.kind == "card" for hint in got for e in hint.entries):
                        break
                    await asyncio.sleep(0.02)
            finally:
                reader.cancel()
        assert got and got[0].entries, "the first hint is a reload, not the message"
        first = got[0].entries[0]
        assert first.kind == "user" and first.seq == 1
        assert any(e.kind == "card" for hint in got for e in hint.entries)
        assert len(await h.pending(thread)) == 1
