"""The text-confirmation policy through real gateways (SIGNOFF_WHATSAPP_TEXT_CONFIRM on):
a bare "sim" approves the thread's one pending non-critical card; anything more is an
ordinary message for the agent; under a critical card it is answered with how to decide."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from signoff.testing import FakeGraphAPI, delivery, signed, text_message
from tests.cluster import Cluster
from tests.e2e.test_whatsapp import (
    SECRET,
    TOKEN,
    card_status,
    pending_card,
    post,
    say,
    wa_cluster,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def graph() -> Iterator[FakeGraphAPI]:
    with FakeGraphAPI(token=TOKEN) as g:
        yield g


@pytest.fixture(scope="module")
def yes(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, graph: FakeGraphAPI
) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("wa-yes")
    with wa_cluster(
        database_url,
        graph,
        folder,
        SIGNOFF_WHATSAPP_TEXT_CONFIRM="1",
        SIGNOFF_WHATSAPP_TEXT_CONFIRM_SETTLE_SECONDS="0.3",
    ) as c:
        yield c


async def reached_agent(db: asyncpg.Connection, thread: Any, text: str) -> None:
    deadline = time.monotonic() + 30
    while not await db.fetchval(
        "SELECT count(*) FROM messages WHERE thread_id = $1 AND kind = 'user'"
        " AND body::text LIKE '%' || $2 || '%'",
        thread,
        text,
    ):
        assert time.monotonic() < deadline, f"{text!r} never reached the agent"
        await asyncio.sleep(0.1)


async def approvals(db: asyncpg.Connection, card: asyncpg.Record) -> int:
    return int(
        await db.fetchval(
            "SELECT count(*) FROM card_events WHERE card_id = $1 AND to_status = 'approved'",
            card["id"],
        )
    )


def shown(graph: FakeGraphAPI, me: str) -> None:
    """Wait until the card reached the number (its interactive message)."""
    graph.wait_for(lambda m: m["to"] == me and m["type"] == "interactive", 30)


def shown_twice(graph: FakeGraphAPI, me: str) -> None:
    """Wait until a second card reached the number."""
    deadline = time.monotonic() + 30
    while len(graph.matching(lambda m: m["to"] == me and m["type"] == "interactive")) < 2:
        assert time.monotonic() < deadline, "the second card was never sent"
        time.sleep(0.05)


async def test_sim_approves_the_one_pending_non_critical_card(
    yes: Cluster, database_url: str, graph: FakeGraphAPI
) -> None:
    me = "5511900000020"
    await say(yes, me, "cancela a consulta A001")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        assert card["risk"] == "reversible"
        await asyncio.to_thread(shown, graph, me)
        await say(yes, me, "Sim!", gw=1)
        await card_status(db, card["id"], "executed")
        assert await approvals(db, card) == 1
        assert (
            await db.fetchval("SELECT channel FROM cards WHERE id = $1", card["id"]) == "whatsapp"
        )
        # The confirmation was a decision, not a message for the agent.
        assert not await db.fetchval(
            "SELECT count(*) FROM messages WHERE thread_id = $1 AND kind = 'user'"
            " AND body::text LIKE '%Sim!%'",
            card["thread_id"],
        )
    finally:
        await db.close()


async def test_sim_before_the_card_reached_whatsapp_is_a_message(
    yes: Cluster, database_url: str, graph: FakeGraphAPI
) -> None:
    """The card's sending failed (Graph refused it): the person never saw it, so their
    "sim" (an answer to something else) approves nothing and goes to the agent."""
    me = "5511900000023"
    graph.fail_next(5, 400, match=lambda m: m["to"] == me and m["type"] == "interactive")
    await say(yes, me, "mude o e-mail do João para sim@example.com")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        assert card["risk"] == "reversible"
        deadline = time.monotonic() + 30
        while not await db.fetchval(
            "SELECT count(*) FROM wa_outbound WHERE wa_id = $1 AND kind = 'card'"
            " AND status = 'failed'",
            me,
        ):
            assert time.monotonic() < deadline, "the card's sending never failed"
            await asyncio.sleep(0.1)
        await say(yes, me, "sim")
        await reached_agent(db, card["thread_id"], '"sim"')
        await asyncio.sleep(0.5)
        assert await approvals(db, card) == 0
    finally:
        await db.close()


async def test_sim_with_more_words_is_a_normal_message(yes: Cluster, database_url: str) -> None:
    me = "5511900000021"
    await say(yes, me, "cancela a consulta A002")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        assert card["risk"] == "reversible"
        await say(yes, me, "sim, mas muda pra 200")
        await reached_agent(db, card["thread_id"], "sim, mas muda pra 200")
        await asyncio.sleep(0.5)
        assert await approvals(db, card) == 0
        assert await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"]) in (
            "pending",
            "superseded",
        )
    finally:
        await db.close()


async def test_sim_does_not_approve_a_critical_card(
    yes: Cluster, database_url: str, graph: FakeGraphAPI
) -> None:
    """Nor does it supersede it as a message (a review: the person's "sim" under a Pix
    charge took the card away): the number is told the card needs its button."""
    me = "5511900000022"
    await say(yes, me, "cobra R$ 50,00 da Maria por pix")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        assert card["risk"] == "critical"
        await asyncio.to_thread(shown, graph, me)
        await asyncio.sleep(1.1)  # written a second after the card was shown
        await say(yes, me, "sim")
        await asyncio.to_thread(
            graph.wait_for,
            lambda m: m["to"] == me and m["type"] == "text" and "botão" in m["text"]["body"],
            30,
        )
        await asyncio.sleep(0.5)
        assert await approvals(db, card) == 0
        assert await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"]) == (
            "pending"
        )
        assert not await db.fetchval(
            "SELECT count(*) FROM messages WHERE thread_id = $1 AND kind = 'user'"
            " AND body::text LIKE '%\"sim\"%'",
            card["thread_id"],
        )
        assert not await db.fetchval(
            "SELECT count(*) FROM demo_charges WHERE idempotency_key = $1",
            str(card["operation_id"]),
        )
    finally:
        await db.close()


async def test_sim_written_before_the_card_was_shown_approves_nothing(
    yes: Cluster, database_url: str, graph: FakeGraphAPI
) -> None:
    """A hostile probe: a "sim" answering an earlier card (superseded since by a
    correction) and delivered again by Meta once the new card was shown approved the new
    card, which the person had not seen when they wrote. A "sim" approves only a card
    sent to the number before the message's own timestamp."""
    me = "5511900000024"
    await say(yes, me, "mude o e-mail da Ana para tarde@example.com")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        assert card["risk"] == "reversible"
        await asyncio.to_thread(shown, graph, me)
        late = text_message(me, "sim")
        late["timestamp"] = str(int(time.time()) - 30)  # written before the card was sent
        body = delivery(late)
        assert post(yes, body, signed(body, SECRET), gw=1).status_code == 200
        await reached_agent(db, card["thread_id"], '"sim"')  # a message like any other
        await asyncio.sleep(0.5)
        assert await approvals(db, card) == 0
    finally:
        await db.close()


