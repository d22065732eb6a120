"""One WhatsApp delivery carries several messages: each is handled on its own (in process)."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import httpx
import msgspec
import pytest

from signoff.gateway.channels.whatsapp import inbound, webhook
from signoff.gateway.channels.whatsapp.webhook import WhatsAppChannel
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.errors import Unavailable
from signoff.store.whatsapp import DeliveryClaim
from signoff.testing import Harness, button_message, delivery, signed, text_message
from tests.harness import harness
from tests.integration.test_decisions import Scripted, pix
from tests.integration.test_quotas import queued_jobs

pytestmark = pytest.mark.anyio

WA_SECRET = "wa-app-secret-delivery"


def wa_settings() -> Settings:
    return Settings(
        whatsapp_phone_number_id="100",
        whatsapp_token="wa-token",
        whatsapp_app_secret=WA_SECRET,
        whatsapp_verify_token="verify",
        whatsapp_base_url="http://127.0.0.1:9",  # nothing is sent in these tests
        whatsapp_text_confirm_settle_seconds=0.2,
    )


def channel_of(asgi: Any) -> WhatsAppChannel:
    for route in asgi.routes:
        endpoint = getattr(route, "endpoint", None)
        owner = getattr(endpoint, "__self__", None)
        if isinstance(owner, WhatsAppChannel):
            return owner
    raise AssertionError("no WhatsApp channel on this gateway")


async def test_a_message_that_fails_is_redelivered_and_the_others_are_handled(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first message of a delivery fails in a way nothing typed (a bug): it is not
    marked seen, so Meta's redelivery gets it again, and the answer is a typed 500; the
    message after it is handled all the same, and once. (The loop re-raised: the rest of
    the delivery was lost with it, at every redelivery.)"""
    settings = wa_settings()
    async with harness(
        database_url, model=Scripted(pix()), gateway=True, settings=settings, start_worker=False
    ) as h:
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        bad, good = text_message(wa_id, "cobre 10 do João"), text_message(wa_id, "saldo")
        channel = channel_of(h.asgi)
        handle = channel.handle
        broken = {bad["id"]}

        async def failing(item: inbound.Inbound, claim: DeliveryClaim) -> None:
            if item.message_id in broken:
                raise RuntimeError("a bug in handling this one")
            await handle(item, claim)

        monkeypatch.setattr(channel, "handle", failing)
        body = delivery(bad, good)

        async def post() -> httpx.Response:
            async with httpx.AsyncClient(base_url=h.base_url) as client:
                return await client.post(
                    "/v1/whatsapp/webhook", content=body, headers=signed(body, WA_SECRET)
                )

        async def seen(message: dict[str, Any]) -> bool:
            return bool(
                await h.store.pool.fetchval(
                    "SELECT handled FROM deliveries WHERE channel = 'whatsapp' AND message_id = $1",
                    message["id"],
                )
            )

        r = await post()
        assert r.status_code == 500 and r.json()["error"] == "internal", r.text
        assert not await seen(bad) and await seen(good)
        assert [j.text for j in await queued_jobs(h)] == ["saldo"]
        # Fixed (the bug gone): Meta's redelivery handles the first, not the second again.
        broken.clear()
        assert (await post()).status_code == 200
        assert [j.text for j in await queued_jobs(h)] == ["cobre 10 do João"]


