"""A text "sim" (SIGNOFF_WHATSAPP_TEXT_CONFIRM) approves only the one card it can have been
about (in process, the real channel against a fake Graph API; a hostile probe's cases).

- Written while two cards waited, it chose neither, even if one of them was decided or
  expired before the "sim" was handled (a late delivery approved the one left).
- A swipe reply quoting a card is about that card only (quoting a card a correction had
  replaced, it approved the newer card).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import msgspec
import pytest

from signoff.demo.offline_model import OfflineDemoModel
from signoff.runtime.bus import Bus
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.decisions import Resolution
from signoff.runtime.errors import Unavailable
from signoff.testing import FakeGraphAPI, Harness, delivery, text_message
from tests.harness import harness
from tests.integration.test_whatsapp_delivery import channel_of, post, sims_in, wa_settings

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

TOKEN = "wa-token"


@pytest.fixture
def graph() -> Iterator[FakeGraphAPI]:
    with FakeGraphAPI(token=TOKEN) as g:
        yield g


def settings_for(graph: FakeGraphAPI) -> Any:
    return msgspec.structs.replace(
        wa_settings(),
        whatsapp_token=TOKEN,
        whatsapp_base_url=graph.url,
        whatsapp_text_confirm=True,
        whatsapp_text_confirm_max_risk="critical",
    )


@contextlib.asynccontextmanager
async def channel(
    database_url: str, graph: FakeGraphAPI, settle: float = 0.2, bus: Bus | None = None
) -> AsyncIterator[Harness]:
    """The demo with the WhatsApp channel, and its courier (which a process runs beside its
    server; the harness does not). ``settle``: how long a "sim" about to approve waits;
    ``bus``: default an in-process one."""
    settings = msgspec.structs.replace(
        settings_for(graph), whatsapp_text_confirm_settle_seconds=settle
    )
    async with harness(
        database_url, model=OfflineDemoModel(), gateway=True, settings=settings, bus=bus
    ) as h:
        task = asyncio.create_task(channel_of(h.asgi).courier.run())
        try:
            yield h
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def shown(h: Harness, wa_id: str, n: int) -> tuple[str, list[Card]]:
    """The number's thread, once ``n`` of its cards are pending and sent to WhatsApp."""
    deadline = time.monotonic() + 30
    while True:
        thread = await h.store.whatsapp.contact_thread(h.tenant, wa_id)
        if thread is not None:
            pending = await h.store.pending_cards(thread)
            sent = await h.store.pool.fetchval(
                "SELECT count(*) FROM wa_outbound o JOIN messages m"
                " ON o.key = 'log:' || m.thread_id || ':' || m.seq"
                " WHERE m.thread_id = $1 AND m.kind = 'card' AND o.status = 'sent'"
                " AND m.body->>'id' = ANY($2::text[])",
                thread,
                [c.id for c in pending],
            )
            if len(pending) == n and sent == n:
                return thread, pending
        assert time.monotonic() < deadline, f"{n} cards never shown"
        await asyncio.sleep(0.05)


async def one_card_shown(h: Harness) -> tuple[str, str, Card]:
    """A new number asks for a charge: (its wa_id, its thread, the card, shown to it)."""
    wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
    assert (await post(h, delivery(text_message(wa_id, "cobre 150 do João")))).status_code == 200
    thread, (card,) = await shown(h, wa_id, 1)
    return wa_id, thread, card


async def wamid_of(h: Harness, thread: str, card: Card) -> str:
    value = await h.store.pool.fetchval(
        "SELECT o.wa_message FROM wa_outbound o JOIN messages m"
        " ON o.key = 'log:' || m.thread_id || ':' || m.seq"
        " WHERE m.thread_id = $1 AND m.kind = 'card' AND m.body->>'id' = $2",
        thread,
        card.id,
    )
    assert isinstance(value, str)
    return value


