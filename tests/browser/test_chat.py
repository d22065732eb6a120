"""The chat page in a real browser: confirmation cards from proposal to outcome.

Each test runs an in-process signoff (real Postgres, the payments demo with the
offline rule-based model, the worker, the gateway on a free port) and drives
Debian's Chromium through Playwright. Screenshots of each state go to
``tests/artifacts/screenshots/``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from runtime.cards import Decision
from runtime.decisions import Resolution
from tests.browser.conftest import Chat, expect, needs_browser

pytestmark = [pytest.mark.anyio, needs_browser]


async def propose_charge(chat: Chat, text: str = "cobre 150 do João") -> Any:
    await chat.say(text)
    [card] = await chat.wait_cards(1)
    return card


async def approved_events(chat: Chat, card_id: str) -> int:
    return sum(1 for e in await chat.h.store.card_events(card_id) if e.to_status == "approved")


async def test_propose_confirm_shows_result_and_charges_once(chat: Chat) -> None:
    await chat.open()
    page = chat.page
    # The token left the URL (it was only in the fragment); the thread is not known yet.
    assert "token=" not in page.url
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    # The summary exactly as stored, the impact lines, the risk badge.
    await expect(ui.locator(".card-summary")).to_have_text(card.summary)
    assert "R$ 150,00" in card.summary
    await expect(ui.locator(".badge.risk")).to_have_text("critical")
    await expect(ui.locator(".impact")).to_contain_text("R$ 150,00")
    await expect(ui.locator(".impact")).to_contain_text("João Silva")
    await expect(ui.locator(".impact")).to_contain_text("No — cannot be undone")
    await expect(ui.locator(".badge.status")).to_have_text("Waiting for your decision")
    # The live region announced it; the thread id is now in the URL.
    await expect(page.locator("#announcer")).to_contain_text("New confirmation card")
    await expect(page.locator("#announcer")).to_contain_text(card.summary)
    assert f"thread={card.thread_id}" in page.url
    await expect(page.locator("#pending-text")).to_have_text("1 confirmation pending")
    await chat.shot("1-pending")

    await ui.get_by_role("button", name="Confirm").click()
    await expect(ui).to_have_attribute("data-status", "executed")
    await expect(ui.locator(".badge.status")).to_have_text("Executed")
    await expect(ui.locator(".outcome")).to_contain_text("Done by " + chat.user)
    await expect(ui.get_by_role("button", name="Confirm")).to_be_hidden()
    await expect(page.locator("#pending")).to_be_hidden()
    # The model's reply about the result arrives as an assistant message.
    await expect(page.locator(".msg.assistant").last).to_contain_text("Feito")
    await chat.shot("2-executed")
    await chat.h.settle()
    assert await chat.h.charges() == 1
    stored = await chat.h.store.get_card(card.id)
    assert str(stored.status) == "executed"
    assert stored.channel == "ws"
    assert [f["snapshot_hash"] for f in chat.resolve_frames()] == [card.snapshot_hash]
