"""Deciding cards: races, edits, revalidation, expiry (real Postgres)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.errors import (
    AlreadyDecided,
    CardNotFound,
    Conflict,
    Expired,
    Forbidden,
    IllegalTransition,
    InvalidInput,
    NotOwner,
    StaleCard,
    Unavailable,
)
from signoff.runtime.models.base import ModelReply
from tests import pgbouncer
from tests.harness import Harness, harness

pytestmark = pytest.mark.anyio


class Scripted:
    """A tiny in-process model for decision tests (the SDK path is covered elsewhere)."""

    name = "scripted"

    def __init__(self, *uses: dict[str, object]) -> None:
        self.uses = list(uses)
        self.calls = 0
        self.seen: list[list[dict[str, Any]]] = []

    async def respond(self, *, system, messages, tools, on_text=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.seen.append(messages)
        last = messages[-1]["content"]
        if not any(b.get("type") == "tool_result" for b in last):
            content = [
                {
                    "type": "tool_use",
                    "id": f"toolu_{self.calls}_{i}",
                    "name": u["name"],
                    "input": u["input"],
                }
                for i, u in enumerate(self.uses)
            ]
            return ModelReply(content=content, stop_reason="tool_use")
        return ModelReply(content=[{"type": "text", "text": "ok"}], stop_reason="end_turn")


def pix(amount: str = "150", customer: str = "João") -> dict[str, object]:
    return {"name": "create_pix_charge", "input": {"customer": customer, "amount": amount}}


async def one_card(h: Harness, user: str = "alice"):  # type: ignore[no-untyped-def]
    thread = await h.thread(user)
    await h.say(thread, "cobre", user)
    (card,) = await h.store.pending_cards(thread)
    return card


async def test_200_concurrent_approvals_one_winner(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        results = await asyncio.gather(
            *(h.decide(card, Decision.APPROVE) for _ in range(200)), return_exceptions=True
        )
        await h.settle()
        wins = [r for r in results if not isinstance(r, BaseException)]
        losses = [r for r in results if isinstance(r, BaseException)]
        assert len(wins) == 1
        assert len(losses) == 199
        assert all(isinstance(r, AlreadyDecided) for r in losses)
        assert {r.detail["decided_by"] for r in losses if isinstance(r, AlreadyDecided)} == {
            "alice"
        }
        events = await h.store.card_events(card.id)
        assert [e.to_status for e in events] == [
            "pending",
            "approved",
            "executing",
            "executed",
        ]
        assert events[1].actor == "alice" and events[1].hash_seen == card.snapshot_hash
        assert await h.charges() == 1
        ops = await h.store.pool.fetchval(
            "SELECT count(*) FROM operations WHERE card_id = $1", card.id
        )
        assert ops == 1


async def test_approve_reject_race_has_one_winner(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        results = await asyncio.gather(
            *(h.decide(card, d) for d in [Decision.APPROVE, Decision.REJECT] * 50),
            return_exceptions=True,
        )
        await h.settle()
        assert sum(not isinstance(r, BaseException) for r in results) == 1
        final = await h.store.get_card(card.id)
        assert final.status in (Status.EXECUTED, Status.REJECTED)
        assert await h.charges() == (1 if final.status is Status.EXECUTED else 0)


async def test_refusals_are_typed_and_change_nothing(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        before = await h.store.card_events(card.id)
        with pytest.raises(NotOwner):
            await h.decide(card, Decision.APPROVE, user="mallory")
        with pytest.raises(StaleCard):
            await h.decide(card, Decision.APPROVE, snapshot_hash="0" * 64)
        from signoff.runtime.decisions import Resolution

        with pytest.raises(InvalidInput, match="only accepted with decision 'edit'"):
            await h.decisions.resolve(  # even an empty map (the hostile probe)
                card.id,
                Resolution(decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash, edits={}),
                principal="alice",
                channel="test",
            )
        with pytest.raises(CardNotFound):
            await h.decisions.resolve(
                "00000000-0000-0000-0000-000000000000",
                __import__("signoff.runtime.decisions", fromlist=["Resolution"]).Resolution(
                    decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash
                ),
                principal="alice",
                channel="test",
            )
        assert (await h.store.get_card(card.id)).status is Status.PENDING
        assert await h.store.card_events(card.id) == before
        # expiry is the database's clock
        await h.store.pool.execute(
            "UPDATE cards SET expires_at = now() - interval '1 millisecond' WHERE id = $1", card.id
        )
        with pytest.raises(Expired):
            await h.decide(card, Decision.APPROVE)
        with pytest.raises(Expired):
            await h.edit(card, {"amount": "12"})
        assert (await h.store.get_card(card.id)).status is Status.PENDING
        await h.worker.sweep()
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.EXPIRED
        with pytest.raises(Expired):  # still 410 once the sweeper has tidied it
            await h.decide(card, Decision.APPROVE)
        with pytest.raises(Expired):  # an edit too (it was a 409 "card already expired")
            await h.edit(card, {"amount": "12"})
        assert await h.charges() == 0


async def test_edit_outside_whitelist_refused_allowed_edit_links_new_card(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted(pix("150"))) as h:
        card = await one_card(h)
        with pytest.raises(InvalidInput):
            await h.decide(card, Decision.EDIT, edits={"customer": "Maria"})
        with pytest.raises(InvalidInput):  # editable field, invalid value: prepare refuses
            await h.decide(card, Decision.EDIT, edits={"amount": "-3"})
        with pytest.raises(Forbidden) as denied:  # policy runs again: above the limit: DENY
            await h.decide(card, Decision.EDIT, edits={"amount": "20000"})
        # In the person's language too (a newcomer probe: English on a Portuguese page).
        assert "R$ 10.000,00" in denied.value.message
        assert denied.value.detail["localized"]["pt-BR"].startswith("a política não permite")
        assert (await h.store.get_card(card.id)).status is Status.PENDING
        # A person's edit is a field, not a document (a hostile probe stored 100k chars).
        with pytest.raises(InvalidInput, match="at most 2000 characters: description"):
            await h.decide(card, Decision.EDIT, edits={"description": "x" * 100_000})
        with pytest.raises(InvalidInput, match="at most 16 KB"):
            await h.decide(card, Decision.EDIT, edits={"description": ["x" * 1000] * 20})
        assert (await h.store.get_card(card.id)).status is Status.PENDING
        assert len(await h.store.card_events(card.id)) == 1

        out = await h.decide(card, Decision.EDIT, edits={"amount": "200"})
        await h.settle()
        old = await h.store.get_card(card.id)
        assert old.status is Status.MODIFIED
        assert out.new_card is not None
        new = await h.store.get_card(out.new_card["id"])
        assert old.superseded_by == new.id
        assert new.status is Status.PENDING
        assert new.snapshot_hash != card.snapshot_hash
        assert new.args_snapshot["amount_cents"] == 20000
        assert "R$ 200,00" in new.summary
        # the run now waits on the new card; approving it executes the edited amount
        await h.decide(new, Decision.APPROVE)
        await h.settle()
        assert (await h.store.get_card(new.id)).status is Status.EXECUTED
        amount = await h.provider.pool.fetchval(
            "SELECT amount FROM demo_charges WHERE idempotency_key = $1", new.operation_id
        )
        assert amount == 20000
        assert await h.charges() == 1


async def test_an_edit_the_tool_refuses_says_why_in_each_language(database_url: str) -> None:
    """The newcomer probe: "Inválido: amount 'abc' is not a number of reais" on a
    Portuguese page. A tool's refusal may be given per language (``ToolValidationError``
    with a ``Label``); the error carries them all (``detail.localized``) and the English
    one as its message; nothing changes."""
    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        from signoff.runtime.decisions import Resolution

        with pytest.raises(InvalidInput) as refused:
            await h.decisions.resolve(
                card.id,
                Resolution(
                    decision=Decision.EDIT,
                    snapshot_hash=card.snapshot_hash,
                    edits={"amount": "abc"},
                ),
                principal="alice",
                channel="test",
            )
        assert refused.value.message == "amount 'abc' is not a number of reais"
        assert "não é um número de reais" in refused.value.detail["localized"]["pt-BR"]
        assert (await h.store.get_card(card.id)).status is Status.PENDING


async def test_the_demos_refusals_of_an_edit_are_in_each_language(database_url: str) -> None:
    """A newcomer probe: "Inválido: only R$ 150,00 of sale V001 can be refunded" on a
    Portuguese page. The demo's tools refuse in both languages."""
    model = Scripted({"name": "refund_sale", "input": {"sale_id": "V001"}})
    async with harness(database_url, model=model) as h:
        card = await one_card(h)
        from signoff.runtime.decisions import Resolution

        with pytest.raises(InvalidInput) as refused:
            await h.decisions.resolve(
                card.id,
                Resolution(
                    decision=Decision.EDIT,
                    snapshot_hash=card.snapshot_hash,
                    edits={"amount": "500"},
                ),
                principal="alice",
                channel="test",
            )
        assert refused.value.message.startswith("only R$ ")  # what the model is told
        said = refused.value.detail["localized"]["pt-BR"]
        assert said.startswith("só R$ ") and "da venda V001 podem ser estornados" in said
        assert (await h.store.get_card(card.id)).status is Status.PENDING


