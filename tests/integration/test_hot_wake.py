"""An approval's signal describes its card, and the holder of a run waiting on that card
alone revalidates and starts it before reading the run (lever ``hot-wake``, design note
37). The signal is never trusted: ``approved -> executing`` is taken from it only if
Postgres still has the card approved with exactly the signal's values and its run
waiting on it alone, held by that worker; anything else starts nothing and leaves the
card to the ordinary way, which executes the frozen snapshot once (real Postgres)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec
import pytest

from signoff.runtime import levers
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.keys import Keys
from signoff.runtime.notify import CardSignal
from signoff.runtime.records import Approval, Moved
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = pytest.mark.anyio


@pytest.fixture
def lever_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("SIGNOFF_DISABLE", raising=False)
    levers.reset()
    yield
    levers.reset()


def approval_of(card: Card, role: str = "user", **change: Any) -> Approval:
    fields: dict[str, Any] = {
        "run_id": card.run_id,
        "thread_id": card.thread_id,
        "tenant": card.tenant,
        "owner": card.owner,
        "role": role,
        "tool": card.tool,
        "args": dict(card.args_snapshot),
    }
    fields.update(change)
    return Approval(**fields)


def counting(target: Any, name: str) -> list[Any]:
    """Replace ``target.name`` by a wrapper that records each call's result."""
    got: list[Any] = []
    call: Callable[..., Awaitable[Any]] = getattr(target, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = await call(*args, **kwargs)
        got.append(result)
        return result

    setattr(target, name, wrapper)
    return got


async def charges(h: Harness) -> list[tuple[str, int]]:
    rows = await h.provider.pool.fetch(
        "SELECT idempotency_key, amount FROM demo_charges WHERE tenant = $1", h.tenant
    )
    return [(r["idempotency_key"], r["amount"]) for r in rows]


async def decide_quietly(h: Harness, card: Card) -> Moved:
    """Approve in Postgres without telling anyone (no signal, no hint)."""
    return await h.store.decide(
        card.id,
        principal=card.owner,
        decision=Decision.APPROVE,
        snapshot_hash=card.snapshot_hash,
        channel="test",
        tenant=card.tenant,
    )


async def test_an_approval_is_started_from_its_signal(database_url: str, lever_on: None) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        hot = counting(h.store, "begin_execution_hot")
        ordinary = counting(h.store, "begin_execution")
        card = await one_card(h)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.EXECUTED
        assert [m.card.id for m in hot if m is not None] == [card.id]
        assert ordinary == []  # the ordinary start was never needed
        assert await charges(h) == [(final.operation_id, 15000)]
        events = [(e.from_status, e.to_status) for e in await h.store.card_events(card.id)]
        assert events == [
            (None, "pending"),
            ("pending", "approved"),
            ("approved", "executing"),
            ("executing", "executed"),
        ]
        run = await h.store.get_run(card.run_id)
        assert run.status.value == "done"  # the run went on as before: results, reply


async def test_with_the_lever_off_the_ordinary_way_starts_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIGNOFF_DISABLE", "hot-wake")
    levers.reset()
    try:
        async with harness(database_url, model=Scripted(pix())) as h:
            hot = counting(h.store, "begin_execution_hot")
            ordinary = counting(h.store, "begin_execution")
            card = await one_card(h)
            await h.decide(card, Decision.APPROVE)
            await h.settle()
            assert (await h.store.get_card(card.id)).status is Status.EXECUTED
            assert hot == []
            assert [m.card.id for m in ordinary if m is not None] == [card.id]
    finally:
        monkeypatch.delenv("SIGNOFF_DISABLE")
        levers.reset()


async def test_the_statement_starts_nothing_that_differs_from_postgres(
    database_url: str, lever_on: None
) -> None:
    """Each value the signal carries is compared: another amount, tool, run, thread,
    tenant, owner, role or holder starts nothing and writes nothing."""
    async with harness(database_url, model=Scripted(pix()), start_worker=True) as h:
        card = await one_card(h)
        assert h.worker is not None
        holder = h.worker.worker_id
        h.worker.waits.drop_all()  # nobody continues the run: only the statement is tried
        await decide_quietly(h, card)
        other = await one_card(h)
        wrong_args = dict(card.args_snapshot)
        wrong_args["amount_cents"] = wrong_args["amount_cents"] + 1
        forged = [
            approval_of(card, args=wrong_args),
            approval_of(card, args={**card.args_snapshot, "extra": 1}),
            approval_of(card, tool="refund_sale"),
            approval_of(card, run_id=other.run_id),
            approval_of(card, thread_id=other.thread_id),
            approval_of(card, tenant="t-other"),
            approval_of(card, owner="mallory"),
            approval_of(card, role="admin"),
        ]
        for approval in forged:
            got = await h.store.begin_execution_hot(
                card.id, "worker:x", holder=holder, approval=approval
            )
            assert got is None, approval
        not_holder = await h.store.begin_execution_hot(
            card.id, "worker:x", holder="w-someone-else", approval=approval_of(card)
        )
        assert not_holder is None
        still = await h.store.get_card(card.id)
        assert still.status is Status.APPROVED
        assert len(await h.store.card_events(card.id)) == 2  # proposed, approved: nothing more
        started = await h.store.begin_execution_hot(
            card.id, "worker:x", holder=holder, approval=approval_of(card)
        )
        assert started is not None and started.card.status is Status.EXECUTING
        assert started.card.args_snapshot == card.args_snapshot


async def test_a_forged_signal_executes_the_frozen_snapshot_once(
    database_url: str, lever_on: None
) -> None:
    """A signal naming a real approval but other values (say, a larger amount) starts
    nothing itself; the woken run reads Postgres and executes what the person approved."""
    async with harness(database_url, model=Scripted(pix())) as h:
        assert h.worker is not None
        hot = counting(h.store, "begin_execution_hot")
        card = await one_card(h)
        await decide_quietly(h, card)
        forged_args = {**card.args_snapshot, "amount_cents": 99_999_900}
        signal = CardSignal(card.id, "approved", approval=approval_of(card, args=forged_args))
        keys = Keys(h.settings.key_prefix)
        await h.bus.publish(keys.worker_channel(h.worker.worker_id), msgspec.json.encode(signal))
        for _ in range(200):
            if (await h.store.get_card(card.id)).status is Status.EXECUTED:
                break
            await asyncio.sleep(0.02)
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.EXECUTED
        assert hot == [None]  # tried once, refused by the statement
        assert await charges(h) == [(final.operation_id, 15000)]


async def test_a_run_waiting_on_two_cards_is_not_started_early(
    database_url: str, lever_on: None
) -> None:
    """The first approval of two does not execute before the second is decided (what the
    ordinary way does too); then both execute once, in the model's order."""
    model = Scripted(pix("150"), pix("20", "Maria"))
    async with harness(database_url, model=model) as h:
        hot = counting(h.store, "begin_execution_hot")
        thread = await h.thread("alice")
        await h.say(thread, "cobre", "alice")
        first, second = sorted(await h.store.pending_cards(thread), key=lambda c: c.tool_use_id)
        await h.decide(first, Decision.APPROVE)
        await h.settle()
        assert (await h.store.get_card(first.id)).status is Status.APPROVED
        assert await charges(h) == []
        await h.decide(second, Decision.APPROVE)
        await h.settle()
        done = [await h.store.get_card(c.id) for c in (first, second)]
        assert [c.status for c in done] == [Status.EXECUTED, Status.EXECUTED]
        assert all(m is None for m in hot)  # the statement refused both: two cards wait
        got = await charges(h)
        assert sorted(got) == sorted(
            (c.operation_id, a) for c, a in zip(done, (15000, 2000), strict=True)
        )


async def test_racing_starts_of_one_card_have_one_winner(database_url: str, lever_on: None) -> None:
    """Signal-started and ordinary starts of one approved card, at once: one moves it."""
    async with harness(database_url, model=Scripted(pix())) as h:
        assert h.worker is not None
        holder = h.worker.worker_id
        for _ in range(5):
            card = await one_card(h)
            h.worker.waits.drop_all()
            await decide_quietly(h, card)
            tries = [
                h.store.begin_execution_hot(
                    card.id, "worker:a", holder=holder, approval=approval_of(card)
                )
                for _ in range(4)
            ] + [h.store.begin_execution(card.id, "worker:b") for _ in range(4)]
            results = await asyncio.gather(*tries)
            assert len([r for r in results if r is not None]) == 1
            events = await h.store.card_events(card.id)
            assert [e.to_status for e in events].count("executing") == 1
