"""runtime.notify.Notifier, the one publisher of hints: where a card's signal goes, what a
thread hint carries, and that nothing it sends raises after a commit (real Postgres; the
in-process bus, and a Redis bus on a port nobody listens on)."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from signoff.embedded import free_port
from signoff.runtime import hints
from signoff.runtime.bus.memory import MemoryBus
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Card, Risk, Status
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.notify import Notifier, signal_decoder
from signoff.runtime.records import Entry, Moved
from signoff.store.postgres import PostgresStore
from tests.conftest import end_runs

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _end_runs(database_url: str) -> Iterator[None]:
    yield
    end_runs(database_url, "t-notify")


KEYS = Keys("so-notify:")


async def a_run(store: PostgresStore, holder: str) -> tuple[str, str]:
    """A real thread and run, held by ``holder``; (thread id, run id)."""
    user = f"u-{secrets.token_hex(3)}"
    thread = await store.create_thread("t-notify", user)
    run, *_ = await store.start_run(
        thread.id,
        owner=user,
        role="user",
        holder=holder,
        lease_seconds=30,
        content=[{"type": "text", "text": "hello"}],
        actor=user,
        channel="test",
    )
    return thread.id, run.id


def a_card(thread_id: str, run_id: str, status: Status = Status.APPROVED) -> Card:
    now = datetime.now(UTC)
    return Card(
        id=str(uuid.uuid4()),
        thread_id=thread_id,
        run_id=run_id,
        tenant="t-notify",
        owner="someone",
        tool="refund",
        risk=Risk.CRITICAL,
        args_snapshot={},
        summary="refund",
        impact={},
        snapshot_hash="0" * 64,
        request_key=secrets.token_hex(8),
        operation_id=str(uuid.uuid4()),
        status=status,
        expires_at=now + timedelta(minutes=5),
        created_at=now,
    )


def an_entry(thread_id: str, seq: int) -> Entry:
    return Entry(
        thread_id=thread_id,
        seq=seq,
        run_id=None,
        kind="card_update",
        body={"n": seq},
        created_at=datetime.now(UTC),
    )


class Heard:
    """Every payload published on some channels of a bus, as they arrive."""

    def __init__(self) -> None:
        self.got: dict[str, list[bytes]] = {}

    async def listen(self, bus: MemoryBus, channel: str, ready: asyncio.Event) -> None:
        async with bus.subscribe(channel) as sub:
            ready.set()
            async for payload in sub:
                self.got.setdefault(channel, []).append(payload)


@pytest.fixture
async def bus() -> AsyncIterator[MemoryBus]:
    memory = MemoryBus()
    try:
        yield memory
    finally:
        await memory.close()


async def listening(bus: MemoryBus, heard: Heard, *channels: str) -> list[asyncio.Task[None]]:
    tasks = []
    for channel in channels:
        ready = asyncio.Event()
        tasks.append(asyncio.create_task(heard.listen(bus, channel, ready)))
        await ready.wait()
    return tasks


async def test_a_card_signal_goes_to_the_named_holder_then_the_wait_token_then_the_run(
    bus: MemoryBus, store: PostgresStore
) -> None:
    notify = Notifier(bus, KEYS, store)
    thread_id, run_id = await a_run(store, holder="w-run")
    heard = Heard()
    channels = [KEYS.worker_channel(w) for w in ("w-named", "w-token", "w-run")]
    tasks = await listening(bus, heard, *channels, KEYS.thread_channel(thread_id))
    try:
        card = a_card(thread_id, run_id)
        # The holder the deciding statement named hears it, and no one else is asked.
        assert await notify.card(card, at_ns=7, holder="w-named") == 1
        # Nobody on the named holder's channel: the wait token names who waits.
        assert await notify.set_wait(card.id, "w-token", 10_000)
        assert await notify.card(card, holder="w-gone") == 1
        # No token either: the run's holder in Postgres.
        assert await notify.clear_wait(card.id)
        assert await notify.card(card) == 1
        await asyncio.sleep(0)
        named, token, run = (heard.got.get(c, []) for c in channels)
        [signal] = [signal_decoder.decode(p) for p in named]
        assert (signal.card_id, signal.status, signal.at_ns) == (card.id, "approved", 7)
        assert len(token) == 1 and len(run) == 1
        # Each signal was followed by a thread hint: without an entry, "re-read".
        assert heard.got[KEYS.thread_channel(thread_id)] == [hints.RELOAD] * 3
    finally:
        for task in tasks:
            task.cancel()


async def test_thread_hints_carry_the_entries_committed(
    bus: MemoryBus, store: PostgresStore
) -> None:
    notify = Notifier(bus, KEYS, store)
    thread_id = f"thread-{secrets.token_hex(3)}"
    heard = Heard()
    tasks = await listening(bus, heard, KEYS.thread_channel(thread_id))
    try:
        card = a_card(thread_id, str(uuid.uuid4()), Status.EXECUTED)
        entry = an_entry(thread_id, 5)
        assert await notify.moved(None) is None  # no change: nothing sent
        assert await notify.moved(Moved(card=card, entry=entry)) == card
        assert await notify.thread(thread_id, [an_entry(thread_id, 6), an_entry(thread_id, 7)])
        assert await notify.delta(thread_id, 7, "Hel", "run-1")
        await asyncio.sleep(0)
        sent = [hints.decode(p) for p in heard.got[KEYS.thread_channel(thread_id)]]
        assert [[e.seq for e in h.entries] for h in sent] == [[5], [6, 7], []]
        assert (sent[0].seq, sent[1].seq) == (5, 7)
        assert (sent[2].seq, sent[2].delta, sent[2].run_id) == (7, "Hel", "run-1")
    finally:
        for task in tasks:
            task.cancel()


async def test_nothing_sent_after_a_commit_raises_when_redis_is_down(
    store: PostgresStore,
) -> None:
    """Note 18: every failure is logged and counted, and the caller goes on."""
    dead = RedisBus.from_url(f"redis://127.0.0.1:{free_port()}/0", KEYS)
    notify = Notifier(dead, KEYS, store)
    thread_id, run_id = await a_run(store, holder="w-run")
    card = a_card(thread_id, run_id)
    before = COUNTERS.values["signoff_hints_failed_total"]
    try:
        assert await notify.card(card, holder="w-named", entry=an_entry(thread_id, 1)) == 0
        assert await notify.thread(thread_id) is False
        assert await notify.delta(thread_id, 1, "x", run_id) is False
        assert await notify.set_wait(card.id, "w-run", 1000) is False
        assert await notify.clear_wait(card.id) is False
        # The signal, the wait token's delete (the card left pending) and the thread hint
        # of `card`, then one each.
        assert COUNTERS.values["signoff_hints_failed_total"] - before == 7
    finally:
        await dead.close()