async def told(graph: FakeGraphAPI, wa_id: str, words: str) -> None:
    """Wait until a text to the number says ``words``."""
    found = await asyncio.to_thread(
        graph.wait_for,
        lambda m: m["to"] == wa_id and m["type"] == "text" and words in m["text"]["body"],
        30,
    )
    assert found


async def effect_of(h: Harness, message_id: str) -> str | None:
    """What the handling of WhatsApp message ``message_id`` chose to do."""
    value = await h.store.pool.fetchval(
        "SELECT effect FROM deliveries WHERE channel = 'whatsapp' AND message_id = $1",
        message_id,
    )
    return None if value is None else str(value)


async def approvals(h: Harness, card: Card) -> int:
    return sum(1 for e in await h.store.card_events(card.id) if e.to_status == "approved")


async def sim_late_after_rejecting(h: Harness, wa_id: str, first: Card) -> None:
    """A "sim" written a second after the cards were shown reaches us late: ``first`` was
    rejected on the web meanwhile."""
    await asyncio.sleep(1.1)
    sim = text_message(wa_id, "sim")
    await asyncio.sleep(1.1)
    await h.decisions.resolve(
        first.id,
        Resolution(decision=Decision.REJECT, snapshot_hash=first.snapshot_hash),
        principal=wa_id,
        channel="http",
        tenant=h.tenant,
    )
    assert (await post(h, delivery(sim))).status_code == 200
    await h.settle()


async def test_a_sim_written_while_two_cards_waited_approves_neither(
    database_url: str, graph: FakeGraphAPI
) -> None:
    async with channel(database_url, graph) as h:
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        ask = text_message(wa_id, "cobre 150 do João e estorne a venda V002")
        assert (await post(h, delivery(ask))).status_code == 200
        thread, (first, second) = await shown(h, wa_id, 2)
        await sim_late_after_rejecting(h, wa_id, first)
        assert await approvals(h, second) == 0  # it chose neither
        # ... and is answered with how to decide: not a message that supersedes the card
        # it was about (a later review)
        await told(graph, wa_id, "mais de um pedido")
        assert await sims_in(h, thread) == 0
        assert (await h.store.get_card(second.id)).status is Status.PENDING


async def test_a_sim_quoting_a_card_is_about_that_card_only(
    database_url: str, graph: FakeGraphAPI
) -> None:
    async with channel(database_url, graph) as h:
        wa_id, thread, old = await one_card_shown(h)
        old_wamid = await wamid_of(h, thread, old)
        fix = text_message(wa_id, "cobre 90 do João")  # a correction replaces it
        assert (await post(h, delivery(fix))).status_code == 200
        deadline = time.monotonic() + 30
        while (await h.store.get_card(old.id)).status is Status.PENDING:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        _, (new,) = await shown(h, wa_id, 1)
        await asyncio.sleep(1.1)
        quoting_old = {**text_message(wa_id, "sim"), "context": {"id": old_wamid}}
        assert (await post(h, delivery(quoting_old))).status_code == 200
        await h.settle()
        assert await approvals(h, new) == 0  # about the replaced card: told what became
        await told(graph, wa_id, "substituído")  # of it, and the new card keeps waiting
        assert await sims_in(h, thread) == 0
        assert (await h.store.get_card(new.id)).status is Status.PENDING
        # Quoting the card that is waiting approves it.
        again = text_message(wa_id, "cobre 70 do João")
        assert (await post(h, delivery(again))).status_code == 200
        deadline = time.monotonic() + 30
        while (await h.store.get_card(new.id)).status is Status.PENDING:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        _, (newest,) = await shown(h, wa_id, 1)
        await asyncio.sleep(1.1)
        quoting = {
            **text_message(wa_id, "sim"),
            "context": {"id": await wamid_of(h, thread, newest)},
        }
        assert (await post(h, delivery(quoting))).status_code == 200
        deadline = time.monotonic() + 30
        while await approvals(h, newest) == 0:
            assert time.monotonic() < deadline, "the quoted card was not approved"
            await asyncio.sleep(0.05)