async def test_a_sim_handled_again_after_its_claim_lapsed_does_what_it_did_first(
    yes: Cluster, database_url: str, graph: FakeGraphAPI
) -> None:
    """A hostile probe: a "sim" that approved its card, on a gateway killed before the
    delivery was marked handled, was handled again by Meta's redelivery after the claim
    lapsed; its card no longer pending, it went to the agent as a message, a second model
    turn, which superseded the card the person had asked for meanwhile. What the first
    handling chose is written before it is done, and a redelivery does the same."""
    me = "5511900000025"
    await say(yes, me, "mude o e-mail da Ana para primeiro@example.com")
    db = await asyncpg.connect(database_url)
    try:
        first = await pending_card(db, me)
        await asyncio.to_thread(shown, graph, me)
        sim = text_message(me, "sim")
        body = delivery(sim)
        assert post(yes, body, signed(body, SECRET)).status_code == 200
        await card_status(db, first["id"], "executed")
        # The state a gateway killed right after the decision leaves: the claim lapses.
        await db.execute(
            "UPDATE deliveries SET handled = false, claimed_until = now() - interval '1 s' "
            "WHERE channel = 'whatsapp' AND message_id = $1",
            sim["id"],
        )
        await asyncio.sleep(1.5)  # the next card is shown after the "sim" was written
        await say(yes, me, "mude o e-mail do João para segundo@example.com")
        second = await pending_card(db, me)
        await asyncio.to_thread(shown_twice, graph, me)
        assert second["id"] != first["id"]
        assert post(yes, body, signed(body, SECRET), gw=1).status_code == 200
        await asyncio.sleep(1.0)
        assert await db.fetchval("SELECT status FROM cards WHERE id = $1", second["id"]) == (
            "pending"
        )
        assert await approvals(db, first) == 1
        assert not await db.fetchval(  # not a message for the agent either
            "SELECT count(*) FROM messages WHERE thread_id = $1 AND kind = 'user'"
            " AND body::text LIKE '%\"sim\"%'",
            first["thread_id"],
        )
    finally:
        await db.close()
