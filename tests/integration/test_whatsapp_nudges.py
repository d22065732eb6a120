"""Touches on a card's WhatsApp message that decide nothing are answered (in process, the
real channel and courier against a fake Graph API): a 👍 reaction to a card, and a
template's quick-reply button (a card sent outside the 24-hour window) were answered 200
and dropped without a word, and the person took them for a decision."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from signoff.runtime.cards import Status
from signoff.testing import FakeGraphAPI, delivery
from tests.integration.test_whatsapp_delivery import post, sims_in
from tests.integration.test_whatsapp_sim_scope import (
    TOKEN,
    approvals,
    channel,
    one_card_shown,
    wamid_of,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture
def graph() -> Iterator[FakeGraphAPI]:
    with FakeGraphAPI(token=TOKEN) as g:
        yield g


def touch(wa_id: str, kind: str, target: str, emoji: str = "👍") -> dict[str, Any]:
    base = {"from": wa_id, "id": "wamid.in" + secrets.token_hex(8)}
    base["timestamp"] = str(int(time.time()))
    if kind == "reaction":
        return {**base, "type": "reaction", "reaction": {"message_id": target, "emoji": emoji}}
    return {
        **base,
        "type": "button",
        "context": {"id": target},
        "button": {"text": "Confirmar", "payload": "Confirmar"},
    }


def sent_to(graph: FakeGraphAPI, wa_id: str, kind: str) -> list[dict[str, Any]]:
    return graph.matching(lambda m: m["to"] == wa_id and m["type"] == kind)


async def test_a_reaction_to_a_waiting_card_is_told_to_use_its_buttons(
    database_url: str, graph: FakeGraphAPI
) -> None:
    async with channel(database_url, graph) as h:
        wa_id, thread, card = await one_card_shown(h)
        thumbs = touch(wa_id, "reaction", await wamid_of(h, thread, card))
        for _ in range(2):  # delivered twice: answered once
            assert (await post(h, delivery(thumbs))).status_code == 200
        await asyncio.to_thread(
            graph.wait_for,
            lambda m: m["to"] == wa_id and m["type"] == "text" and "reação" in m["text"]["body"],
            30,
        )
        await h.settle()
        assert len(sent_to(graph, wa_id, "text")) == 1
        assert (await h.store.get_card(card.id)).status is Status.PENDING
        assert await approvals(h, card) == 0 and await sims_in(h, thread) == 0
        # A reaction taken back (no emoji), or to something else, is left alone.
        for other in (
            touch(wa_id, "reaction", await wamid_of(h, thread, card), emoji=""),
            touch(wa_id, "reaction", "wamid.not-a-card"),
        ):
            assert (await post(h, delivery(other))).status_code == 200
        await asyncio.sleep(0.5)
        assert len(sent_to(graph, wa_id, "text")) == 1


async def test_a_template_button_on_a_card_gets_the_card_with_its_buttons(
    database_url: str, graph: FakeGraphAPI
) -> None:
    async with channel(database_url, graph) as h:
        wa_id, thread, card = await one_card_shown(h)
        pressed = touch(wa_id, "button", await wamid_of(h, thread, card))
        assert (await post(h, delivery(pressed))).status_code == 200
        deadline = time.monotonic() + 30
        while len(sent_to(graph, wa_id, "interactive")) < 2:
            assert time.monotonic() < deadline, "the card was not sent again"
            await asyncio.sleep(0.05)
        again = sent_to(graph, wa_id, "interactive")[-1]
        ids = [b["reply"]["id"] for b in again["interactive"]["action"]["buttons"]]
        assert any(card.id in i for i in ids)
        assert await approvals(h, card) == 0  # it decided nothing
        assert (await h.store.get_card(card.id)).status is Status.PENDING
