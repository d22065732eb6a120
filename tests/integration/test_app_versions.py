"""One app per deployment: the presence check at start, cards of a tool a process does not
serve (gateway refuses, worker hands the run on), card lifetimes set by policy (real
Postgres)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from datetime import timedelta

import pytest

from signoff import (
    App,
    AppMismatch,
    NotOwner,
    Policy,
    Registry,
    Risk,
    Rule,
    UnknownTool,
    Verdict,
)
from signoff.demo import demo_policy
from signoff.demo.tools import ALL_TOOLS
from signoff.gateway.errors import status_of
from signoff.runtime import handover, presence
from signoff.runtime.cards import Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Decisions
from signoff.runtime.keys import Keys
from signoff.runtime.worker import Worker
from signoff.store.postgres import PostgresStore
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = pytest.mark.anyio


def _app(name: str, *, without: str = "") -> App:
    return App(name=name, tools=Registry(t for t in ALL_TOOLS if t.name != without))


# -- the presence check at start ------------------------------------------------------------


async def test_a_process_refuses_to_start_beside_another_version_of_its_app(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    name = "app-" + secrets.token_hex(4)
    v1, v2 = _app(name), _app(name, without="refund_sale")
    async with presence.present(store, v1, f"w1-{name}", ["worker"], allow_skew=False):
        # the same version joins; another version is refused and writes nothing
        async with presence.present(store, v1, f"g1-{name}", ["gateway"], allow_skew=False):
            pass
        with pytest.raises(AppMismatch, match="refund_sale only there"):
            async with presence.present(store, v2, f"w2-{name}", ["worker"], allow_skew=False):
                pass
        ids = {p.id for p in await store.app_processes(presence.LIVE_SECONDS)}
        assert f"w1-{name}" in ids and f"w2-{name}" not in ids and f"g1-{name}" not in ids
        # a rolling deploy: allowed, with a warning
        with caplog.at_level(logging.WARNING, logger="signoff.presence"):
            async with presence.present(store, v2, f"w2-{name}", ["worker"], allow_skew=True):
                ids = {p.id for p in await store.app_processes(presence.LIVE_SECONDS)}
                assert f"w2-{name}" in ids
        assert "refund_sale only there" in caplog.text and "allowed" in caplog.text
    # the row of a process that stopped renewing it (killed) no longer counts
    await store.join_app(presence.describe(v1, f"dead-{name}", ["worker"]), 60, lambda _: None)
    await store.pool.execute(
        "UPDATE app_processes SET seen_at = now() - interval '1 minute' WHERE id = $1",
        f"dead-{name}",
    )
    async with presence.present(store, v2, f"w3-{name}", ["worker"], allow_skew=False):
        pass
    await store.leave_app(f"dead-{name}")
    assert not [p for p in await store.app_processes(3600) if p.app == name]


async def test_a_gateway_on_another_bus_than_its_apps_workers_is_told_at_start(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator probe: a gateway started with another SIGNOFF_KEY_PREFIX than its
    workers answered 202 to every message, which no worker would ever read, and said
    nothing. Each process registers its bus (Redis location and prefix, no password)."""
    name = "app-" + secrets.token_hex(4)
    v1 = _app(name)
    ours = presence.bus_identity("redis://:secret@127.0.0.1:6379/0", "so:")
    theirs = presence.bus_identity("redis://:secret@127.0.0.1:6379/0", "wrong:")
    assert "secret" not in ours and ours == "redis://127.0.0.1:6379/0 prefix so:"
    cluster = presence.bus_identity("redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001", "p:")
    assert cluster == "redis+cluster://10.0.0.1:7000,10.0.0.2:7001/0 prefix p:"  # CI: it raised
    with caplog.at_level(logging.WARNING, logger="signoff.presence"):
        async with presence.present(store, v1, f"w-{name}", ["worker"], allow_skew=False, bus=ours):
            async with presence.present(
                store, v1, f"g-{name}", ["gateway"], allow_skew=False, bus=ours
            ):
                pass
            assert "another bus" not in caplog.text
            (mine,) = [p for p in await store.app_processes(60) if p.id == f"w-{name}"]
            assert mine.bus == ours
            async with presence.present(
                store, v1, f"g2-{name}", ["gateway"], allow_skew=False, bus=theirs
            ):
                pass
    assert "use another bus" in caplog.text and "prefix wrong:" in caplog.text, caplog.text
    assert "SIGNOFF_KEY_PREFIX" in caplog.text


# -- a card whose tool this process does not serve -----------------------------------------


