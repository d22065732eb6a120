"""A begin whose answer is lost (design note 50; an integrity probe: a proxy held the
reply of `card_begin_execution` past the store's timeout). The statement committed
`approved -> executing`, the worker saw Unavailable, and the run's next step took the
card for a previous holder's: flagged a lease and a tool deadline later, the provider
never called, the approval lost. Each begin now carries a token of its own call; the
worker reads the card back and sends what it began itself, once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.errors import Unavailable
from signoff.runtime.metrics import COUNTERS
from tests import pgbouncer
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

SETTINGS = Settings(lease_seconds=1.0, tool_timeout_seconds=1.0)


async def until(h: Harness, card_id: str, done: Callable[[Any], bool], seconds: float) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        card = await h.store.get_card(card_id)
        if done(card) or loop.time() > deadline:
            return card
        await asyncio.sleep(0.05)


async def executing_events(h: Harness, card_id: str) -> list[dict[str, Any]]:
    rows = await h.provider.pool.fetch(
        "SELECT actor, detail FROM card_events WHERE card_id = $1 AND to_status = 'executing'",
        card_id,
    )
    return [{"actor": r["actor"], "detail": json.loads(r["detail"])} for r in rows]


async def test_a_begin_committed_with_its_answer_lost_is_sent_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness(database_url, model=Scripted(pix("9")), settings=SETTINGS) as h:
        card = await one_card(h)
        real = h.store.begin_execution
        lost = 0

        async def answer_lost(*args: Any, **kwargs: Any) -> Any:
            nonlocal lost
            await real(*args, **kwargs)  # committed...
            lost += 1
            raise Unavailable("postgres: statement timed out")  # ...the answer never came

        monkeypatch.setattr(h.store, "begin_execution", answer_lost)
        before = COUNTERS.values.get("signoff_begin_answers_lost_total", 0)
        await h.decide(card, Decision.APPROVE)
        final = await until(
            h, card.id, lambda c: c.status not in (Status.APPROVED, Status.EXECUTING), 15
        )
        assert final.status is Status.EXECUTED, final
        assert not final.needs_reconciliation
        assert lost == 1 and await h.charges() == 1
        assert COUNTERS.values.get("signoff_begin_answers_lost_total", 0) == before + 1
        (event,) = await executing_events(h, card.id)
        assert len(event["detail"]["attempt"]) == 32


async def test_a_read_back_that_fails_a_while_is_asked_again(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness(database_url, model=Scripted(pix("9")), settings=SETTINGS) as h:
        card = await one_card(h)
        real_begin, real_read = h.store.begin_execution, h.store.read_back_begin
        reads = 0

        async def answer_lost(*args: Any, **kwargs: Any) -> Any:
            await real_begin(*args, **kwargs)
            raise Unavailable("connection lost")

        async def flaky_read(card_id: str, attempt: str) -> Any:
            nonlocal reads
            reads += 1
            if reads <= 3:
                raise Unavailable("postgres unreachable")
            return await real_read(card_id, attempt)

        monkeypatch.setattr(h.store, "begin_execution", answer_lost)
        monkeypatch.setattr(h.store, "read_back_begin", flaky_read)
        await h.decide(card, Decision.APPROVE)
        final = await until(
            h, card.id, lambda c: c.status not in (Status.APPROVED, Status.EXECUTING), 15
        )
        assert final.status is Status.EXECUTED, final
        assert reads == 4 and await h.charges() == 1


async def test_a_begin_lost_before_it_committed_is_begun_again_later(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness(database_url, model=Scripted(pix("9")), settings=SETTINGS) as h:
        card = await one_card(h)
        real = h.store.begin_execution
        calls = 0

        async def lost_first(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise Unavailable("connection refused")  # nothing reached Postgres
            return await real(*args, **kwargs)

        monkeypatch.setattr(h.store, "begin_execution", lost_first)
        await h.decide(card, Decision.APPROVE)
        final = await until(h, card.id, lambda c: c.status is Status.EXECUTED, 20)
        assert final.status is Status.EXECUTED, final
        assert calls >= 2 and await h.charges() == 1
        assert len(await executing_events(h, card.id)) == 1


async def test_a_card_begun_by_another_call_is_not_sent_on_a_lost_answer(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token tells this call's commit from another's: a card another process began
    (here: committed under another token, the answer to this call lost) is left to
    that process, never sent by this one."""
    async with harness(database_url, model=Scripted(pix("9")), settings=SETTINGS) as h:
        card = await one_card(h)
        real = h.store.begin_execution

        async def someone_elses(
            card_id: str, actor: str, holder: str | None, in_flight: Any, attempt: Any
        ) -> Any:
            await real(card_id, actor, holder, in_flight, "another-process-token")
            raise Unavailable("postgres: statement timed out")

        monkeypatch.setattr(h.store, "begin_execution", someone_elses)
        await h.decide(card, Decision.APPROVE)
        await asyncio.sleep(1.5)  # more than a lease: time enough to have sent it
        now = await h.store.get_card(card.id)
        assert now.status is Status.EXECUTING and await h.charges() == 0


