"""A parked run survives its process: the decision lands while no worker holds it,
another process adopts the run from Postgres and continues it exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from signoff.runtime.bus.memory import MemoryBus
from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Decisions, Resolution
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.policy import Policy
from tests.conftest import migrated_database
from tests.harness import harness
from tests.integration.test_decisions import Scripted, pix

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """A database of this module's own: these tests count the model's calls and the
    adoptions of every worker, and a worker adopts any lapsed run in its database (two
    clean-clone CI runs failed here on runs earlier tests left in the session's: 26 and
    86 calls of another test's runs)."""
    yield from migrated_database("so_recovery")


async def test_run_continues_after_restart_with_decision_made_while_down(database_url: str) -> None:
    fast = Settings(lease_seconds=1.0)
    model_a = Scripted(pix("42"))
    async with harness(database_url, model=model_a, settings=fast, leave_runs=True) as a:
        thread = await a.thread("alice")
        run = await a.say(thread, "cobre 42", "alice")
        assert run is not None and run.status == "waiting"
        (card,) = await a.store.pending_cards(thread)
        tenant = a.tenant
        # the process dies: no drain, no release of leases or tokens
        await a.worker.stop(drain=False, release=False)
        # Counted once the worker is stopped: until then it may still be continuing runs
        # it adopted from earlier tests sharing the session database (lapsed leases: a CI
        # run counted 26 calls before the stop and one more during it), or retrying a step
        # after an Unavailable store on a loaded machine.
        calls = model_a.calls
        # the decision arrives while nobody holds the run (published to nobody)
        # (a gateway of the same app: one that does not serve the tool refuses, UnknownTool)
        down = Decisions(
            store=a.store, bus=MemoryBus(), tools=a.decisions.tools, policy=Policy(), keys=Keys()
        )
        await down.resolve(
            card.id,
            Resolution(decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash),
            principal="alice",
            channel="test",
        )
        assert (await a.store.get_card(card.id)).status is Status.APPROVED
        assert await a.charges() == 0
        assert model_a.calls == calls  # the stopped worker did not continue the run

    model_b = Scripted(pix("42"))
    adoptions = COUNTERS.values["signoff_runs_adopted_total"]
    async with harness(database_url, model=model_b, settings=fast) as b:
        b.provider = b.provider  # same database, another process's worker
        deadline = asyncio.get_running_loop().time() + 10
        while (await b.store.get_run(run.id)).status != "done":
            assert asyncio.get_running_loop().time() < deadline, "run was not adopted"
            await asyncio.sleep(0.1)
        final = await b.store.get_card(card.id)
        assert final.status is Status.EXECUTED
        assert COUNTERS.values["signoff_runs_adopted_total"] >= adoptions + 1  # the metric
        charges = await b.provider.pool.fetchval(
            "SELECT count(*) FROM demo_charges WHERE tenant = $1", tenant
        )
        assert charges == 1
        assert model_b.calls == 1  # continued from the stored conversation
        last = model_b.seen[0][-1]["content"][0]
        assert last["type"] == "tool_result" and '"executed"' in last["content"]
        adopted = await b.store.get_run(run.id)
        assert adopted.holder == b.worker.worker_id


async def test_two_workers_recovering_same_runs_execute_once(database_url: str) -> None:
    fast = Settings(lease_seconds=1.0)
    async with harness(database_url, model=Scripted(pix("7")), settings=fast, leave_runs=True) as a:
        runs = []
        cards = []
        for i in range(5):
            thread = await a.thread(f"u{i}")
            runs.append(await a.say(thread, "cobre", f"u{i}"))
            cards.extend(await a.store.pending_cards(thread))
        await a.worker.stop(drain=False, release=False)
        for card in cards:
            await a.store.decide(
                card.id,
                principal=card.owner,
                decision=Decision.APPROVE,
                snapshot_hash=card.snapshot_hash,
                channel="test",
            )
        tenant = a.tenant
    async with (
        harness(database_url, model=Scripted(pix("7")), settings=fast) as b,
        harness(database_url, model=Scripted(pix("7")), settings=fast) as c,
    ):
        deadline = asyncio.get_running_loop().time() + 15
        for run in runs:
            assert run is not None
            while (await b.store.get_run(run.id)).status != "done":
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
        await b.settle()
        await c.settle()
        n = await b.provider.pool.fetchval(
            "SELECT count(*) FROM demo_charges WHERE tenant = $1", tenant
        )
        assert n == 5
        for card in cards:
            assert (await b.store.get_card(card.id)).status is Status.EXECUTED


async def test_a_graceful_stop_clears_the_wait_tokens_and_releases_the_runs(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix("5"))) as a:
        cards = []
        for i in range(3):
            thread = await a.thread(f"s{i}")
            run = await a.say(thread, "cobre", f"s{i}")
            assert run is not None and run.status == "waiting"
            cards.extend(await a.store.pending_cards(thread))
        assert len(cards) == 3  # (lapsed runs of other tests may be parked here too)
        assert {c.id for c in cards} <= set(a.worker.waits.parked_cards())
        for card in cards:
            assert await a.bus.wait_holder(card.id) == a.worker.worker_id
        await a.worker.stop()
        assert len(a.worker.waits) == 0
        for card in cards:
            assert await a.bus.wait_holder(card.id) is None
            assert (await a.store.get_run(card.run_id)).holder is None
