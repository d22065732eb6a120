"""A worker takes from the inbox only what it has room for (SIGNOFF_TURNS_IN_FLIGHT,
runtime/intake.py, design note 58): a backlog waits in Redis, and a worker started
later takes its share of it."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import pytest

from signoff.runtime.bus import Delivery, Job
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.config import Settings, from_env
from signoff.runtime.errors import ConfigError
from signoff.runtime.intake import Intake
from signoff.runtime.keys import Keys
from signoff.runtime.worker import Worker
from signoff.testing import FakeMessagesServer, ScriptedReply, reply, text
from tests import pgbouncer, services
from tests.harness import harness

pytestmark = pytest.mark.anyio

MESSAGES = 12
ROOM = 3


def _answer(body: dict[str, Any]) -> ScriptedReply:
    return reply(text("Anotado."))


async def _done_by(database_url: str, threads: list[str]) -> dict[str, int]:
    """Ended runs of ``threads`` by the worker that ran them."""
    conn = await pgbouncer.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT worker_id, count(*) AS n FROM runs WHERE thread_id = ANY($1::uuid[])"
            " AND status = 'done' GROUP BY worker_id",
            threads,
        )
    finally:
        await conn.close()
    return {row["worker_id"]: row["n"] for row in rows}


async def test_a_backlog_waits_in_the_inbox_and_a_later_worker_takes_its_share(
    database_url: str,
) -> None:
    prefix = f"so-intake-{secrets.token_hex(3)}:"
    bus = RedisBus.from_url(services.redis_url(), Keys(prefix))
    settings = Settings(turns_in_flight=ROOM, key_prefix=prefix)
    with FakeMessagesServer(responder=_answer, latency=1.0) as fake:
        async with harness(database_url, fake=fake, settings=settings, bus=bus) as h:
            threads = [await h.thread("alice") for _ in range(MESSAGES)]
            for n, thread in enumerate(threads):
                await bus.enqueue(
                    Job(
                        thread_id=thread,
                        text=f"anote {n}",
                        user="alice",
                        tenant=h.tenant,
                        message_id=f"m-{n}",
                    )
                )
            # One worker, room for three: it reads three, the rest waits in the stream.
            most_pending = 0
            deadline = time.monotonic() + 0.6
            while time.monotonic() < deadline:
                lag, pending = await bus.inbox.stats()
                most_pending = max(most_pending, pending)
                assert h.worker.intake.in_flight <= ROOM
                await asyncio.sleep(0.05)
            assert most_pending == ROOM, most_pending
            assert lag >= MESSAGES - 2 * ROOM, lag  # a slow machine may have ended a turn
            # A worker started now takes what the first has no room for.
            late = Worker(
                settings=h.settings.with_(worker_id="w-late-" + secrets.token_hex(2)),
                store=h.store,
                bus=bus,
                app=h.app,
                model=h.worker.agent.model,
            )
            await late.start()
            try:
                deadline = time.monotonic() + 30
                while sum((done := await _done_by(database_url, threads)).values()) < MESSAGES:
                    assert time.monotonic() < deadline, done
                    await asyncio.sleep(0.1)
            finally:
                await late.stop()
            assert done.get(late.worker_id, 0) >= ROOM, done
            assert done.get(h.settings.worker_id, 0) >= ROOM, done
            # Never more turns waiting on the model than the two workers' room.
            assert fake.most_in_flight <= 2 * ROOM, fake.most_in_flight
            while await bus.inbox.stats() != (0, 0):  # the last ack follows its run's end
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)


async def test_turns_in_flight_is_read_from_the_environment_and_refused_at_zero() -> None:
    with pytest.raises(ConfigError, match="SIGNOFF_TURNS_IN_FLIGHT"):
        from_env({"SIGNOFF_TURNS_IN_FLIGHT": "0"})
    assert from_env({"SIGNOFF_TURNS_IN_FLIGHT": "5"}).turns_in_flight == 5
    assert Settings().turns_in_flight == 256


def _thread_on(keys: Keys, partition: int, partitions: int) -> str:
    while True:
        thread = str(uuid.uuid4())
        if keys.partition_of(thread, partitions) == partition:
            return thread


class _Stuck:
    """An intake whose turns never end until the block does; ``most``: the most turns
    it ran at once."""

    def __init__(self, bus: RedisBus, consumer: str, size: int) -> None:
        self.release = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.most = 0
        self.intake = Intake(bus, consumer, size, self._handle, self._spawn)

    async def _handle(self, _: Delivery) -> None:
        self.most = max(self.most, self.intake.in_flight)
        await self.release.wait()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def __aenter__(self) -> Intake:
        self.loop = asyncio.create_task(self.intake.run(lambda: False))
        return self.intake

    async def __aexit__(self, *_: object) -> None:
        self.release.set()
        self.loop.cancel()
        await asyncio.gather(self.loop, *self.tasks, return_exceptions=True)


async def test_a_full_worker_holds_no_entry_of_a_partitioned_inbox() -> None:
    # Four partitions, room for two. A read left waiting on each partition used to take
    # what arrived there while the worker was full: the entries waited, claimed by it,
    # for it to have room again, and an idle worker got none of them.
    partitions = 4
    keys = Keys(f"so-intake-{secrets.token_hex(3)}:")
    mine = RedisBus.from_url(services.redis_url(), keys, partitions=partitions)
    other = RedisBus.from_url(services.redis_url(), keys, partitions=partitions)
    try:
        async with _Stuck(mine, "w-1", 2) as intake:
            await asyncio.sleep(0.3)  # its reads wait on the partitions
            for partition in (0, 1, 2, 3):
                thread = _thread_on(keys, partition, partitions)
                await mine.enqueue(Job(thread_id=thread, text="x", user="u", tenant="t"))
            got: list[Delivery] = []
            deadline = time.monotonic() + 5
            while len(got) < 2 and time.monotonic() < deadline:
                got += await other.take("w-2", 0.2, 4)
            assert intake.in_flight == 2
            assert len(got) == 2  # the two the full worker has no room for
            lag, pending = await mine.inbox.stats()
            assert (lag, pending) == (0, 4)  # two running on each worker, none held
    finally:
        await mine.close()
        await other.close()


async def test_a_partitioned_inbox_gives_a_worker_no_more_than_its_room() -> None:
    partitions, room, messages = 8, 16, 120
    keys = Keys(f"so-intake-{secrets.token_hex(3)}:")
    bus = RedisBus.from_url(services.redis_url(), keys, partitions=partitions)
    try:
        for n in range(messages):
            job = Job(thread_id=str(uuid.uuid4()), text=f"m{n}", user="u", tenant="t")
            await bus.enqueue(job)
        stuck = _Stuck(bus, "w-1", room)
        async with stuck as intake:
            deadline = time.monotonic() + 10
            while intake.in_flight < room:  # filled: an overshoot shows as more than room
                assert time.monotonic() < deadline, intake.in_flight
                await asyncio.sleep(0.02)
            assert intake.in_flight == room
            assert stuck.most <= room
            lag, pending = await bus.inbox.stats()
            assert pending == room and lag == messages - room
    finally:
        await bus.close()


def test_a_bad_setting_names_the_variable_the_value_and_what_it_must_be() -> None:
    # An operator probe: "Expected `int`, got `str` - at SIGNOFF_TURNS_IN_FLIGHT" said
    # neither what was given nor what a variable (always text) should hold.
    with pytest.raises(ConfigError) as raised:
        from_env({"SIGNOFF_TURNS_IN_FLIGHT": "1.5"})
    assert (
        str(raised.value) == "bad setting: SIGNOFF_TURNS_IN_FLIGHT='1.5': expected a whole number"
    )
    with pytest.raises(ConfigError) as raised:
        from_env({"SIGNOFF_POLL_SECONDS": "-1"})
    assert str(raised.value) == "bad setting: SIGNOFF_POLL_SECONDS='-1': expected a number > 0.0"