async def test_a_gateway_refuses_to_approve_or_edit_a_card_of_a_tool_it_does_not_serve(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        other = Decisions(
            store=h.store,
            bus=h.bus,
            tools=_app("payments", without="create_pix_charge").tools,
            policy=Policy(),
            keys=Keys(),
        )
        before = await h.store.card_events(card.id)
        h.decisions = other
        with pytest.raises(UnknownTool) as caught:
            await h.decide(card, Decision.APPROVE)
        assert caught.value.tool == "create_pix_charge" and status_of(caught.value) == 409
        with pytest.raises(UnknownTool):
            await h.decide(card, Decision.EDIT, edits={"amount": "100"})
        assert (await h.store.get_card(card.id)).status is Status.PENDING
        assert await h.store.card_events(card.id) == before
        # not the owner: told so first, not which tool the card is for
        with pytest.raises(NotOwner):
            await h.decide(card, Decision.APPROVE, user="mallory")
        # a person can always say no
        await h.decide(card, Decision.REJECT, reason="not now")
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.REJECTED


def old_version_worker(h: Harness, settings: Settings, name: str = "payments") -> Worker:
    """A worker of an older version of the harness's app (or of app ``name``): it lacks
    create_pix_charge."""
    old_app = _app(name, without="create_pix_charge")
    old_app.services = h.provider
    return Worker(
        settings=settings.with_(worker_id="old-" + secrets.token_hex(3)),
        store=h.store,
        bus=h.bus,
        app=old_app,
        model=Scripted(),
    )


async def new_version_worker(h: Harness, settings: Settings, name: str | None = None) -> Worker:
    """A live worker of the harness's own app version (or of app ``name``, with every
    tool), started (stop it, then ``h.store.leave_app(worker.worker_id)``)."""
    app = h.worker.app
    if name is not None:
        app = _app(name)
        app.services = h.provider
    new = Worker(
        settings=settings.with_(worker_id="new-" + secrets.token_hex(3)),
        store=h.store,
        bus=h.bus,
        app=app,
        model=Scripted(),
    )
    me = presence.describe(app, new.worker_id, ["worker"])
    await h.store.join_app(me, presence.LIVE_SECONDS, lambda _: None)
    await new.start()
    return new


async def test_a_worker_leaves_an_approved_card_of_an_unknown_tool_to_a_worker_that_serves_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handover, "RETRY_SECONDS", 0.2)
    monkeypatch.setattr(handover, "RETRY_MAX_SECONDS", 0.5)
    # An app of its own: a live worker of another app serving a tool of the same name (a
    # test running beside this one on the same database) is not one the run goes to
    # (CI: the run was handed to one, and this test found no holder).
    name = "payments-" + secrets.token_hex(3)
    async with harness(database_url, model=Scripted(pix("42"))) as h:
        card = await one_card(h)
        settings = h.settings.with_(lease_seconds=1.0)
        await h.worker.stop()  # hands the parked run back (holder NULL)
        old = old_version_worker(h, settings, name)
        new: Worker | None = None
        try:
            await old.start()  # adopts the run, parks on the pending card
            assert (await h.store.get_run(card.run_id)).holder == old.worker_id
            await h.decide(card, Decision.APPROVE)
            await asyncio.sleep(1.0)  # several looks by `old`: nobody else serves the tool
            run = await h.store.get_run(card.run_id)
            assert (await h.store.get_card(card.id)).status is Status.APPROVED  # not invalidated
            assert run.holder == old.worker_id and run.status == "waiting"
            assert await h.charges() == 0
            # A live worker of another app serving a tool of that name does not take it.
            other = presence.describe(_app("other-" + name), "other-" + name, ["worker"])
            await h.store.join_app(other, presence.LIVE_SECONDS, lambda _: None)
            try:
                await asyncio.sleep(1.0)
                assert (await h.store.get_run(card.run_id)).holder == old.worker_id
            finally:
                await h.store.leave_app("other-" + name)

            # a worker of the version that proposed the card starts: the run goes there
            new = await new_version_worker(h, settings, name)
            deadline = asyncio.get_running_loop().time() + 15
            while (await h.store.get_card(card.id)).status is not Status.EXECUTED:
                assert asyncio.get_running_loop().time() < deadline, "not executed"
                await asyncio.sleep(0.1)
            events = [e.to_status for e in await h.store.card_events(card.id)]
            assert events == ["pending", "approved", "executing", "executed"]
            assert events[-1] == "executed" and await h.charges() == 1
            assert (await h.store.get_card(card.id)).decided_by == "alice"
        finally:
            await old.stop()
            if new is not None:
                await new.stop()
                await h.store.leave_app(new.worker_id)


# -- card lifetimes ----------------------------------------------------------------------------


async def test_a_rule_sets_the_lifetime_of_the_cards_it_matches(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix("42"))) as h:
        h.worker.agent.policy = Policy(
            [
                Rule(Verdict.ASK, risk=Risk.CRITICAL, tenant=h.tenant, ttl=timedelta(seconds=90)),
                *demo_policy().rules,
            ]
        )
        card = await one_card(h)
        lifetime = (card.expires_at - await h.store.pool.fetchval("SELECT now()")).total_seconds()
        assert 80 < lifetime <= 90
        # another tenant's cards keep the tool's own lifetime (10 minutes)
        h.worker.agent.policy = Policy(
            [Rule(Verdict.ASK, risk=Risk.CRITICAL, tenant="other", ttl=timedelta(seconds=90))]
        )
        card = await one_card(h, "bob")
        assert (card.expires_at - await h.store.pool.fetchval("SELECT now()")).total_seconds() > 590


async def test_a_card_with_a_short_policy_ttl_expires_and_the_model_is_told(
    database_url: str,
) -> None:
    model = Scripted(pix("42"))
    async with harness(database_url, model=model) as h:
        h.worker.agent.policy = demo_policy(timedelta(seconds=1))
        card = await one_card(h)
        deadline = asyncio.get_running_loop().time() + 10
        while (await h.store.get_run(card.run_id)).status != "done":
            assert asyncio.get_running_loop().time() < deadline, "the card did not expire"
            await asyncio.sleep(0.1)
        assert (await h.store.get_card(card.id)).status is Status.EXPIRED
        told = model.seen[-1][-1]["content"][0]
        assert told["type"] == "tool_result" and "expired" in str(told["content"])
        assert await h.charges() == 0