async def test_a_message_claimed_by_a_gateway_that_died_is_handled_once_its_claim_lapses(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile probe: a gateway killed while it handled a message had marked it seen,
    and every redelivery was answered 200 and dropped. A live claim is answered 503 (Meta
    sends it again later); a lapsed one is handled by the redelivery, once (design note
    64)."""
    monkeypatch.setattr(webhook, "BUSY_WAIT_SECONDS", 0.3)
    settings = wa_settings()
    async with harness(
        database_url, model=Scripted(pix()), gateway=True, settings=settings, start_worker=False
    ) as h:
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        message = text_message(wa_id, "cobre 12 do João")
        body = delivery(message)
        rows = h.store.whatsapp
        # Another gateway claimed it and died before handling it.
        assert (await rows.claim_delivery("whatsapp", message["id"], 30)).state == "claimed"

        async def post() -> httpx.Response:
            async with httpx.AsyncClient(base_url=h.base_url) as client:
                return await client.post(
                    "/v1/whatsapp/webhook", content=body, headers=signed(body, WA_SECRET)
                )

        r = await post()
        assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
        assert await queued_jobs(h) == []
        await h.store.pool.execute(
            "UPDATE deliveries SET claimed_until = now() - interval '1 second' "
            "WHERE channel = 'whatsapp' AND message_id = $1",
            message["id"],
        )
        assert (await post()).status_code == 200
        assert [j.text for j in await queued_jobs(h)] == ["cobre 12 do João"]
        assert (await post()).status_code == 200  # handled: dropped
        assert await queued_jobs(h) == []
        assert (await rows.claim_delivery("whatsapp", message["id"], 30)).state == "handled"


async def text_confirm_card(
    h: Harness, channel: WhatsAppChannel, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str, Card]:
    """A number with one pending card, shown to it (its WhatsApp send is not what these
    tests are about): (wa_id, thread id, card)."""
    wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
    assert (await post(h, delivery(text_message(wa_id, "cobre 150 do João")))).status_code == 200
    thread = await channel.rows.contact_thread(h.tenant, wa_id)
    assert thread is not None
    deadline = asyncio.get_running_loop().time() + 15
    while not (pending := await h.store.pending_cards(thread)):
        assert asyncio.get_running_loop().time() < deadline, "no card"
        await asyncio.sleep(0.05)

    async def shown(thread_id: str, card_id: str, before: int, *, quoted: bool = False) -> bool:
        return True

    monkeypatch.setattr(channel.rows, "card_shown", shown)
    return wa_id, thread, pending[0]


def first_answer_lost(channel: WhatsAppChannel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The channel's next decision commits, and its answer is lost (Unavailable)."""
    real = channel.decisions.store.decide
    lost = [True]

    async def answer_lost(*args: Any, **kwargs: Any) -> Any:
        moved = await real(*args, **kwargs)  # committed
        if lost and lost.pop():
            raise Unavailable("the connection dropped after COMMIT")
        return moved

    monkeypatch.setattr(channel.decisions.store, "decide", answer_lost)


async def approvals_of(h: Harness, card: Card) -> int:
    """How many times the card was approved (once, whatever happened to its deliveries)."""
    return sum(1 for e in await h.store.card_events(card.id) if e.to_status == "approved")


async def post(h: Harness, body: bytes) -> httpx.Response:
    async with httpx.AsyncClient(base_url=h.base_url, timeout=30) as client:
        return await client.post(
            "/v1/whatsapp/webhook", content=body, headers=signed(body, WA_SECRET)
        )


async def sims_in(h: Harness, thread: str) -> int:
    """How many times "sim" reached the thread as a message for the agent."""
    count = await h.store.pool.fetchval(
        "SELECT count(*) FROM messages WHERE thread_id = $1 AND kind = 'user'"
        " AND body::text LIKE '%\"sim\"%'",
        thread,
    )
    assert isinstance(count, int)
    return count


def text_confirm() -> Settings:
    return msgspec.structs.replace(
        wa_settings(), whatsapp_text_confirm=True, whatsapp_text_confirm_max_risk="critical"
    )


async def test_a_sim_whose_decision_committed_but_whose_answer_was_lost_is_not_a_message(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code review: the approval committed, its answer lost (a connection dropped after
    COMMIT: Unavailable); the handler deleted the delivery, effect and all, and Meta's
    redelivery chose again: the card approved by then, the "sim" went to the agent as a
    message (a model turn superseding the person's next card). The claim is let go now,
    its effect kept: the redelivery approves again (already done) and says nothing."""
    async with harness(
        database_url, model=Scripted(pix()), gateway=True, settings=text_confirm()
    ) as h:
        channel = channel_of(h.asgi)
        wa_id, thread, card = await text_confirm_card(h, channel, monkeypatch)
        first_answer_lost(channel, monkeypatch)
        body = delivery(text_message(wa_id, "sim"))
        assert (await post(h, body)).status_code == 503
        assert (await h.store.get_card(card.id)).status is not Status.PENDING
        assert (await post(h, body)).status_code == 200  # Meta's redelivery
        await h.settle()
        assert await sims_in(h, thread) == 0
        assert await approvals_of(h, card) == 1


async def test_a_handling_slow_past_its_lease_does_nothing_once_another_took_over(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code review: a handler held up (a pool wait, a lock) past its lease; Meta's
    redelivery claimed the message, approved the card and marked it handled; the first
    handler then chose afresh (the card approved by then: a message) and sent "sim" to
    the agent as well. Its effect is written only under its own claim now: it stops."""
    monkeypatch.setattr(webhook, "BUSY_WAIT_SECONDS", 0.1)
    settings = msgspec.structs.replace(text_confirm(), whatsapp_delivery_lease_seconds=0.5)
    async with harness(database_url, model=Scripted(pix()), gateway=True, settings=settings) as h:
        channel = channel_of(h.asgi)
        wa_id, thread, card = await text_confirm_card(h, channel, monkeypatch)
        touch = channel.rows.touch_inbound
        held = [True]

        async def held_up_once(tenant: str, number: str) -> None:
            if held and held.pop():
                await asyncio.sleep(1.5)
            await touch(tenant, number)

        monkeypatch.setattr(channel.rows, "touch_inbound", held_up_once)
        body = delivery(text_message(wa_id, "sim"))
        first = asyncio.create_task(post(h, body))
        await asyncio.sleep(0.8)  # the first claim lapsed: Meta sends it again
        assert (await post(h, body)).status_code == 200
        assert (await first).status_code == 503  # taken over: it did nothing
        await h.settle()
        assert await sims_in(h, thread) == 0
        assert await approvals_of(h, card) == 1
        assert (await post(h, body)).status_code == 200  # handled


async def test_a_delivery_marked_by_a_gateway_of_the_previous_version_is_taken_as_handled(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two code reviews: during a rolling deploy, a gateway of the version before claims
    (migration 0016) inserts a delivery row with no claim time, its mark of "seen". Read
    as a live claim it was busy for ever (503 at every redelivery, for days); read as a
    claim that lapses, a redelivery handled it again, and a "sim" that gateway had
    approved went to the agent as a message. It is handled, as that gateway took it."""
    monkeypatch.setattr(webhook, "BUSY_WAIT_SECONDS", 0.1)
    async with harness(
        database_url, model=Scripted(pix()), gateway=True, settings=wa_settings(),
        start_worker=False,
    ) as h:  # fmt: skip
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        message = text_message(wa_id, "cobre 13 do João")
        await h.store.pool.execute(  # the previous version's mark, as it wrote it
            "INSERT INTO deliveries (channel, message_id, received_at)"
            " VALUES ('whatsapp', $1, now() - interval '1 hour')",
            message["id"],
        )
        assert (await post(h, delivery(message))).status_code == 200
        assert await queued_jobs(h) == []


async def test_a_button_pressed_once_and_handled_again_says_nothing_more(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code review: a press whose approval committed but whose answer was lost (503,
    Meta sends it again) found its card already approved the second time, and told the
    person who pressed once "already approved". The press is marked on its claim before
    deciding; handled again, its own decision made, it says nothing."""
    async with harness(
        database_url, model=Scripted(pix()), gateway=True, settings=wa_settings()
    ) as h:
        channel = channel_of(h.asgi)
        wa_id, _, card = await text_confirm_card(h, channel, monkeypatch)
        first_answer_lost(channel, monkeypatch)
        press = button_message(wa_id, inbound.button_id(Decision.APPROVE, card.id))
        body = delivery(press)
        assert (await post(h, body)).status_code == 503
        assert (await post(h, body)).status_code == 200  # Meta's redelivery
        replies = await h.store.pool.fetchval(
            "SELECT count(*) FROM wa_outbound WHERE key = $1", f"reply:{press['id']}"
        )
        assert replies == 0
        assert await approvals_of(h, card) == 1
        # A second press (another message) of the same person is still told.
        again = button_message(wa_id, inbound.button_id(Decision.APPROVE, card.id))
        assert (await post(h, delivery(again))).status_code == 200
        replies = await h.store.pool.fetchval(
            "SELECT count(*) FROM wa_outbound WHERE key = $1", f"reply:{again['id']}"
        )
        assert replies == 1
        # So is a press of the other button handled again (refused before deciding the
        # first time): the card is not what it asked for.
        real = channel.decisions.resolve
        failing = [True]

        async def refused_once(*args: Any, **kwargs: Any) -> Any:
            if failing and failing.pop():
                raise Unavailable("Postgres away")
            return await real(*args, **kwargs)

        monkeypatch.setattr(channel.decisions, "resolve", refused_once)
        no = button_message(wa_id, inbound.button_id(Decision.REJECT, card.id))
        assert (await post(h, delivery(no))).status_code == 503
        assert (await post(h, delivery(no))).status_code == 200
        replies = await h.store.pool.fetchval(
            "SELECT count(*) FROM wa_outbound WHERE key = $1", f"reply:{no['id']}"
        )
        assert replies == 1


async def test_a_delivery_let_go_is_gone_unless_a_choice_was_written(database_url: str) -> None:
    """A code review: a claim let go (a refusal, a failure) kept its row, which a gateway of
    the version before claims reads as "seen" (its insert finds the row): the redelivery
    was answered 200 and dropped there. Nothing chosen yet: the row goes. A choice written
    (a "sim" that may have approved): kept, its claim let go, for the redelivery to redo."""
    async with harness(
        database_url, model=Scripted(pix()), settings=wa_settings(), start_worker=False
    ) as h:
        rows = h.store.whatsapp
        plain, chosen = f"wamid.{secrets.token_hex(6)}", f"wamid.{secrets.token_hex(6)}"
        claim = await rows.claim_delivery("whatsapp", plain, 30)
        await rows.forget_delivery("whatsapp", plain, claim)
        left = "SELECT count(*) FROM deliveries WHERE channel = 'whatsapp' AND message_id = $1"
        assert await h.store.pool.fetchval(left, plain) == 0
        claim = await rows.claim_delivery("whatsapp", chosen, 30)
        assert await rows.delivery_effect("whatsapp", chosen, claim, "confirm:x")
        await rows.forget_delivery("whatsapp", chosen, claim)
        again = await rows.claim_delivery("whatsapp", chosen, 30)
        assert (again.state, again.effect) == ("claimed", "confirm:x")
        # the first claim's token no longer writes anything
        assert not await rows.delivery_effect("whatsapp", chosen, claim, "message")
        await rows.delivery_handled("whatsapp", chosen, claim)
        assert (await rows.claim_delivery("whatsapp", chosen, 30)).state == "busy"


async def test_a_press_held_up_past_its_lease_says_nothing_once_another_decided_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a press whose handling was held up after it wrote its choice (a pool
    wait, a lock) past its lease; Meta's redelivery claimed it and approved the card
    (quietly: handled again); the first handling then found the card approved and told
    the person, who pressed once, "already approved". A handling that lost its claim
    leaves the telling to the request that took it over."""
    monkeypatch.setattr(webhook, "BUSY_WAIT_SECONDS", 0.1)
    settings = msgspec.structs.replace(wa_settings(), whatsapp_delivery_lease_seconds=0.5)
    async with harness(database_url, model=Scripted(pix()), gateway=True, settings=settings) as h:
        channel = channel_of(h.asgi)
        wa_id, _, card = await text_confirm_card(h, channel, monkeypatch)
        real = channel.decisions.resolve
        held = [True]

        async def held_up_once(*args: Any, **kwargs: Any) -> Any:
            if held and held.pop():
                await asyncio.sleep(1.5)
            return await real(*args, **kwargs)

        monkeypatch.setattr(channel.decisions, "resolve", held_up_once)
        press = button_message(wa_id, inbound.button_id(Decision.APPROVE, card.id))
        body = delivery(press)
        first = asyncio.create_task(post(h, body))
        await asyncio.sleep(0.8)  # the first claim lapsed: Meta sends it again
        assert (await post(h, body)).status_code == 200
        await first
        replies = await h.store.pool.fetchval(
            "SELECT count(*) FROM wa_outbound WHERE key = $1", f"reply:{press['id']}"
        )
        assert replies == 0
        assert await approvals_of(h, card) == 1


async def test_a_choice_is_done_again_by_a_gateway_with_text_confirmation_off(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a "sim" whose first handling chose to approve its card (and whose answer
    was lost) was handled again by a gateway with text confirmation turned off since (a
    configuration change rolling out): it took the text for a message. What a handling
    chose is done again whatever the setting."""
    async with harness(
        database_url, model=Scripted(pix()), gateway=True, settings=wa_settings()
    ) as h:  # text confirmation off
        channel = channel_of(h.asgi)
        wa_id, thread, card = await text_confirm_card(h, channel, monkeypatch)
        sim = text_message(wa_id, "sim")
        await h.store.pool.execute(  # a first handling's choice, its claim lapsed
            "INSERT INTO deliveries (channel, message_id, claimed_until, effect)"
            " VALUES ('whatsapp', $1, now() - interval '1 second', $2)",
            sim["id"],
            "confirm:" + card.id,
        )
        assert (await post(h, delivery(sim))).status_code == 200
        await h.settle()
        assert await sims_in(h, thread) == 0
        assert await approvals_of(h, card) == 1


async def test_a_choice_of_a_later_version_is_left_as_done(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a gateway meeting an effect it does not know (written by a later version
    during a rolling deploy, e.g. the answer to a "sim" that could not approve) took the
    text for a message, which replaced the cards that effect protected. It leaves it as
    done: nothing is queued, and the delivery is handled."""
    monkeypatch.setattr(webhook, "BUSY_WAIT_SECONDS", 0.1)
    async with harness(
        database_url, model=Scripted(pix()), gateway=True, settings=text_confirm(),
        start_worker=False,
    ) as h:  # fmt: skip
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        sim = text_message(wa_id, "sim")
        await h.store.pool.execute(
            "INSERT INTO deliveries (channel, message_id, claimed_until, effect)"
            " VALUES ('whatsapp', $1, now() - interval '1 second', 'later:thing')",
            sim["id"],
        )
        assert (await post(h, delivery(sim))).status_code == 200
        assert await queued_jobs(h) == []
        handled = await h.store.pool.fetchval(
            "SELECT handled FROM deliveries WHERE channel = 'whatsapp' AND message_id = $1",
            sim["id"],
        )
        assert handled is True