async def test_a_begin_still_waiting_on_the_lock_when_its_answer_is_lost_is_sent_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's finding: the begin waits on its thread's lock (another writer holds it)
    when its connection drops; Postgres keeps the statement. The read-back saw the card
    still approved and concluded "not committed"; then the lock freed, the begin
    committed under this call's token, and nobody sent it (flagged, never charged). The
    read-back now takes the thread's lock too: it waits for that begin, and finds it."""
    async with harness(database_url, model=Scripted(pix("9")), settings=SETTINGS) as h:
        card = await one_card(h)
        real = h.store.begin_execution
        locker = await pgbouncer.connect(database_url)
        held = locker.transaction()
        abandoned: list[asyncio.Task[Any]] = []
        calls = 0

        async def dropped_while_waiting(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls > 1:
                return await real(*args, **kwargs)
            await held.start()  # another writer holds the thread's lock a while
            await locker.execute(
                "SELECT 1 FROM threads WHERE id = $1::uuid FOR UPDATE", card.thread_id
            )
            abandoned.append(asyncio.create_task(real(*args, **kwargs)))
            await asyncio.sleep(0.3)  # the statement is on the server, waiting on the lock
            raise Unavailable("connection was closed in the middle of operation")

        try:
            monkeypatch.setattr(h.store, "begin_execution", dropped_while_waiting)
            await h.decide(card, Decision.APPROVE)
            while calls == 0:
                await asyncio.sleep(0.01)
            await asyncio.sleep(1.0)  # the read-back is under way
            await held.commit()  # the lock frees: the abandoned begin commits
        finally:
            await locker.close()
        final = await until(
            h, card.id, lambda c: c.status not in (Status.APPROVED, Status.EXECUTING), 15
        )
        assert final.status is Status.EXECUTED, final
        assert not final.needs_reconciliation
        assert await h.charges() == 1
        assert len(await executing_events(h, card.id)) == 1
        await asyncio.gather(*abandoned, return_exceptions=True)


async def test_a_lost_begin_that_runs_after_its_read_back_changes_nothing(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: the read-back found the card approved and fenced the lost begin's
    token; that statement, reaching Postgres only now, changes nothing. The run begins
    the card again later, under a new token, and it is executed once."""
    async with harness(database_url, model=Scripted(pix("9")), settings=SETTINGS) as h:
        card = await one_card(h)
        real = h.store.begin_execution
        first: list[tuple[Any, ...]] = []

        async def never_arrived(*args: Any, **kwargs: Any) -> Any:
            if not first:
                first.append(args)
                raise Unavailable("statement timeout on the client")
            return await real(*args, **kwargs)

        monkeypatch.setattr(h.store, "begin_execution", never_arrived)
        await h.decide(card, Decision.APPROVE)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        fenced: list[str] = []
        while not fenced and loop.time() < deadline:
            fenced = await h.provider.pool.fetchval(
                "SELECT fenced_attempts FROM cards WHERE id = $1", card.id
            )
            await asyncio.sleep(0.02)
        (args,) = first
        assert fenced == [args[4]], (fenced, args)
        # the lost statement arrives now: it changes nothing
        late = await real(*args)
        assert late is None
        final = await until(h, card.id, lambda c: c.status is Status.EXECUTED, 20)
        assert final.status is Status.EXECUTED, final
        assert await h.charges() == 1
        (event,) = await executing_events(h, card.id)
        assert event["detail"]["attempt"] != args[4]


async def test_two_lost_begins_in_a_row_both_stay_fenced(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's finding on note 53's first form: the card held one fenced token, so a
    second lost begin's read-back replaced the first's, and the first begin, still in
    flight (a slow Postgres behind PgBouncer), then committed under a token nobody
    owned: flagged, never sent. Every fenced token is kept."""
    async with harness(database_url, model=Scripted(pix("9")), settings=SETTINGS) as h:
        card = await one_card(h)
        real = h.store.begin_execution
        lost: list[tuple[Any, ...]] = []
        late: list[Any] = []

        async def in_flight(*args: Any, **kwargs: Any) -> Any:
            if len(lost) < 2:
                lost.append(args)
                raise Unavailable("no answer")
            if not late:  # the first lost statement arrives only now, the card approved
                late.append(await real(*lost[0]))
            return await real(*args, **kwargs)

        monkeypatch.setattr(h.store, "begin_execution", in_flight)
        await h.decide(card, Decision.APPROVE)
        final = await until(h, card.id, lambda c: c.status is Status.EXECUTED, 20)
        assert final.status is Status.EXECUTED, final
        fenced = await h.provider.pool.fetchval(
            "SELECT fenced_attempts FROM cards WHERE id = $1", card.id
        )
        assert fenced == [lost[0][4], lost[1][4]]
        assert late == [None]  # it changed nothing
        assert await h.charges() == 1