async def test_a_sim_quoting_one_of_two_waiting_cards_approves_that_one(
    database_url: str, graph: FakeGraphAPI
) -> None:
    """A review of the above: a quote makes a "sim" under two waiting cards unambiguous;
    refused, it became a message that replaced both. It approves the quoted card, and
    the other keeps waiting."""
    async with channel(database_url, graph) as h:
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        ask = text_message(wa_id, "cobre 150 do João e estorne a venda V002")
        assert (await post(h, delivery(ask))).status_code == 200
        thread, (first, second) = await shown(h, wa_id, 2)
        await asyncio.sleep(1.1)
        sim = {**text_message(wa_id, "sim"), "context": {"id": await wamid_of(h, thread, second)}}
        assert (await post(h, delivery(sim))).status_code == 200
        deadline = time.monotonic() + 30
        while await approvals(h, second) == 0:
            assert time.monotonic() < deadline, "the quoted card was not approved"
            await asyncio.sleep(0.05)
        assert (await h.store.get_card(first.id)).status is Status.PENDING
        assert await sims_in(h, thread) == 0
        # A quote of something that is not a card (our notice, a text) confirms nothing,
        # and replaces nothing either while a card it may be about waits (a review: as
        # a message it replaced the card the notice protected): told how to decide.
        await asyncio.sleep(1.1)
        other = {**text_message(wa_id, "sim"), "context": {"id": "wamid.not-a-card"}}
        assert (await post(h, delivery(other))).status_code == 200
        await told(graph, wa_id, "responde a outra mensagem")
        await h.settle()
        assert await approvals(h, first) == 0
        assert await sims_in(h, thread) == 0
        assert (await h.store.get_card(first.id)).status is Status.PENDING


@pytest.mark.parametrize("left", ["claimed", "failed"])
async def test_a_card_whose_send_was_not_recorded_counts_as_shown(
    database_url: str, graph: FakeGraphAPI, left: str
) -> None:
    """A review of the above: a card whose send the courier began but whose "sent" was not
    recorded (a crash after the claim, or an answer lost: the message may have reached the
    phone) was not counted as shown, so a "sim" written under it and another card
    approved the other once it was decided. Any send begun by the "sim"'s second counts."""
    async with channel(database_url, graph) as h:
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        ask = text_message(wa_id, "cobre 150 do João e estorne a venda V002")
        assert (await post(h, delivery(ask))).status_code == 200
        thread, (first, second) = await shown(h, wa_id, 2)
        await h.store.pool.execute(
            "UPDATE wa_outbound o SET status = $3, sent_at = NULL, claimed_at = now()"
            " FROM messages m WHERE o.key = 'log:' || m.thread_id || ':' || m.seq"
            " AND m.thread_id = $1 AND m.kind = 'card' AND m.body->>'id' = $2",
            thread,
            first.id,
            left,
        )
        await sim_late_after_rejecting(h, wa_id, first)
        assert await approvals(h, second) == 0  # it chose neither
        await told(graph, wa_id, "mais de um pedido")
        assert await sims_in(h, thread) == 0


async def test_a_sim_under_two_waiting_cards_is_answered_and_supersedes_nothing(
    database_url: str, graph: FakeGraphAPI
) -> None:
    """A review: an unquoted "sim" under two waiting cards became a message that
    superseded both (the person lost the cards they were answering). It is answered once
    with how to decide, even when Meta delivers it again, and both cards keep waiting."""
    async with channel(database_url, graph) as h:
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        ask = text_message(wa_id, "cobre 150 do João e estorne a venda V002")
        assert (await post(h, delivery(ask))).status_code == 200
        thread, cards = await shown(h, wa_id, 2)
        await asyncio.sleep(1.1)
        sim = text_message(wa_id, "sim")
        for _ in range(2):
            assert (await post(h, delivery(sim))).status_code == 200
        await told(graph, wa_id, "mais de um pedido")
        await h.settle()
        assert await sims_in(h, thread) == 0
        for c in cards:
            assert (await h.store.get_card(c.id)).status is Status.PENDING
        said = graph.matching(lambda m: m["to"] == wa_id and m["type"] == "text")
        assert len(said) == 1, said


