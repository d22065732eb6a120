"""An operator's reconcile never settles a card while its worker may still be calling the
provider (a review's finding: the worker asked an unanswered call again for up to four
tool deadlines, while `signoff cards reconcile` waited one lease and one deadline, taken
from the operator's own shell; a card reconciled `failed` was then charged).

Every attempt now starts within most of a lease of `executing_since` (the worker fences,
which restarts it, before a later one), and the worker's own in-flight time is kept in
the `executing` audit row, which the reconcile reads under the thread's lock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from signoff.runtime import cli
from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.errors import Conflict
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

AGE = "SELECT extract(epoch FROM now() - executing_since)::float8 FROM cards WHERE id = $1"


async def test_retries_start_within_a_lease_of_executing_since_and_reconcile_waits(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=0.3)
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        card = await one_card(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        real = tool.execute
        ages: list[float] = []
        refused: list[str] = []

        async def unanswered_three_times(snapshot: Any, operation_id: str, ctx: Any) -> Any:
            ages.append(await h.store.db.fetchval(AGE, card.id))
            if len(ages) < 4:
                await asyncio.sleep(10)  # no answer: cut at the tool deadline, asked again
            # The last attempt, in flight: an operator reconciling now (with a shell whose
            # settings say a tiny window) is refused by the worker's own in-flight time.
            try:
                await h.store.reconcile(
                    card.id,
                    executed=False,
                    actor="operator",
                    note="no charge seen",
                    in_flight_seconds=0.01,
                )
            except Conflict as exc:
                refused.append(exc.message)
            return await real(snapshot, operation_id, ctx)

        monkeypatch.setattr(tool, "execute", unanswered_three_times)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.EXECUTED, final
        assert await h.charges() == 1
        assert len(ages) == 4, ages  # the unanswered call was asked again, same key
        assert max(ages) < settings.lease_seconds, ages  # each within a lease of its window
        assert len(refused) == 1 and "up to 1.3 s" in refused[0], refused
        (begun,) = [e for e in await h.store.card_events(card.id) if e.to_status == "executing"]
        assert begun.detail["in_flight_seconds"] == 1.3 and len(begun.detail["attempt"]) == 32


async def test_the_cli_refuses_an_unflagged_card_in_flight_unless_forced(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with harness(database_url, model=Scripted(pix("5"))) as h:
        card = await one_card(h)
        await h.store.decide(
            card.id,
            principal="alice",
            decision=Decision.APPROVE,
            snapshot_hash=card.snapshot_hash,
            channel="test",
        )
        # A worker whose lease + tool deadline is 600 s started it a moment ago.
        assert await h.store.begin_execution(card.id, "worker:busy", None, 600.0) is not None
        # Nor does the sweeper flag it (inviting a reconcile) within that time (a review:
        # it flagged after SIGNOFF_STUCK_AFTER_SECONDS, whatever the tool deadline).
        assert card.id not in {c.id for c in await h.store.flag_stuck(0)}
        args = ["cards", "reconcile", card.id, "--outcome", "failed", "--note", "not seen"]
        rc = await asyncio.to_thread(cli.main, [*args, "--database-url", database_url])
        err = capsys.readouterr().err
        assert rc != 0 and "may still be calling the provider" in err and "600" in err, err
        assert (await h.store.get_card(card.id)).status is Status.EXECUTING
        rc = await asyncio.to_thread(cli.main, [*args, "--force", "--database-url", database_url])
        assert rc == 0, capsys.readouterr().err
        done = await h.store.get_card(card.id)
        assert done.status is Status.FAILED and not done.needs_reconciliation


async def test_the_sweeper_flags_a_card_once_its_in_flight_time_is_over(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix("6"))) as h:
        card = await one_card(h)
        await h.store.decide(
            card.id,
            principal="alice",
            decision=Decision.APPROVE,
            snapshot_hash=card.snapshot_hash,
            channel="test",
        )
        assert await h.store.begin_execution(card.id, "worker:busy", None, 600.0) is not None
        assert card.id not in {c.id for c in await h.store.flag_stuck(0)}
        await h.store.db.execute(
            "UPDATE cards SET executing_since = now() - interval '601 seconds' WHERE id = $1",
            card.id,
        )
        assert card.id in {c.id for c in await h.store.flag_stuck(0)}


async def test_a_card_executing_elsewhere_is_told_unknown_when_its_window_ends(
    database_url: str,
) -> None:
    """A hostile probe: the log said "told unknown 40s after it was first seen" and the
    card was flagged about 61 s after: the continuation was tried again at 0.5, 1, 2, 4,
    8, 16 and 30 s, overshooting the window's end by up to one backoff. It is looked at
    again no later than the window's end."""
    settings = Settings(lease_seconds=2.0, tool_timeout_seconds=2.0)  # a 4 s window
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        card = await one_card(h)
        await h.store.db.execute(  # its run's previous holder started it
            "UPDATE cards SET status = 'executing', executing_since = now() WHERE id = $1",
            card.id,
        )
        loop = asyncio.get_running_loop()
        began = loop.time()
        h.worker.waits.wake_run(card.run_id, "poll")
        while not await h.store.db.fetchval(
            "SELECT needs_reconciliation FROM cards WHERE id = $1", card.id
        ):
            assert loop.time() - began < 6.0, "flagged long after its window ended"
            await asyncio.sleep(0.05)
        assert loop.time() - began >= 3.9  # not before it either
