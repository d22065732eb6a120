"""A worker takes from the inbox only what it has room for (SIGNOFF_TURNS_IN_FLIGHT,
runtime/intake.py, design note 58): a backlog waits in Redis, and a worker started
later takes its share of it."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import pytest

from signoff.runtime.bus import Job
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.config import Settings, from_env
from signoff.runtime.errors import ConfigError
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
            assert lag == MESSAGES - ROOM, lag
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
            assert await bus.inbox.stats() == (0, 0)


async def test_turns_in_flight_is_read_from_the_environment_and_refused_at_zero() -> None:
    with pytest.raises(ConfigError, match="SIGNOFF_TURNS_IN_FLIGHT"):
        from_env({"SIGNOFF_TURNS_IN_FLIGHT": "0"})
    assert from_env({"SIGNOFF_TURNS_IN_FLIGHT": "5"}).turns_in_flight == 5
    assert Settings().turns_in_flight == 64