async def test_an_edit_back_to_the_proposed_values_is_a_new_card(database_url: str) -> None:
    """150 -> 200 -> 150: the person changes their mind back. The third card carries the
    model's original values and is decidable (it was a 409 "an identical card already
    exists": the edit collided with the card it replaced, leaving only R$ 200 or no)."""
    async with harness(database_url, model=Scripted(pix("150"))) as h:
        card = await one_card(h)
        up = await h.decide(card, Decision.EDIT, edits={"amount": "200"})
        assert up.new_card is not None
        second = await h.store.get_card(up.new_card["id"])
        back = await h.decide(second, Decision.EDIT, edits={"amount": "150"})
        assert back.new_card is not None
        third = await h.store.get_card(back.new_card["id"])
        assert third.args_snapshot == card.args_snapshot and third.id != card.id
        assert (await h.store.get_card(second.id)).superseded_by == third.id
        await h.decide(third, Decision.APPROVE)
        await h.settle()
        assert (await h.store.get_card(third.id)).status is Status.EXECUTED
        assert await h.charges() == 1


async def test_edits_racing_on_one_card_make_one_card(database_url: str) -> None:
    """Twelve edits of one card at once, half of them back to the proposed amount (whose
    edited card is keyed by the card it replaces, not by its values): one wins, with its
    one new card; the others are refused, typed, and make none."""
    from signoff.runtime.errors import SignoffError

    async with harness(database_url, model=Scripted(pix("150"))) as h:
        card = await one_card(h)
        results = await asyncio.gather(
            *(
                h.decide(card, Decision.EDIT, edits={"amount": "150" if i % 2 else str(200 + i)})
                for i in range(12)
            ),
            return_exceptions=True,
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        assert len(won) == 1, results
        assert all(isinstance(r, SignoffError) for r in results if r not in won), results
        cards = await h.store.cards_of_run(card.run_id)
        assert len(cards) == 2  # the first and the one edit that won
        new = won[0].new_card
        assert new is not None and (await h.store.get_card(card.id)).superseded_by == new["id"]


async def test_a_run_recovered_with_a_repeated_call_still_proposes_one_card(
    database_url: str,
) -> None:
    """The worker died after the model's reply (two identical calls) was written, before
    the run parked: recovery proposes both again (idempotent), one card, the repeat told
    it was not proposed, and the approval executes once."""
    model = Scripted(pix("10"), pix("10"))
    async with harness(database_url, model=model) as h:
        thread = await h.thread("alice")
        run = await h.say(thread, "cobre 10 do João duas vezes", "alice")
        assert run is not None
        (card,) = await h.store.pending_cards(thread)
        # As a crash between the reply and the park leaves it: running, no state.
        await h.store.pool.execute(
            "UPDATE runs SET status = 'running', state = '{}' WHERE id = $1", run.id
        )
        recovered = await h.worker.agent.continue_run(run.id)
        assert recovered is not None and recovered.status == "waiting"
        assert recovered.state["waiting"] == {"toolu_1_0": card.id}
        assert recovered.state["results"]["toolu_1_1"]["content"].startswith("Not proposed")
        assert [c.id for c in await h.store.pending_cards(thread)] == [card.id]
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert await h.charges() == 1


async def test_revalidation_failure_invalidates_and_executes_nothing(database_url: str) -> None:
    model = Scripted({"name": "refund_sale", "input": {"sale_id": "V001"}})
    async with harness(database_url, model=model) as h:
        card = await one_card(h)
        await h.provider.set_balance(h.tenant, 100)  # the balance changed after the proposal
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.INVALIDATED
        assert final.result is not None
        assert final.result["changes"] == [
            {"field": "balance", "approved": "R$ 5.000,00", "current": "R$ 1,00"}
        ]
        refunds = await h.provider.pool.fetchval(
            "SELECT count(*) FROM demo_refunds WHERE tenant = $1", h.tenant
        )
        assert refunds == 0
        told = model.seen[-1][-1]["content"][0]
        assert "NOT executed" in told["content"] and "R$ 1,00" in told["content"]


async def test_a_reason_per_language_is_kept_for_the_page_and_told_in_english(
    database_url: str,
) -> None:
    """A revalidation's reason may be one per language (a ``Label``): the card keeps them
    all for the page (which shows the person's), the model is told the English one."""
    model = Scripted(pix("12"))
    async with harness(database_url, model=model) as h:
        card = await one_card(h)
        await h.provider.pool.execute(
            "UPDATE demo_customers SET active = false WHERE id = $1",
            card.args_snapshot["customer_id"],
        )
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.INVALIDATED and final.result is not None
        assert final.result["reason"] == {
            "pt-BR": "o cliente não está mais ativo",
            "en": "the customer is no longer active",
        }
        told = (await h.tool_result(card)).content
        assert "NOT executed: the customer is no longer active." in told, told
        assert "pt-BR" not in told and await h.charges() == 0


async def test_a_revalidation_that_raises_shows_a_fixed_reason_not_the_error(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool's ``revalidate`` that raises (a bug, not an unavailable service) invalidates
    the card; the person and the model read a fixed reason, not the exception's text
    (which may name internals: a table, a host); operators find the error in the audit."""
    async with harness(database_url, model=Scripted(pix("13")), gateway=True) as h:
        card = await one_card(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None

        async def broken(snapshot, ctx):  # type: ignore[no-untyped-def]
            raise KeyError("db-internal-7.example:5432 customers_v2")

        monkeypatch.setattr(tool, "revalidate", broken)  # the demo's tools are shared
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.INVALIDATED and final.result is not None
        assert "db-internal" not in str(final.result)
        assert final.result["reason"]["en"].startswith("the check of the current situation")
        told = (await h.tool_result(card)).content
        assert "db-internal" not in told and "NOT executed" in told
        audit = (await h.store.card_events(card.id))[-1]
        assert audit.to_status == "invalidated"
        assert "db-internal-7.example:5432" in str(audit.detail["error"])
        assert await h.charges() == 0
        # The owner's own read of the audit leaves the error out (a review: it was there).
        import httpx

        from tests.integration.test_gateway import auth

        async with httpx.AsyncClient() as c:
            r = await c.get(f"{h.base_url}/v1/cards/{card.id}/events", headers=auth(h, "alice"))
        assert r.status_code == 200 and r.json()["events"][-1]["to_status"] == "invalidated"
        assert "db-internal" not in r.text and "reason" in r.json()["events"][-1]["detail"]


async def test_two_identical_calls_in_one_turn_are_one_card_reported_once(
    database_url: str,
) -> None:
    """The model asks for the same write twice in one reply ("charge João 10, then charge
    João 10"): one card covers both (same tool, same arguments), and only the first call
    is told its outcome; the second is told it was not proposed and nothing ran for it
    (both were told "executed" with the same charge id, and the person read of two
    charges where one was made)."""
    model = Scripted(pix("10"), pix("10"))
    async with harness(database_url, model=model) as h:
        thread = await h.thread("alice")
        run = await h.say(thread, "cobre 10 do João e depois cobre 10 do João", "alice")
        assert run is not None
        (card,) = await h.store.pending_cards(thread)
        assert run.state["waiting"] == {"toolu_1_0": card.id}, run.state
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.EXECUTED
        assert await h.charges() == 1
        first, second = model.seen[-1][-1]["content"]
        assert first["tool_use_id"] == "toolu_1_0" and "executed" in first["content"]
        assert not first.get("is_error")
        assert second["tool_use_id"] == "toolu_1_1" and second["is_error"]
        assert second["content"].startswith("Not proposed: this call repeats toolu_1_0")


async def test_one_sale_is_never_refunded_twice(database_url: str) -> None:
    """The integrity prober's repro: two refund cards of one sale in two threads, both
    approved. Each ran once (I4), but both refunded the whole sale: the demo's revalidation
    looked at the balance only. Now the second is invalidated (the sale has nothing left),
    and the provider refuses a refund past the sale even when two were checked at once."""
    refund: dict[str, object] = {"name": "refund_sale", "input": {"sale_id": "V002"}}
    async with harness(database_url, model=Scripted(refund, refund)) as h:
        first = await one_card(h, "alice")
        second = await one_card(h, "bob")
        await h.decide(first, Decision.APPROVE)
        await h.settle()
        await h.decide(second, Decision.APPROVE)
        await h.settle()
        assert (await h.store.get_card(first.id)).status is Status.EXECUTED
        final = await h.store.get_card(second.id)
        assert final.status is Status.INVALIDATED
        assert final.result is not None
        assert final.result["changes"][0]["field"] == "refundable"
        sale = await h.provider.sale(h.tenant, "V002")
        assert sale is not None and sale["refunded"] == sale["amount"]

        from signoff.demo.provider import RefundRefused

        # Checked together, refused at the provider, in the person's money (a hostile
        # probe read "less than 10000 left", in cents).
        with pytest.raises(RefundRefused, match=r"less than R\$ 0,01 left to refund"):
            await h.provider.refund("other-key", h.tenant, "V002", 1)
        assert (
            await h.provider.pool.fetchval(
                "SELECT count(*) FROM demo_refunds WHERE tenant = $1", h.tenant
            )
            == 1
        )


@pytest.mark.parametrize("refused", [True, False], ids=["tool-refused", "driver-error"])
async def test_a_failed_write_shows_a_refusal_in_its_words_and_anything_else_by_kind(
    database_url: str, monkeypatch: pytest.MonkeyPatch, refused: bool
) -> None:
    """A hostile probe: a failed card's ``result.error`` was the tool's exception text,
    shown to the person over HTTP and WebSocket and told to the model, while the audit
    view kept it out ("may name internal hosts or tables"). A :class:`ToolRefused` is
    the provider's answer, meant for the person: its words are kept; anything else is
    shown by its kind, and the worker's log has the text."""
    from signoff import ToolRefused

    secret = 'relation "ledger" at 10.1.2.3:5432 is gone'
    model = Scripted(pix("9"))
    async with harness(database_url, model=model) as h:
        card = await one_card(h)
        tool = h.app.tools.get("create_pix_charge")
        assert tool is not None

        async def failing(snapshot: object, operation_id: str, ctx: object) -> object:
            raise (
                ToolRefused("the customer's Pix key is blocked")
                if refused
                else RuntimeError(secret)
            )

        monkeypatch.setattr(tool, "execute", failing)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.FAILED and final.result is not None
        if refused:
            assert final.result == {"error": "the customer's Pix key is blocked"}
        else:
            assert final.result == {"error": "the tool failed (RuntimeError)"}
            told = json.dumps(model.seen[-1][-1]["content"])
            assert "10.1.2.3" not in told and "RuntimeError" in told


async def test_batch_decisions(database_url: str) -> None:
    from signoff.runtime.decisions import Resolution

    async with harness(database_url, model=Scripted(pix("10"), pix("20", "Maria"))) as h:
        thread = await h.thread("erin")
        run = await h.say(thread, "duas cobranças", "erin")
        assert run is not None
        a, b = await h.store.pending_cards(thread)
        results = await h.decisions.resolve_batch(
            run.id,
            [
                (a.id, Resolution(decision=Decision.APPROVE, snapshot_hash=a.snapshot_hash)),
                (b.id, Resolution(decision=Decision.APPROVE, snapshot_hash="stale")),
            ],
            principal="erin",
            channel="test",
        )
        assert [r["ok"] for r in results] == [True, False]
        assert results[1]["error"] == "stale_hash"
        with pytest.raises(NotOwner):
            await h.decisions.resolve_batch(run.id, [], principal="mallory", channel="test")


async def test_a_batch_naming_a_card_of_another_run_learns_nothing(database_url: str) -> None:
    """A batch on one's own run naming someone else's card (another tenant's, another
    user's, or one's own of another run) is answered as for an id that does not exist:
    `card_not_found` (it was `invalid_input` "does not belong to run" for a real card,
    which told any token which card ids exist). Nothing changes; a run id spelled in
    capitals still matches its own cards."""
    import uuid

    from signoff.runtime.decisions import Resolution

    async with harness(database_url, model=Scripted(pix("10"))) as h:
        victim = await h.thread("alice")
        await h.say(victim, "cobre", "alice")
        (theirs,) = await h.store.pending_cards(victim)
        mine = await h.thread("mallory")
        run = await h.say(mine, "cobre", "mallory")
        assert run is not None
        (own,) = await h.store.pending_cards(mine)
        before = await h.store.card_events(theirs.id)

        def approve(card_id: str, hash_: str = "0" * 64) -> tuple[str, Resolution]:
            return card_id, Resolution(decision=Decision.APPROVE, snapshot_hash=hash_)

        answers = await h.decisions.resolve_batch(
            run.id,
            [approve(theirs.id, theirs.snapshot_hash), approve(str(uuid.uuid4()))],
            principal="mallory",
            channel="test",
        )
        assert [a["error"] for a in answers] == ["card_not_found", "card_not_found"], answers
        # and in the same words, but for the id each names
        assert [a["message"].replace(a["card_id"], "X") for a in answers] == [
            "card X not found",
            "card X not found",
        ], answers
        assert (await h.store.get_card(theirs.id)).status is Status.PENDING
        assert await h.store.card_events(theirs.id) == before
        (ok,) = await h.decisions.resolve_batch(
            run.id.upper(),
            [approve(own.id, own.snapshot_hash)],
            principal="mallory",
            channel="test",
        )
        assert ok["ok"], ok


async def test_stuck_execution_is_flagged_never_retried(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix("5"))) as h:
        card = await one_card(h)
        await h.store.decide(
            card.id,
            principal="alice",
            decision=Decision.APPROVE,
            snapshot_hash=card.snapshot_hash,
            channel="test",
        )
        # a worker won approved -> executing and then died before recording the result
        started = await h.store.begin_execution(card.id, "worker:dead")
        assert started is not None
        assert await h.store.begin_execution(card.id, "worker:other") is None  # one winner
        # (The database is shared by the session's tests: other tests' cards are ignored.)
        assert card.id not in {c.id for c in await h.store.flag_stuck(3600)}  # not stuck yet
        # An operator settling it now, unflagged, started a moment ago: its worker may be
        # inside the provider call (integrity probe F1: the call then charged a card
        # settled `failed`). `signoff cards reconcile` passes a lease + a tool deadline.
        with pytest.raises(Conflict, match="may still be calling the provider"):
            await h.store.reconcile(
                card.id, executed=False, actor="operator", note="early", in_flight_seconds=60
            )
        assert (await h.store.get_card(card.id)).status is Status.EXECUTING  # unchanged
        flagged = [c for c in await h.store.flag_stuck(0) if c.id == card.id]
        assert [c.id for c in flagged] == [card.id]
        assert flagged[0].needs_reconciliation
        assert flagged[0].status is Status.EXECUTING
        assert card.id not in {c.id for c in await h.store.flag_stuck(0)}  # flagged once
        assert await h.charges() == 0  # nothing retried it
        done = await h.store.reconcile(  # flagged: settled at once, however recent
            card.id,
            executed=False,
            actor="operator",
            note="no charge at the provider",
            in_flight_seconds=60,
        )
        assert not done.needs_reconciliation
        assert done.status is Status.FAILED
        audit = await h.store.card_events(card.id)
        assert (audit[-1].to_status, audit[-1].actor) == ("failed", "operator")
        assert audit[-1].detail == {"reconciled": "no charge at the provider"}
        assert await h.store.flag_stuck(0) == []  # settled: never flagged again
        with pytest.raises(IllegalTransition):
            await h.store.reconcile(card.id, executed=True, actor="operator", note="again")


async def test_known_outcome_is_recorded_despite_a_passing_store_timeout(
    database_url: str,
) -> None:
    """The provider charged; the first attempts to record `executed` time out (a real store
    call that fails, injected around the real Postgres store): the outcome is still
    recorded, not left `executing` for an operator."""
    from signoff.runtime.errors import Unavailable

    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        real = h.store.finish_execution
        failures = 2

        async def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal failures
            if failures:
                failures -= 1
                raise Unavailable("statement timeout")
            return await real(*args, **kwargs)

        h.store.finish_execution = flaky
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert failures == 0
        assert (await h.store.get_card(card.id)).status is Status.EXECUTED
        assert await h.charges() == 1


async def test_a_known_outcome_is_recorded_however_long_the_store_stays_away(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The integrity probe's F1: past five failed attempts (~8 s of a Postgres outage or
    a locked thread row) the known outcome was dropped; the card stayed `executing`, the
    model was told the outcome is unknown, the charge id never reached the person. It
    is tried until it is recorded."""
    from signoff.runtime import execution
    from signoff.runtime.errors import Unavailable

    monkeypatch.setattr(execution, "RECORD_RETRIES", (0.01,))  # the waits, not the count
    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        real = h.store.finish_execution
        failures = 25

        async def away(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal failures
            if failures:
                failures -= 1
                raise Unavailable("Postgres refused: the database system is shutting down")
            return await real(*args, **kwargs)

        h.store.finish_execution = away
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert failures == 0
        done = await h.store.get_card(card.id)
        assert done.status is Status.EXECUTED and done.result is not None
        assert "outcome is unknown" not in (await h.tool_result(card)).content
        assert await h.charges() == 1


async def test_a_revalidation_that_hangs_leaves_the_card_approved_and_is_tried_again(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The integrity probe's F3: a revalidation stuck on a dead connection held the run
    for ever (the card `approved`, the worker alive, so nobody adopted it). It is given
    up at ``SIGNOFF_TOOL_TIMEOUT_SECONDS`` without a verdict on the card (not invalidated:
    the service did not answer), and the run is continued again once it answers."""
    settings = Settings(tool_timeout_seconds=0.2)
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        card = await one_card(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        real = tool.revalidate
        hangs = {"left": 2}

        async def hanging(snapshot, ctx):  # type: ignore[no-untyped-def]
            if hangs["left"]:
                hangs["left"] -= 1
                await asyncio.sleep(3600)
            return await real(snapshot, ctx)

        monkeypatch.setattr(tool, "revalidate", hanging)  # the demo's tools are shared
        await h.decide(card, Decision.APPROVE)
        await asyncio.sleep(0.3)
        assert (await h.store.get_card(card.id)).status is Status.APPROVED  # no verdict
        deadline = asyncio.get_running_loop().time() + 15  # tried again 0.5 s, 1 s later
        while (await h.store.get_card(card.id)).status is not Status.EXECUTED:
            assert asyncio.get_running_loop().time() < deadline, "not executed"
            await asyncio.sleep(0.05)
        assert hangs["left"] == 0 and await h.charges() == 1


async def test_an_execution_that_hangs_is_an_unknown_outcome_asked_again_with_its_key(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider call that never answers is given up at the tool timeout and asked again
    with the same operation_id (the provider deduplicates); one that keeps hanging leaves
    the card `executing` for reconciliation, and the model is told the outcome is unknown."""
    from signoff.runtime import execution

    monkeypatch.setattr(execution, "UNKNOWN_OUTCOME_RETRIES", (0.01, 0.01))
    settings = Settings(tool_timeout_seconds=0.2)
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        card = await one_card(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        keys: list[str] = []

        async def hanging(snapshot, operation_id, ctx):  # type: ignore[no-untyped-def]
            keys.append(operation_id)
            await asyncio.sleep(3600)

        monkeypatch.setattr(tool, "execute", hanging)  # the demo's tools are shared
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert keys == [card.operation_id] * 3
        left = await h.store.get_card(card.id)
        # Flagged at once (integrity probe F2: the model was told "flagged for an
        # operator" while nothing listed it for SIGNOFF_STUCK_AFTER_SECONDS), audited.
        assert left.status is Status.EXECUTING and left.needs_reconciliation
        flag = (await h.store.card_events(card.id))[-1]
        assert flag.to_status == "executing" and "answer is unknown" in flag.detail["reason"]
        told = (await h.tool_result(card)).content
        assert "outcome is unknown" in told and "flagged for an operator" in told


async def test_recording_the_outcome_of_a_flagged_card_clears_its_flag(
    database_url: str,
) -> None:
    """The integrity probe's F7: a card flagged for reconciliation while its worker was
    paused, whose worker then recorded `executed`, kept the flag: `signoff cards list`
    showed it [RECONCILE] for ever, and reconcile refused it (not `executing`)."""
    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        await h.store.db.execute(  # as if the worker had paused right after `executing`
            "UPDATE cards SET status = 'executing', result = NULL, "
            "executing_since = now() - interval '1 hour' WHERE id = $1",
            card.id,
        )
        assert card.id in {c.id for c in await h.store.flag_stuck(0)}
        done = await h.store.finish_execution(
            card.id, ok=True, result={"charge_id": "c1"}, actor="worker:paused"
        )
        assert done is not None
        assert done.card.status is Status.EXECUTED and not done.card.needs_reconciliation
        assert not (await h.store.get_card(card.id)).needs_reconciliation


async def test_an_answer_after_an_operator_settled_the_card_is_audited_not_lost(
    database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A review's finding: the provider call was still in flight when an operator, seeing
    the card flagged, reconciled it `failed`; the call then succeeded and its answer was
    dropped (the recording move found the card no longer `executing`): a real charge on
    a card settled `failed`, and nothing said so. It is written to the card's audit and
    logged as an ERROR naming the operation; the card keeps the operator's status."""
    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        real, entered, go_on = tool.execute, asyncio.Event(), asyncio.Event()

        async def slow(snapshot, operation_id, ctx):  # type: ignore[no-untyped-def]
            entered.set()
            await go_on.wait()
            return await real(snapshot, operation_id, ctx)

        monkeypatch.setattr(tool, "execute", slow)  # the demo's tools are shared
        from signoff.runtime.metrics import COUNTERS

        late_before = COUNTERS.values["signoff_late_outcomes_total"]
        await h.decide(card, Decision.APPROVE)
        await asyncio.wait_for(entered.wait(), 10)
        # While the card is `executing`, nothing is written (the recording move will be).
        assert await h.store.late_outcome(card.id, "succeeded", {}, "x") is None
        await h.store.reconcile(card.id, executed=False, actor="ops", note="no charge seen")
        go_on.set()
        await h.settle()
        final = await h.store.get_card(card.id)
        assert final.status is Status.FAILED and await h.charges() == 1
        late = (await h.store.card_events(card.id))[-1]
        assert (late.from_status, late.to_status) == ("failed", "failed")
        assert late.actor == f"worker:{h.worker.worker_id}"
        assert late.detail["late_outcome"] == "succeeded" and late.detail["result"]
        assert COUNTERS.values["signoff_late_outcomes_total"] == late_before + 1
        errors = [r for r in caplog.records if "after the card was settled" in r.getMessage()]
        assert errors and errors[-1].levelname == "ERROR", errors
        assert card.operation_id in errors[-1].getMessage()


async def test_a_late_answer_is_told_apart_from_a_retried_record_and_never_raises(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A review's findings: the record of an outcome whose commit's reply was lost is
    retried and finds the card settled by that same answer (not a late answer: nothing
    is written); and a store that fails while a late answer is written must not turn
    the step into an error (the answer is then in the log)."""
    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        done = await h.store.get_card(card.id)
        assert done.status is Status.EXECUTED and done.result is not None
        before = len(await h.store.card_events(card.id))
        assert await h.store.late_outcome(card.id, "succeeded", done.result, "w") is None
        other = {**done.result, "charge_id": "another"}
        assert await h.store.late_outcome(card.id, "succeeded", other, "w") is Status.EXECUTED
        assert len(await h.store.card_events(card.id)) == before + 1
        executor = h.worker.agent.executor

        async def broken(*args: object) -> None:
            raise Unavailable("the store is away")

        executor.store = _Patched(executor.store, late_outcome=broken)  # type: ignore[assignment]
        with caplog.at_level("ERROR", logger="signoff.agent"):
            await executor._late_outcome(done, "op-1", True, {"charge_id": "c9"}, "worker:w")
        assert "op-1" in caplog.text and "c9" in caplog.text and "not written" in caplog.text


class _Patched:
    """A store with some methods replaced."""

    def __init__(self, store: object, **methods: object) -> None:
        self._store, self._methods = store, methods

    def __getattr__(self, name: str) -> object:
        return self._methods.get(name) or getattr(self._store, name)


async def test_a_run_adopted_again_gives_its_executing_card_a_whole_window_again(
    database_url: str,
) -> None:
    """A review's finding: an adopter kept the moment it first saw a card `executing`
    across a take-back by the previous holder and a second adoption, so it flagged the
    card at once, while the holder might be in the middle of the call (note 49)."""
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=0.3)
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        card = await one_card(h)
        await h.store.db.execute("UPDATE cards SET status = 'executing' WHERE id = $1", card.id)
        executor = h.worker.agent.executor
        with pytest.raises(Unavailable, match="executing in the run's previous holder"):
            await h.worker.agent.continue_run(card.run_id)
        first = executor.elsewhere.first_seen(card.id)
        await asyncio.sleep(1.4)  # past the window, before this worker looked again
        # Meanwhile taken back and let go again (a holder whose lease lapsed twice).
        await h.store.db.execute("UPDATE runs SET worker_id = NULL WHERE id = $1", card.run_id)
        await h.worker.adopt()  # (parked here: taken, not continued again)
        assert (await h.store.get_run(card.run_id)).holder == h.worker.worker_id
        seen = executor.elsewhere.first_seen(card.id)
        assert seen is None or (first is not None and seen > first)
        await asyncio.sleep(0.3)
        assert not (await h.store.get_card(card.id)).needs_reconciliation  # not at once


def test_tool_specs_are_built_once() -> None:
    from signoff.demo.tools import ALL_TOOLS
    from signoff.runtime.tools import Registry

    reg = Registry(ALL_TOOLS)
    assert reg.specs() is reg.specs()


async def test_log_entries_show_the_card_as_the_api_does(database_url: str) -> None:
    """Card entries are built in SQL (card_json in scripts/generate_queries.py) in the same
    statement as the move: they must equal Card.public() field for field, timestamps
    included."""
    async with harness(database_url, model=Scripted(pix("7"))) as h:
        card = await one_card(h)
        (proposed,) = [
            e for e in await h.store.entries_after(card.thread_id, 0) if e.kind == "card"
        ]
        assert proposed.body == card.public()
        moved = await h.store.decide(
            card.id,
            principal="alice",
            decision=Decision.APPROVE,
            snapshot_hash=card.snapshot_hash,
            channel="test",
        )
        assert moved.card.status is Status.APPROVED
        assert moved.entry.kind == "card_update"
        assert moved.entry.body == moved.card.public()
        assert set(moved.entry.body) == set(Card.__struct_fields__)
        stored = await h.store.entries_after(card.thread_id, moved.entry.seq - 1)
        assert stored[0].seq == moved.entry.seq
        assert stored[0].body == moved.card.public()
        # a timestamp on a whole second is written without a fraction, as msgspec does
        conn_card = await h.store.move(
            card.id, Status.APPROVED, Status.EXECUTING, actor="test", result={"at": 1}
        )
        assert conn_card is not None
        assert conn_card.entry.body == conn_card.card.public()


@pytest.mark.parametrize("micro", [0, 1, 120000, 999999])
async def test_sql_timestamps_match_msgspec(database_url: str, micro: int) -> None:
    import msgspec

    from scripts.generate_queries import ts

    at = datetime(2026, 11, 30, 23, 59, 59, micro, tzinfo=UTC)
    conn = await pgbouncer.connect(database_url)
    try:
        await conn.execute("SET TIME ZONE 'America/Sao_Paulo'")  # the session zone must not matter
        text = await conn.fetchval(f"SELECT {ts('$1::timestamptz')}", at)
    finally:
        await conn.close()
    assert text == msgspec.to_builtins(at)


async def test_a_refusal_after_an_unanswered_attempt_leaves_the_card_executing(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review's D4: the first call timed out (the provider may have acted), the repeat
    with the same key was refused ("key in use", as some providers answer a request
    still in flight): the card was recorded `failed` while a charge may exist (G2). It
    stays `executing` for reconciliation."""
    from signoff.runtime import execution

    monkeypatch.setattr(execution, "UNKNOWN_OUTCOME_RETRIES", (0.01, 0.01))
    settings = Settings(tool_timeout_seconds=0.2)
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        card = await one_card(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        calls: list[str] = []

        async def slow_then_refusing(snapshot, operation_id, ctx):  # type: ignore[no-untyped-def]
            calls.append(operation_id)
            if len(calls) == 1:
                await asyncio.sleep(3600)
            raise RuntimeError("idempotency_key_in_use: a request with this key is in flight")

        monkeypatch.setattr(tool, "execute", slow_then_refusing)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert len(calls) == 2
        assert (await h.store.get_card(card.id)).status is Status.EXECUTING


@pytest.mark.parametrize("adopted", ["no", "untold", "told"])
async def test_a_repeat_after_the_lease_lapsed_is_sent_only_if_nobody_was_told(
    database_url: str, monkeypatch: pytest.MonkeyPatch, adopted: str
) -> None:
    """The review's D3: attempt 0 got no answer, the worker then lost its lease (paused,
    or cut off from Postgres) and renewed it (the row is upserted: the lease revives),
    and attempt 1 was sent, though the run may have been adopted meanwhile and its
    model told the outcome is unknown. A renewal after a lapse starts a new epoch; an
    execution begun in an earlier one asks the database before sending again: the repeat
    goes out if the card is still `executing` in a run this worker holds, or in one
    adopted meanwhile whose new holder has not stepped past the card (the worker takes
    it back: a Postgres restart must not fail approvals, the fault suite lost two). If
    the adopter told its model (the run no longer waits on the card), nothing is sent
    and the card stays `executing` for reconciliation."""
    import time

    from signoff.runtime import execution

    monkeypatch.setattr(execution, "UNKNOWN_OUTCOME_RETRIES", (0.05, 0.05))
    settings = Settings(tool_timeout_seconds=0.2)
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        lease = h.worker.lease
        assert h.worker.agent.executor.lease is lease and lease.epoch >= 1
        card = await one_card(h)
        tool = h.worker.agent.tools.get("create_pix_charge")
        assert tool is not None
        calls: list[str] = []

        async def unanswered_then_lapse(snapshot, operation_id, ctx):  # type: ignore[no-untyped-def]
            calls.append(operation_id)
            if len(calls) == 1:
                lease.until = 0.0  # lapsed while the call hung ...
                lease.renewed(time.monotonic())  # ... and renewed: a new epoch
                if adopted != "no":  # ... and another worker took the run meanwhile
                    await h.store.db.execute(
                        "UPDATE runs SET worker_id = 'other-worker' WHERE id = $1", card.run_id
                    )
                if adopted == "told":  # ... and stepped past the card (told its model)
                    await h.store.db.execute(
                        "UPDATE runs SET state = '{}'::jsonb WHERE id = $1", card.run_id
                    )
                await asyncio.sleep(3600)
            return {"charge_id": "ch-1"}

        monkeypatch.setattr(tool, "execute", unanswered_then_lapse)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        status = (await h.store.get_card(card.id)).status
        holder = await h.store.db.fetchval("SELECT worker_id FROM runs WHERE id = $1", card.run_id)
        if adopted == "told":
            assert calls == [card.operation_id]  # the repeat was not sent
            assert status is Status.EXECUTING
            assert holder == "other-worker"
        else:
            assert calls == [card.operation_id] * 2  # the database vouched: sent again
            assert status is Status.EXECUTED
            assert holder == h.worker.worker_id  # taken back from an adopter that waited


async def test_the_fence_refuses_a_card_flagged_for_reconciliation(database_url: str) -> None:
    """An operator may be reconciling a flagged card from the provider's records: a
    worker back from a pause sends nothing for it, whoever holds the run."""
    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        await h.store.db.execute(
            "UPDATE cards SET status = 'executing', needs_reconciliation = true WHERE id = $1",
            card.id,
        )
        me = h.worker.worker_id
        assert not await h.store.execution_fence(card.id, me, 5.0)
        await h.store.db.execute(
            "UPDATE cards SET needs_reconciliation = false WHERE id = $1", card.id
        )
        assert await h.store.execution_fence(card.id, me, 5.0)


async def test_an_adopter_leaves_a_card_executing_elsewhere_alone_for_a_lease(
    database_url: str,
) -> None:
    """The fault suite's Postgres restart: a worker cut off from Postgres had started a
    card; the other worker adopted the run when Postgres came back and told its model
    at once that the outcome was unknown, so the first, back a moment later, could only
    record `failed` ("not sent"): an approval lost to a restart. The adopter now waits
    a lease (the run is continued again later) before telling the model; the first
    worker takes the run back meanwhile (``worker_fence``) and executes the card."""
    settings = Settings(lease_seconds=1.0, tool_timeout_seconds=0.3)
    async with harness(database_url, model=Scripted(pix("9")), settings=settings) as h:
        card = await one_card(h)
        # Another worker started it (approved, then `executing`) and was cut off.
        await h.store.db.execute("UPDATE cards SET status = 'executing' WHERE id = $1", card.id)
        with pytest.raises(Unavailable, match="executing in the run's previous holder"):
            await h.worker.agent.continue_run(card.run_id)
        assert (await h.store.get_run(card.run_id)).status.value == "waiting"
        assert await h.store.execution_fence(card.id, "the-first-worker", 5.0)  # back: its own
        holder = await h.store.db.fetchval("SELECT worker_id FROM runs WHERE id = $1", card.run_id)
        assert holder == "the-first-worker"
        run = await h.worker.agent.continue_run(card.run_id)  # left to its holder ...
        assert run is not None and run.holder == "the-first-worker"
        await h.store.db.execute(  # ... which loses it again: nobody comes back this time
            "UPDATE runs SET worker_id = $2 WHERE id = $1", card.run_id, h.worker.worker_id
        )
        from signoff.runtime.metrics import COUNTERS

        flagged_before = COUNTERS.values["signoff_cards_flagged_total"]
        with pytest.raises(Unavailable, match="executing in the run's previous holder"):
            await h.worker.agent.continue_run(card.run_id)  # a whole lease again (review)
        await asyncio.sleep(1.0)  # a lease, not yet a lease and a tool call: still waiting
        with pytest.raises(Unavailable, match="executing in the run's previous holder"):
            await h.worker.agent.continue_run(card.run_id)
        await asyncio.sleep(0.35)  # a lease and a tool call since: told unknown, as before
        run = await h.worker.agent.continue_run(card.run_id)
        assert run is not None and run.status.value == "done"
        told = [
            b
            for e in await h.store.entries_after(card.thread_id, 0)
            if e.kind == "tool_results"
            for b in e.body["content"]
            if b["tool_use_id"] == card.tool_use_id
        ]
        assert len(told) == 1 and "outcome is unknown" in str(told[0]), told
        assert await h.charges() == 0
        # Flagged before the model was told, so the first worker, back now, sends nothing.
        assert (await h.store.get_card(card.id)).needs_reconciliation
        assert not await h.store.execution_fence(card.id, "the-first-worker", 5.0)
        events = await h.store.card_events(card.id)
        assert events[-1].actor == f"worker:{h.worker.worker_id}"
        from signoff.runtime.cli_cards import _shown

        shown = _shown(await h.store.get_card(card.id), events)  # `signoff cards show`
        assert "[RECONCILE" in shown and "previous holder" in shown, shown
        assert COUNTERS.values["signoff_cards_flagged_total"] == flagged_before + 1
        flagged = await h.store.operator.find_cards(flagged=True, thread_id=card.thread_id)
        assert [c.id for c in flagged] == [card.id]  # `signoff cards list --reconcile`


async def test_only_the_runs_holder_starts_or_flags_its_cards(database_url: str) -> None:
    """A worker held up while its run was adopted must not start one of the run's approved
    cards (the adopter executes it, and would read it as `executing` elsewhere: an
    outcome told unknown for a card that executed), nor may an adopter flag a card of a
    run taken back from it."""
    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        await h.store.db.execute("UPDATE cards SET status = 'approved' WHERE id = $1", card.id)
        me = h.worker.worker_id
        assert await h.store.begin_execution(card.id, "worker:late", "late") is None
        assert (await h.store.get_card(card.id)).status is Status.APPROVED
        started = await h.store.begin_execution(card.id, f"worker:{me}", me)
        assert started is not None and started.card.status is Status.EXECUTING
        assert await h.store.flag_elsewhere(card.run_id, "not-the-holder", [card.id]) == []
        assert await h.store.flag_elsewhere(card.run_id, me, [card.id]) == [card.id]
        assert await h.store.flag_elsewhere(card.run_id, me, [card.id]) == []  # once


async def test_an_approval_right_after_a_postgres_outage_still_executes(
    database_url: str,
) -> None:
    """The fault suite's Postgres restart under load: renewals failed through the outage,
    so the worker's own clock no longer vouched for its lease when the approvals came
    through, and two were recorded `failed` ("not sent") though nobody else held their
    runs. The database vouches instead (one statement that renews the lease): executed."""
    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        h.worker.lease.until = 0.0  # the renewals of the outage all failed
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert (await h.store.get_card(card.id)).status is Status.EXECUTED
        assert await h.charges() == 1
        assert h.worker.lease.holds()  # renewed by the same statement


@pytest.mark.parametrize("which", ["read", "prepare"])
async def test_a_hung_read_or_prepare_is_told_to_the_model_and_frees_the_run(
    database_url: str, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """A read tool's call or a write's `prepare` hung on a dead connection held its run
    (and the run's lock) for ever on a live worker, as a hung revalidation did: nobody
    adopts the runs of a live worker. Both have the tool deadline now: the model is told
    the tool did not answer and that nothing was done, and the turn ends."""
    use: dict[str, object] = {"name": "get_balance", "input": {}} if which == "read" else pix("9")
    settings = Settings(tool_timeout_seconds=0.2)
    async with harness(database_url, model=Scripted(use), settings=settings) as h:
        tool = h.worker.agent.tools.get(str(use["name"]))
        assert tool is not None

        async def hang(*args: object) -> object:
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

        monkeypatch.setattr(tool, "execute" if which == "read" else "prepare", hang)
        thread = await h.thread("alice")
        await h.say(thread, "quanto tenho?" if which == "read" else "cobre", "alice")
        await h.settle()
        assert await h.store.pending_cards(thread) == []
        results = [e for e in await h.store.entries_after(thread, 0) if e.kind == "tool_results"]
        (block,) = results[0].body["content"]
        assert block["is_error"] and "did not answer in time (0.2 s)" in str(block["content"])
        assert "nothing was done" in str(block["content"])
        (run,) = [e for e in await h.store.entries_after(thread, 0) if e.kind == "run"]
        assert run.body["status"] == "done"


async def test_a_charge_whose_provider_statement_was_cancelled_goes_through_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The integrity probe's R1: a Postgres restart while charges were in flight recorded
    them `failed` ("the database system is shutting down"), nothing charged: the demo
    provider let asyncpg's errors escape, which the executor reads as a failure for good.
    Its calls now raise ConnectionError when the database does not answer or stops the
    statement for a reason of its own (here an operator cancels it): an unknown outcome,
    asked again with the same key, and the charge is made once."""
    from signoff.runtime import execution

    monkeypatch.setattr(execution, "UNKNOWN_OUTCOME_RETRIES", (0.05, 0.2, 0.5))
    async with harness(database_url, model=Scripted(pix("9"))) as h:
        card = await one_card(h)
        blocker = await pgbouncer.connect(database_url)
        try:
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute("LOCK TABLE demo_charges IN EXCLUSIVE MODE")
            decided = asyncio.ensure_future(h.decide(card, Decision.APPROVE))
            deadline = asyncio.get_running_loop().time() + 10
            while not (
                pid := await h.store.db.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'INSERT INTO demo_charges%'"
                )
            ):
                assert asyncio.get_running_loop().time() < deadline, "the charge never waited"
                await asyncio.sleep(0.02)
            assert await h.store.db.fetchval("SELECT pg_cancel_backend($1)", pid)
            await asyncio.sleep(0.02)
            await tx.rollback()
            await decided
        finally:
            await blocker.close()
        await h.settle()
        done = await h.store.get_card(card.id)
        assert done.status is Status.EXECUTED, done.result
        assert await h.charges() == 1


async def test_a_card_another_process_started_first_is_left_to_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The integrity probe's S1: a holder held up while its run was adopted started the
    card with a statement older than the adoption; the adopter, finding it `executing`
    when its own start lost, told its model at once that the outcome was unknown (no
    wait, no flag), and the first worker, back, could only record `failed`. It is left
    to the other process as a card found `executing` is: looked at again later."""
    from signoff.runtime.errors import ExecutingElsewhere

    async with harness(database_url, model=Scripted(pix("9")), start_worker=False) as h:
        card = await one_card(h)
        await h.store.decide(
            card.id,
            principal=card.owner,
            decision=Decision.APPROVE,
            snapshot_hash=card.snapshot_hash,
            channel="test",
        )
        real = h.store.begin_execution

        async def beaten(card_id: str, actor: str, *args: Any) -> Any:
            await h.store.db.execute(  # the other process's start commits first
                "UPDATE cards SET status = 'executing' WHERE id = $1", card_id
            )
            return await real(card_id, actor, *args)

        monkeypatch.setattr(h.store, "begin_execution", beaten)
        with pytest.raises(ExecutingElsewhere, match="started by another process"):
            await h.worker.agent.continue_run(card.run_id)
        run = await h.store.get_run(card.run_id)
        assert run.status.value == "waiting"
        kinds = [e.kind for e in await h.store.entries_after(card.thread_id, 0)]
        assert "tool_results" not in kinds


async def test_the_demo_finds_a_customer_by_name_not_by_pattern(database_url: str) -> None:
    """A hostile probe: the demo's customer search put the asked-for name into a LIKE
    pattern as written, so a model asking for "%" (or "_") listed every customer of the
    tenant. Those characters now stand for themselves; "joao" still finds João."""
    async with harness(database_url, model=Scripted()) as h:
        assert [c["name"] for c in await h.provider.find_customers(h.tenant, "joao")] == [
            "João Silva"
        ]
        for pattern in ("%", "_", "%a%", "\\"):
            assert await h.provider.find_customers(h.tenant, pattern) == [], pattern
