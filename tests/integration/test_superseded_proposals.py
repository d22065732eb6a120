"""A run superseded while its step was in flight proposes nothing (a hostile probe: two
messages racing on one thread through two gateways left, in 7 of 20 threads, a second
`pending` card of the superseded run, created after the supersede; approved, it was
invalidated by the sweeper a few seconds later with an ERROR)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from signoff.runtime.cards import Status
from signoff.runtime.errors import RunInactive
from signoff.runtime.records import NewCard
from signoff.store.postgres import PostgresStore
from tests import pgbouncer
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix
from tests.integration.test_quiet_start import a_thread, blocked_on, quiet

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def test_a_superseded_run_proposes_no_card(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix("7"))) as h:
        first = await one_card(h)
        await h.say(first.thread_id, "cobre de novo", "alice")  # supersedes the first run
        assert (await h.store.get_run(first.run_id)).status.value == "superseded"
        late = NewCard(
            thread_id=first.thread_id,
            run_id=first.run_id,  # the step of the superseded run, still in flight
            tenant=first.tenant,
            owner=first.owner,
            tool=first.tool,
            tool_use_id="toolu_late",
            risk=first.risk,
            input={"customer": "João", "amount": "8"},
            args_snapshot=dict(first.args_snapshot),
            summary="late",
            impact=dict(first.impact),
            snapshot_hash="0" * 64,
            request_key=f"{first.request_key}:late",
            editable=list(first.editable),
            ttl_seconds=60,
        )
        before = await h.store.entries_after(first.thread_id, 0)
        with pytest.raises(RunInactive):
            await h.store.propose(late)
        assert await h.store.entries_after(first.thread_id, 0) == before  # nothing written
        pending = await h.store.pending_cards(first.thread_id)
        assert first.run_id not in {c.run_id for c in pending}
        assert (await h.store.get_card(first.id)).status is Status.SUPERSEDED


async def test_a_proposal_waiting_for_the_thread_sees_a_supersede_committed_meanwhile(
    store: PostgresStore, database_url: str
) -> None:
    """A review: the statement's snapshot predates its wait for the thread's lock, so the
    run read unlocked still looked `running` after a supersede committed meanwhile. The run
    is read locked (after the thread's lock)."""
    thread_id = await a_thread(store)
    started = await quiet(store, thread_id)
    assert started is not None
    run = started[0]
    card = NewCard(
        thread_id=thread_id,
        run_id=run.id,
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
    holder = await pgbouncer.connect(database_url)
    probe = await pgbouncer.connect(database_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM threads WHERE id = $1 FOR NO KEY UPDATE", thread_id)
        pid = await holder.fetchval("SELECT pg_backend_pid()")
        task = asyncio.ensure_future(store.propose(card))
        await blocked_on(probe, pid, task)
        await holder.execute("UPDATE runs SET status = 'superseded' WHERE id = $1", run.id)
        await tx.commit()
        with pytest.raises(RunInactive):
            await asyncio.wait_for(task, 10)
    finally:
        await holder.close()
        await probe.close()
    assert await store.pending_cards(thread_id) == []