async def test_a_sim_after_a_newer_request_does_not_approve_the_card_before_it(
    database_url: str, graph: FakeGraphAPI
) -> None:
    """A hostile probe: card A shown, then "charge João 3000" (waiting for a worker: all
    busy), then "sim": the "sim" approved A and a R$ 25 charge ran, though the person
    had just asked for another (and their text supersedes A once a worker takes it). A
    "sim" after a text the number wrote since a card was shown is not about that card."""
    async with channel(database_url, graph) as h:
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        ask = text_message(wa_id, "cobre 150 do João")
        assert (await post(h, delivery(ask))).status_code == 200
        _, (first,) = await shown(h, wa_id, 1)
        await h.worker.stop()  # no worker takes the next request for now
        await asyncio.sleep(1.1)
        newer = text_message(wa_id, "cobre 90 do João")
        assert (await post(h, delivery(newer))).status_code == 200
        await asyncio.sleep(1.1)
        sim = text_message(wa_id, "sim")
        assert (await post(h, delivery(sim))).status_code == 200
        assert await approvals(h, first) == 0
        effect = await effect_of(h, sim["id"])
        assert effect == "message"  # passed on, after the request it follows
        # A swipe reply quoting the card is still about that card.
        await asyncio.sleep(1.1)
        quoting = {
            **text_message(wa_id, "sim"),
            "context": {"id": await wamid_of(h, first.thread_id, first)},
        }
        assert (await post(h, delivery(quoting))).status_code == 200
        assert await approvals(h, first) == 1


