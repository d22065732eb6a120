"""The chat page when its gateway stops: close code 1012 means "reconnect elsewhere, now".

The page reconnects at once to the same URL (a load balancer sends it to another gateway)
and resumes after the last seq it applied: the view is kept, not rebuilt, and what
happened meanwhile follows (gateway/drain.py, docs/websocket.md §5)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from signoff.runtime.cards import Decision
from signoff.runtime.decisions import Resolution
from tests.browser.conftest import Chat, expect, needs_browser
from tests.browser.test_chat import propose_charge

pytestmark = [pytest.mark.anyio, needs_browser]


async def test_1012_reconnects_at_once_and_resumes_after_the_last_seq(chat: Chat) -> None:
    page = chat.page
    routes: list[Any] = []
    reopened = asyncio.Event()

    async def handler(ws: Any) -> None:
        routes.append((ws, ws.connect_to_server()))
        if len(routes) > 1:
            reopened.set()

    await page.route_web_socket(re.compile(r"/v1/ws$"), handler)
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    # A node the page drew before the restart: a rebuilt view would replace it.
    await page.evaluate("document.querySelector('.msg.user').dataset.mark = 'before'")
    shown = await page.evaluate(
        "Math.max(...[...document.querySelectorAll('[data-seq]')].map(e => +e.dataset.seq), 0)"
    )
    # Decided while the page is between gateways.
    page_side, server_side = routes[-1]
    await chat.h.decisions.resolve(
        card.id,
        Resolution(decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash),
        principal=chat.user,
        channel="http",
    )
    t0 = time.monotonic()
    await page_side.close(code=1012, reason="service restart")
    await server_side.close()
    await asyncio.wait_for(reopened.wait(), 5)
    assert time.monotonic() - t0 < 2  # at once, not after the backoff
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(ui).to_have_attribute("data-status", "executed")
    resumes = [f for f in chat.sent_frames if f.get("type") == "resume"]
    assert len(resumes) == 1, resumes  # the first connection followed its new thread live
    assert resumes[0]["thread_id"] == card.thread_id
    assert resumes[0]["after_seq"] > 0
    if shown:
        assert resumes[0]["after_seq"] >= shown
    # Kept, not rebuilt: the same nodes, one user message and one card.
    assert await page.evaluate("document.querySelector('.msg.user').dataset.mark") == "before"
    await expect(page.locator(".msg.user")).to_have_count(1)
    await expect(chat.cards()).to_have_count(1)
    await chat.h.settle()
    assert await chat.h.charges() == 1