async def test_a_sim_after_a_request_whose_handling_failed_is_not_about_the_card_before(
    database_url: str, graph: FakeGraphAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review of the above: the newer text was marked only after its choice was
    written, so a "sim" handled while that text's handling was slow, or after it failed
    (Postgres away: 503, Meta sends it again minutes later), approved the card before
    it. The text is marked first of all."""
    async with channel(database_url, graph) as h:
        wa_id, _, first = await one_card_shown(h)
        rows = channel_of(h.asgi).rows
        touch = rows.touch_inbound
        failing = [True]

        async def away_once(tenant: str, number: str) -> None:
            if failing and failing.pop():
                raise Unavailable("Postgres away")
            await touch(tenant, number)

        monkeypatch.setattr(rows, "touch_inbound", away_once)
        await asyncio.sleep(1.1)
        newer = text_message(wa_id, "cobre 90 do João")
        assert (await post(h, delivery(newer))).status_code == 503
        await asyncio.sleep(1.1)
        sim = text_message(wa_id, "sim")
        assert (await post(h, delivery(sim))).status_code == 200
        await h.settle()
        assert await approvals(h, first) == 0


async def test_a_sim_after_a_request_typed_on_the_chat_page_is_a_message(
    database_url: str, graph: FakeGraphAPI
) -> None:
    """A review: the number's thread is on the person's chat page too; a request typed
    there (waiting for a worker) did not count as written, and a WhatsApp "sim" after it
    approved the card shown before it. A message queued from any channel counts."""
    async with channel(database_url, graph) as h:
        wa_id, thread, first = await one_card_shown(h)
        await h.worker.stop()  # no worker takes the request for now
        await asyncio.sleep(1.1)
        async with httpx.AsyncClient(base_url=h.base_url, timeout=10) as http:
            typed = await http.post(
                f"/v1/threads/{thread}/messages",
                json={"text": "cobre 90 do João"},
                headers={"Authorization": f"Bearer {h.token(wa_id)}"},
            )
        assert typed.status_code in (200, 202), typed.text
        await asyncio.sleep(1.1)
        sim = text_message(wa_id, "sim")
        assert (await post(h, delivery(sim))).status_code == 200
        assert await approvals(h, first) == 0
        effect = await effect_of(h, sim["id"])
        assert effect == "message"


async def test_a_sim_delivered_before_a_text_written_before_it_is_a_message(
    database_url: str, graph: FakeGraphAPI
) -> None:
    """A hostile probe: "não, cancela A002" written at t and "sim" at t+1 reached us in
    the other order (Meta does not promise it): the "sim" approved A001 before the text
    that changed the request arrived. A "sim" about to approve gives such a text a
    moment (SIGNOFF_WHATSAPP_TEXT_CONFIRM_SETTLE_SECONDS) and looks again."""
    async with channel(database_url, graph, settle=1.0) as h:
        wa_id, _, first = await one_card_shown(h)
        await asyncio.sleep(2.1)
        written = int(time.time()) - 1
        newer = {**text_message(wa_id, "não, cobre 90 do João"), "timestamp": str(written)}
        sim = {**text_message(wa_id, "sim"), "timestamp": str(written + 1)}
        first_sim = asyncio.create_task(post(h, delivery(sim)))
        await asyncio.sleep(0.3)  # the earlier text arrives second
        assert (await post(h, delivery(newer))).status_code == 200
        assert (await first_sim).status_code == 200
        assert await approvals(h, first) == 0
        assert await effect_of(h, sim["id"]) == "message"


async def test_a_sim_batched_ahead_of_a_text_written_before_it_is_a_message(
    database_url: str, graph: FakeGraphAPI
) -> None:
    """A review: Meta may batch messages in one delivery, in any order; with "sim" (t+1)
    ahead of "não, cobre 90" (t), the "sim" was handled (and A approved) before the text
    was even looked at. Every text of a delivery is marked before any is handled."""
    async with channel(database_url, graph) as h:
        wa_id, _, first = await one_card_shown(h)
        await asyncio.sleep(2.1)
        written = int(time.time()) - 1
        newer = {**text_message(wa_id, "não, cobre 90 do João"), "timestamp": str(written)}
        sim = {**text_message(wa_id, "sim"), "timestamp": str(written + 1)}
        assert (await post(h, delivery(sim, newer))).status_code == 200
        assert await approvals(h, first) == 0
        assert await effect_of(h, sim["id"]) == "message"


async def test_a_sim_followed_by_a_new_request_still_approves(
    database_url: str, graph: FakeGraphAPI
) -> None:
    """A review: a text written *after* the "sim" (delivered during its settle wait) made
    the re-check see "a text since the card" and turned a genuine approval into a
    message. Only texts written no later than the "sim" count. (The worker is held
    here: a worker that takes the new request within the wait supersedes the card
    first, and the "sim" is told so: README, SIGNOFF_WHATSAPP_TEXT_CONFIRM_SETTLE_SECONDS.)"""
    async with channel(database_url, graph, settle=1.0) as h:
        wa_id, _, first = await one_card_shown(h)
        await h.worker.stop()
        await asyncio.sleep(2.1)
        written = int(time.time()) - 1
        sim = {**text_message(wa_id, "sim"), "timestamp": str(written)}
        newer = {**text_message(wa_id, "e cobre 50 da Maria"), "timestamp": str(written + 1)}
        first_sim = asyncio.create_task(post(h, delivery(sim)))
        await asyncio.sleep(0.3)  # the next text arrives while the "sim" waits
        assert (await post(h, delivery(newer))).status_code == 200
        assert (await first_sim).status_code == 200
        assert await effect_of(h, sim["id"]) == "confirm:" + first.id
        deadline = time.monotonic() + 30
        while await approvals(h, first) == 0:
            assert time.monotonic() < deadline, "the sim did not approve"
            await asyncio.sleep(0.05)
