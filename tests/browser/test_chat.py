"""The chat page in a real browser: confirmation cards from proposal to outcome.

Each test runs an in-process signoff (real Postgres, the payments demo with the
offline rule-based model, the worker, the gateway on a free port) and drives
Debian's Chromium through Playwright. Screenshots of each state go to
``tests/artifacts/screenshots/``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from signoff.runtime.cards import Decision
from signoff.runtime.decisions import Resolution
from tests.browser.conftest import Chat, expect, needs_browser

pytestmark = [pytest.mark.anyio, needs_browser]


async def propose_charge(chat: Chat, text: str = "cobre 150 do João") -> Any:
    await chat.say(text)
    [card] = await chat.wait_cards(1)
    return card


async def approve_elsewhere(chat: Chat, card: Any) -> None:
    """The card approved by its owner through the API (another tab, another device)."""
    await chat.h.decisions.resolve(
        card.id,
        Resolution(decision=Decision.APPROVE, snapshot_hash=card.snapshot_hash),
        principal=chat.user,
        channel="http",
    )


async def approved_events(chat: Chat, card_id: str) -> int:
    return sum(1 for e in await chat.h.store.card_events(card_id) if e.to_status == "approved")


async def test_propose_confirm_shows_result_and_charges_once(chat: Chat) -> None:
    await chat.open()
    page = chat.page
    # The token left the URL (it was only in the fragment); the thread is not known yet.
    assert "token=" not in page.url
    # The empty thread suggests the app's own example (the demo's, from its ready frame).
    await expect(page.locator("#empty")).to_contain_text("e.g. “charge João 150” or “balance”")
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    # The summary exactly as stored, the impact lines, the risk badge.
    await expect(ui.locator(".card-summary")).to_have_text(card.summary)
    assert "R$ 150,00" in card.summary
    await expect(ui.locator(".badge.risk")).to_have_text("critical")
    await expect(ui.locator(".impact")).to_contain_text("R$150.00")  # Intl, en-US
    await expect(ui.locator(".impact")).to_contain_text("João Silva")
    await expect(ui.locator(".impact")).to_contain_text("No — cannot be undone")
    await expect(ui.locator(".badge.status")).to_have_text("Waiting for your decision")
    # The live region announced it; the thread id is now in the URL.
    await expect(page.locator("#announcer")).to_contain_text("New confirmation card")
    await expect(page.locator("#announcer")).to_contain_text(card.summary)
    assert f"thread={card.thread_id}" in page.url
    await expect(page.locator("#pending-text")).to_have_text("1 confirmation pending")
    # Said before it happens: a message now would replace the card (newcomer probe).
    await expect(page.locator("#composer-hint")).to_have_text(
        "A new message replaces the cards still waiting: none of them runs."
    )
    await chat.shot("1-pending")

    await ui.get_by_role("button", name="Confirm").focus()
    await chat.page.keyboard.press("Enter")
    await expect(ui).to_have_attribute("data-status", "executed")
    # The focus stays on the card (the disabled button dropped it to the page's start).
    await expect(ui).to_be_focused()
    await expect(ui.locator(".badge.status")).to_have_text("Executed")
    await expect(ui.locator(".outcome")).to_contain_text(
        "Approved by " + chat.user + " in the chat"
    )
    await expect(ui.locator(".outcome .result-line")).to_contain_text(
        "Pix charge created · R$150.00"
    )
    await expect(ui.get_by_role("button", name="Confirm")).to_be_hidden()
    await expect(page.locator("#pending")).to_be_hidden()
    await expect(page.locator("#composer-hint")).to_be_hidden()
    # The model's reply about the result arrives as an assistant message.
    await expect(page.locator(".msg.assistant").last).to_contain_text("Cobrança Pix de R$ 150,00")
    await chat.shot("2-executed")
    await chat.h.settle()
    assert await chat.h.charges() == 1
    stored = await chat.h.store.get_card(card.id)
    assert str(stored.status) == "executed"
    assert stored.channel == "ws"
    assert [f["snapshot_hash"] for f in chat.resolve_frames()] == [card.snapshot_hash]


async def test_reject_with_reason_by_keyboard(chat: Chat) -> None:
    await chat.open()
    page = chat.page
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    actions = ui.locator(".actions")
    # Keyboard only: focus Confirm, Tab to Reject, Enter opens the reason form.
    await actions.get_by_role("button", name="Confirm").focus()
    await page.keyboard.press("Tab")
    await expect(actions.get_by_role("button", name="Reject")).to_be_focused()
    await page.keyboard.press("Enter")
    reason = ui.get_by_label("Reason (optional)")
    await expect(reason).to_be_focused()
    await page.keyboard.type("valor errado, era 105")
    await chat.shot("1-reason")
    await page.keyboard.press("Enter")
    await expect(ui).to_have_attribute("data-status", "rejected")
    await expect(ui.locator(".outcome")).to_contain_text("Reason: valor errado, era 105")
    await expect(ui.locator(".outcome")).to_contain_text("Nothing was done")
    await expect(page.locator("#announcer")).to_contain_text("Card rejected")
    await chat.shot("2-rejected")
    await chat.h.settle()
    stored = await chat.h.store.get_card(card.id)
    assert str(stored.status) == "rejected"
    assert stored.reason == "valor errado, era 105"
    assert await chat.h.charges() == 0


async def test_edit_amount_proposes_new_linked_card(chat: Chat) -> None:
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    assert card.editable == ["amount", "description"]
    await ui.locator(".actions").get_by_role("button", name="Edit").click()
    amount = ui.get_by_label("Amount (R$)")
    await expect(amount).to_have_value("150.00")  # as an English page writes it
    await expect(ui.get_by_label("Description")).to_be_visible()
    await amount.fill("200")
    await chat.shot("1-editing")
    await ui.get_by_role("button", name="Propose edited card").click()
    await expect(ui).to_have_attribute("data-status", "modified")
    await expect(ui.locator(".outcome")).to_contain_text("replaced by a new card")
    [new] = await chat.wait_cards(1)
    assert new.id != card.id
    assert "R$ 200,00" in new.summary
    old = await chat.h.store.get_card(card.id)
    assert old.superseded_by == new.id
    new_ui = chat.card(new.id)
    await expect(new_ui.locator(".card-summary")).to_have_text(new.summary)
    await expect(new_ui.locator(".impact")).to_contain_text("R$200.00")
    await expect(chat.page.locator("#announcer")).to_contain_text("New confirmation card")
    await chat.shot("2-new-card")
    # The link on the old card leads to the new one.
    await ui.get_by_role("link", name="Go to the new card").click()
    await expect(new_ui).to_be_focused()
    await new_ui.get_by_role("button", name="Confirm").click()
    await expect(new_ui).to_have_attribute("data-status", "executed")
    await chat.shot("3-executed")
    await chat.h.settle()
    assert await chat.h.charges() == 1
    amount_cents = await chat.h.provider.pool.fetchval(
        "SELECT amount FROM demo_charges WHERE tenant = $1", chat.h.tenant
    )
    assert amount_cents == 20000
    edit_frames = [f for f in chat.resolve_frames() if f["decision"] == "edit"]
    assert edit_frames == [
        {
            "type": "resolve",
            "id": edit_frames[0]["id"],
            "card_id": card.id,
            "decision": "edit",
            "snapshot_hash": card.snapshot_hash,
            "edits": {"amount": "200"},
        }
    ]


async def test_double_click_sends_one_decision(chat: Chat) -> None:
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    await ui.get_by_role("button", name="Confirm").dblclick()
    await expect(ui).to_have_attribute("data-status", "executed")
    await chat.shot("1-executed")
    await chat.h.settle()
    assert len(chat.resolve_frames()) == 1
    assert await approved_events(chat, card.id) == 1
    assert await chat.h.charges() == 1
    await expect(ui.locator(".card-error")).to_be_hidden()


async def test_buttons_disable_at_once_and_show_progress(chat: Chat) -> None:
    """Between the click and the card_update the card is busy: nothing can be clicked again."""
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    # Click and look in the same task: the disabled state must not wait for any reply.
    observed = await chat.page.evaluate(
        """(id) => new Promise((resolve) => {
            const card = document.querySelector(`article.card[data-card-id="${id}"]`);
            const confirm = card.querySelector('[data-action=confirm]');
            confirm.click();
            resolve({
              confirm: confirm.disabled,
              reject: card.querySelector('[data-action=reject]').disabled,
              edit: card.querySelector('[data-action=edit]').disabled,
              busy: card.getAttribute('aria-busy'),
              progress: card.querySelector('.progress').textContent,
            });
        })""",
        card.id,
    )
    assert observed == {
        "confirm": True,
        "reject": True,
        "edit": True,
        "busy": "true",
        "progress": "Sending your decision…",
    }
    await expect(ui).to_have_attribute("data-status", "executed")
    await expect(ui).to_have_attribute("aria-busy", "false")
    await chat.h.settle()
    assert await chat.h.charges() == 1


async def test_reload_restores_pending_card(chat: Chat) -> None:
    await chat.open()
    page = chat.page
    card = await propose_charge(chat)
    assert f"thread={card.thread_id}" in page.url
    await page.reload()
    await expect(page.locator("#conn")).to_have_text("Online")
    ui = chat.card(card.id)
    await expect(ui).to_have_attribute("data-status", "pending")
    await expect(ui.locator(".card-summary")).to_have_text(card.summary)
    await expect(ui.get_by_role("button", name="Confirm")).to_be_enabled()
    # a deadline less than an hour away is shown to the second ("19:13" for "in 20 s")
    expires = ui.locator("dt", has_text="Expires").locator("xpath=following-sibling::dd[1]")
    await expect(expires).to_have_text(re.compile(r"^\d{1,2}:\d{2}:\d{2}"))
    await expect(page.locator(".msg.user")).to_have_count(1)
    await expect(chat.cards()).to_have_count(1)
    await expect(page.locator("#pending-text")).to_have_text("1 confirmation pending")
    await chat.shot("1-after-reload")
    await ui.get_by_role("button", name="Confirm").click()
    await expect(ui).to_have_attribute("data-status", "executed")
    await chat.h.settle()
    assert await chat.h.charges() == 1


async def test_expired_card_is_disabled_and_can_be_proposed_again(chat: Chat) -> None:
    await chat.open()
    page = chat.page
    card = await propose_charge(chat)
    await chat.h.provider.pool.execute(
        "UPDATE cards SET expires_at = now() - interval '1 second' WHERE id = $1::uuid", card.id
    )
    await chat.h.worker.sweep()
    ui = chat.card(card.id)
    await expect(ui).to_have_attribute("data-status", "expired")
    await expect(ui.locator(".badge.status")).to_have_text("Expired")
    # only "Propose again" is offered (disabled Confirm/Reject/Edit beside it confused)
    for name in ("Confirm", "Reject", "Edit"):
        await expect(ui.get_by_role("button", name=name)).to_be_hidden()
    again = ui.get_by_role("button", name="Propose again")
    await expect(again).to_be_enabled()
    await expect(page.locator("#pending")).to_be_hidden()
    await chat.shot("1-expired")
    await again.dblclick()  # once: a second click made one more pending charge
    await expect(page.locator(".msg.user").last).to_have_text(
        re.compile(re.escape(f"Propose again: {card.summary}"))
    )
    await expect(again).to_be_hidden()
    await chat.shot("2-proposed-again")
    await chat.h.settle()
    assert await page.locator(".msg.user", has_text="Propose again").count() == 1
    assert await chat.h.charges() == 0


async def test_decision_through_http_api_updates_page_live(chat: Chat) -> None:
    import httpx

    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    async with httpx.AsyncClient(base_url=chat.h.base_url) as client:
        res = await client.post(
            f"/v1/cards/{card.id}/resolve",
            json={"decision": "approve", "snapshot_hash": card.snapshot_hash},
            headers={"Authorization": f"Bearer {chat.h.token(chat.user)}"},
        )
    assert res.status_code == 200, res.text
    await expect(ui).to_have_attribute("data-status", "executed")
    await expect(ui.locator(".outcome")).to_contain_text(f"Approved by {chat.user} through the API")
    await expect(ui.get_by_role("button", name="Confirm")).to_be_hidden()
    await chat.shot("1-executed-elsewhere")
    assert chat.resolve_frames() == []
    await chat.h.settle()
    assert await chat.h.charges() == 1


async def test_decision_through_decisions_api_updates_page_live(chat: Chat) -> None:
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    await chat.h.decisions.resolve(
        card.id,
        Resolution(decision=Decision.REJECT, snapshot_hash=card.snapshot_hash, reason="outra aba"),
        principal=chat.user,
        channel="http",
    )
    await expect(ui).to_have_attribute("data-status", "rejected")
    await expect(ui.locator(".outcome")).to_contain_text("Reason: outra aba")
    await chat.shot("1-rejected-elsewhere")


async def test_typing_sim_does_not_approve(chat: Chat) -> None:
    await chat.open()
    page = chat.page
    card = await propose_charge(chat)
    await chat.say("sim")
    ui = chat.card(card.id)
    await expect(ui).to_have_attribute("data-status", "superseded")
    await expect(ui.locator(".outcome")).to_contain_text("Superseded by a newer message")
    await expect(page.locator(".msg.user").last).to_have_text(re.compile(r"^You.*sim$", re.S))
    await chat.shot("1-superseded")
    await chat.h.settle()
    assert chat.resolve_frames() == []
    assert await approved_events(chat, card.id) == 0
    assert await chat.h.charges() == 0


async def test_several_cards_pending_and_batch_confirm(chat: Chat) -> None:
    await chat.open()
    page = chat.page
    await chat.say("cobre 150 do João e estorne a venda V002")
    cards = await chat.wait_cards(2)
    assert {c.tool for c in cards} == {"create_pix_charge", "refund_sale"}
    await expect(page.locator("#pending-text")).to_have_text("2 confirmations pending")
    await chat.shot("1-two-pending")
    confirm_all = page.get_by_role("button", name="Confirm all 2")
    # with one card's edit form open, Confirm all waits as the card's own Confirm does
    # (it approved both at their old values)
    charge = next(c for c in cards if c.tool == "create_pix_charge")
    await chat.card(charge.id).get_by_role("button", name="Edit").click()
    await expect(confirm_all).to_be_disabled()
    await expect(page.locator("#pending-text")).to_contain_text(  # and it says why
        "finish or cancel the open form to confirm all"
    )
    # An edit the tool refuses marks its field, described by the card's error, focused.
    amount = chat.card(charge.id).get_by_label("Amount (R$)")
    await amount.fill("-5")
    await chat.card(charge.id).get_by_role("button", name="Propose edited card").click()
    await expect(amount).to_have_attribute("aria-invalid", "true")
    await expect(amount).to_be_focused()
    described = await amount.get_attribute("aria-describedby")
    await expect(page.locator(f"#{described}")).not_to_be_empty()
    await chat.card(charge.id).get_by_role("button", name="Cancel").click()
    await expect(confirm_all).to_be_enabled()
    # It asks first, naming each card (a first-hour walkthrough: three Pix charges ran on
    # one click); "Not now" confirms nothing.
    await confirm_all.click()
    check = page.locator("#batch-check")
    await expect(check).to_be_visible()
    await expect(check.locator("li")).to_have_count(2)
    await expect(check).to_contain_text("R$ 150,00")
    await chat.shot("2-asked")
    await page.get_by_role("button", name="Not now").click()
    await expect(check).to_be_hidden()
    assert [f for f in chat.resolve_frames() if f["decision"] == "approve"] == []
    await confirm_all.click()
    await page.get_by_role("button", name="Yes, confirm the 2").click()
    for c in cards:
        await expect(chat.card(c.id)).to_have_attribute("data-status", "executed")
    await expect(page.locator("#pending")).to_be_hidden()
    await chat.shot("3-all-executed")
    await chat.h.settle()
    assert await chat.h.charges() == 1
    for c in cards:
        assert await approved_events(chat, c.id) == 1
        # decided in the chat (one frame per card on the page's socket), not "through the
        # API" as the HTTP batch made them
        assert (await chat.h.store.get_card(c.id)).channel == "ws"


async def test_batch_reject(chat: Chat) -> None:
    await chat.open()
    page = chat.page
    await chat.say("cobre 150 do João e estorne a venda V002")
    cards = await chat.wait_cards(2)
    # A reason typed in one card's reject form goes with that card's rejection (a
    # first-hour review: "Reject all" dropped it without a word), and "Confirm all"
    # waits while the person is saying no to one card.
    charge = next(c for c in cards if c.tool == "create_pix_charge")
    await chat.card(charge.id).get_by_role("button", name="Reject").click()
    await chat.card(charge.id).get_by_label("Reason").fill("cliente desistiu")
    await expect(page.get_by_role("button", name="Confirm all 2")).to_be_disabled()
    await page.get_by_role("button", name="Reject all 2").click()
    for c in cards:
        await expect(chat.card(c.id)).to_have_attribute("data-status", "rejected")
        await expect(chat.card(c.id).locator(".card-error")).to_be_empty()  # no "not sent"
    await expect(chat.card(charge.id).locator(".outcome")).to_contain_text("cliente desistiu")
    await chat.h.settle()
    assert await chat.h.charges() == 0
    reasons = {f["card_id"]: f.get("reason") for f in chat.resolve_frames()}
    assert reasons == {c.id: "cliente desistiu" if c.id == charge.id else None for c in cards}


async def page_side_drop(routes: list[Any]) -> None:
    """Drop the page's current socket (the route lets the reconnection through)."""
    page_side, server_side = routes[-1]
    await page_side.close(code=4000, reason="network gone")
    await server_side.close()


async def test_reconnects_and_rebuilds_from_the_server(chat: Chat) -> None:
    """The socket drops; meanwhile the card is decided; the page reconnects and shows it."""
    page = chat.page
    routes: list[Any] = []
    reopen = asyncio.Event()

    async def handler(ws: Any) -> None:
        if routes:  # hold every reconnection until the test lets it through
            await reopen.wait()
        routes.append((ws, ws.connect_to_server()))

    await page.route_web_socket(re.compile(r"/v1/ws$"), handler)
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    page_side, server_side = routes[-1]
    await page_side.close(code=4000, reason="network gone")
    await server_side.close()
    # The page noticed and is trying again (held by the route above).
    await expect(page.locator("#conn")).to_have_text("Connecting…")
    await expect(ui.get_by_role("button", name="Confirm")).to_be_disabled()
    await chat.shot("1-offline")
    await approve_elsewhere(chat, card)
    await chat.h.settle()
    reopen.set()
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(ui).to_have_attribute("data-status", "executed")
    assert len(routes) == 2
    resumes = [f for f in chat.sent_frames if f.get("type") == "resume"]
    assert [(f["thread_id"], f["after_seq"]) for f in resumes] == [(card.thread_id, 0)]
    # Rebuilt from the log, not appended to what the page had.
    await expect(page.locator(".msg.user")).to_have_count(1)
    await expect(chat.cards()).to_have_count(1)
    await expect(page.locator(".msg.assistant").last).to_contain_text("Cobrança Pix de R$ 150,00")
    # ... and scrolled to the newest message, on a window too short to show them all.
    await page.set_viewport_size({"width": 800, "height": 320})
    await page.locator(".msg.user").first.scroll_into_view_if_needed()
    await page_side_drop(routes)
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(page.locator(".msg.assistant").last).to_be_in_viewport()
    await expect(page.locator(".msg.user").first).not_to_be_in_viewport()
    await chat.shot("2-rebuilt")
    assert await chat.h.charges() == 1


async def test_decision_in_another_tab_updates_this_one(chat: Chat) -> None:
    await chat.open()
    card = await propose_charge(chat)
    other = await chat.context.new_page()
    await other.goto(f"{chat.url}?thread={card.thread_id}#token={chat.h.token(chat.user)}")
    other_ui = other.locator(f'article.card[data-card-id="{card.id}"]')
    await expect(other_ui).to_have_attribute("data-status", "pending")
    await other_ui.get_by_role("button", name="Confirm").click()
    await expect(chat.card(card.id)).to_have_attribute("data-status", "executed")
    await expect(other_ui).to_have_attribute("data-status", "executed")
    await chat.shot("1-executed-from-other-tab")
    await chat.h.settle()
    assert await chat.h.charges() == 1
    assert chat.resolve_frames() == []


async def test_invalidated_card_shows_reason_and_changes(chat: Chat) -> None:
    await chat.open()
    card = await propose_charge(chat)
    # The world changes between the proposal and the approval.
    await chat.h.provider.pool.execute(
        "UPDATE demo_customers SET active = false WHERE id = $1",
        card.args_snapshot["customer_id"],
    )
    ui = chat.card(card.id)
    await ui.get_by_role("button", name="Confirm").click()
    await expect(ui).to_have_attribute("data-status", "invalidated")
    await expect(ui.locator(".badge.status")).to_have_text("Not executed")
    await expect(ui.locator(".outcome")).to_contain_text(
        "NOT executed: the customer is no longer active"
    )
    await expect(ui.locator(".outcome .changes")).to_contain_text(
        "customer.active: approved true, now false"
    )
    await chat.shot("1-invalidated")
    # The tool gave its reason per language: the page shows the person's.
    await chat.page.get_by_label("Language").select_option("pt-BR")
    await expect(ui.locator(".outcome")).to_contain_text(
        "NÃO executado: o cliente não está mais ativo"
    )
    await chat.h.settle()
    assert await chat.h.charges() == 0


async def test_a_message_too_long_is_not_cut_but_refused_with_a_word(chat: Chat) -> None:
    """The newcomer pasted more than 8000 characters: the box's maxlength cut it silently
    and the rest (often the request itself) was sent as if it were the whole message.
    The box takes it all, says it is too long, and sends nothing until it is shorter."""
    await chat.open()
    page = chat.page
    box = page.get_by_label(chat.message_label, exact=True)
    long = "x" * 7990 + " cobre 150 do João"  # 8008 characters: the request at the end
    await box.fill(long)
    await expect(page.locator("#send")).to_be_disabled()
    await expect(page.locator("#composer-error")).to_contain_text("8008")
    await box.press("Enter")
    assert await box.input_value() == long  # kept whole, nothing sent
    assert [f for f in chat.sent_frames if f.get("type") == "message"] == []
    await box.fill("cobre 150 do João")
    await expect(page.locator("#send")).to_be_enabled()
    await expect(page.locator("#composer-error")).to_have_text("")
    await box.press("Enter")
    await chat.wait_cards(1)


async def test_another_persons_thread_link_says_so_where_it_is_seen(chat: Chat) -> None:
    """The newcomer opened another user's `?thread=` link: an empty new chat, the only
    word in a screen reader's alert (in English on a Portuguese page)."""
    await chat.open()
    card = await propose_charge(chat)
    # Another browser, signed in as someone else (one browser's tabs share a sign-in).
    elsewhere = await chat.browser.new_context()
    try:
        page = await elsewhere.new_page()
        stranger = f"intruder-{chat.user}"
        await page.goto(f"{chat.url}?thread={card.thread_id}#token={chat.h.token(stranger)}")
        await expect(page.locator("#composer-error")).to_have_text(
            "That conversation does not exist or is not yours: this is a new one."
        )
        await expect(page.locator("article.card")).to_have_count(0)
        assert f"thread={card.thread_id}" not in page.url
    finally:
        await elsewhere.close()


async def test_a_message_not_known_to_be_taken_is_sent_again_under_its_key(chat: Chat) -> None:
    """The gateway stored the message but its answer was lost (a 503 naming the thread,
    an integrity probe's F2): the page says so, puts the text back in the box, and the
    person's second send carries the same idempotency key to that thread: one run, one
    card (before, a new key: the charge proposed twice)."""
    page = chat.page
    first: dict[str, Any] = {}

    async def handler(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_page(raw: str | bytes) -> None:
            frame = json.loads(raw)
            if frame.get("type") == "message" and not first:
                first.update(frame)
            server.send(raw)

        def from_server(raw: str | bytes) -> None:
            frame = json.loads(raw)
            if frame.get("type") == "ack" and frame.get("id") == first.get("id"):
                lost = {
                    "type": "error",
                    "id": frame["id"],
                    "status": 503,
                    "error": "unavailable",
                    "message": "the message may or may not have been queued",
                    "detail": {"thread_id": frame["thread_id"], "idempotency_key": "x"},
                }
                ws.send(json.dumps(lost))
                return
            ws.send(raw)

        ws.on_message(from_page)
        server.on_message(from_server)

    await page.route_web_socket(re.compile(r"/v1/ws$"), handler)
    await chat.open()
    await chat.say("cobre 150 do João")
    await expect(page.locator("#composer-error")).to_contain_text("will not run twice")
    box = page.get_by_label(chat.message_label, exact=True)
    assert await box.input_value() == "cobre 150 do João"
    [card] = await chat.wait_cards(1)
    await box.press("Enter")
    await expect(page.locator("#composer-error")).to_have_text("")
    sent = [f for f in chat.sent_frames if f.get("type") == "message"]
    assert len(sent) == 2
    assert sent[1]["idempotency_key"] == sent[0]["idempotency_key"]
    assert sent[1]["thread_id"] == card.thread_id and "thread_id" not in sent[0]
    await asyncio.sleep(1.0)  # room for a second run, were there one
    assert [c.id for c in await chat.db_cards()] == [card.id]
    users = [e for e in await chat.h.store.entries_after(card.thread_id, 0) if e.kind == "user"]
    assert len(users) == 1


def socket_dropped_before_ack(text: str | None) -> Callable[[Any], Awaitable[None]]:
    """A WebSocket route that closes the page's socket (1011) instead of passing on the
    ``ack`` of its first ``message`` frame (with ``text``, if given): the answer lost."""
    first: dict[str, Any] = {}
    closing: list[Any] = []

    async def handler(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_page(raw: str | bytes) -> None:
            frame = json.loads(raw)
            if frame.get("type") == "message" and text in (None, frame.get("text")):
                first.setdefault("id", frame["id"])
            server.send(raw)

        def from_server(raw: str | bytes) -> None:
            frame = json.loads(raw)
            if frame.get("type") == "ack" and frame.get("id") == first.get("id"):
                closing.append(asyncio.ensure_future(ws.close(code=1011)))  # dropped: no ack
                return
            ws.send(raw)

        ws.on_message(from_page)
        server.on_message(from_server)

    return handler


async def test_a_message_whose_socket_dropped_before_its_ack_is_sent_again_once(
    chat: Chat,
) -> None:
    """A review's finding: the socket dropped after a new conversation's first message
    went out and before its ``ack``; the page had cleared the box and forgot the message,
    and sent again by hand it was a new message in a new thread: the charge proposed
    twice. The page now puts the text back with its key, and the server gives a keyed
    message naming no thread the key's thread: one thread, one run, one card."""
    page = chat.page
    await page.route_web_socket(re.compile(r"/v1/ws$"), socket_dropped_before_ack(None))
    await chat.open()
    await chat.say("cobre 150 do João")
    await expect(page.locator("#composer-error")).to_contain_text("will not run twice")
    box = page.get_by_label(chat.message_label, exact=True)
    assert await box.input_value() == "cobre 150 do João"
    await expect(page.locator("#conn")).to_have_text("Online", timeout=15_000)
    await box.press("Enter")
    await expect(page.locator("#composer-error")).to_have_text("", timeout=15_000)
    [card] = await chat.wait_cards(1)  # the thread its first send made, now shown
    sent = [f for f in chat.sent_frames if f.get("type") == "message"]
    assert len(sent) == 2, sent
    assert sent[1]["idempotency_key"] == sent[0]["idempotency_key"]
    assert "thread_id" not in sent[0]
    await asyncio.sleep(1.0)  # room for a second run, were there one
    assert [c.id for c in await chat.db_cards()] == [card.id]
    users = [e for e in await chat.h.store.entries_after(card.thread_id, 0) if e.kind == "user"]
    assert len(users) == 1


async def test_the_page_says_offline_when_the_browser_loses_the_network(chat: Chat) -> None:
    """A first-hour probe: with the network gone the page still said "Online" (the browser
    stalls a socket rather than closing it) and a decision sat at "Sending your
    decision…". The page now drops the socket when the browser says it is offline,
    and connects again when it is back."""
    await chat.open()
    page = chat.page
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    # Named by its summary, for a screen reader (every card sounded the same).
    await expect(ui).to_have_attribute("aria-label", f"Confirmation: {card.summary}")
    await expect(ui.get_by_role("group", name=f"Decision: {card.summary}")).to_be_visible()
    await page.context.set_offline(True)
    await expect(page.locator("#conn")).to_have_text(
        "Offline — no network; reconnecting when it is back"
    )
    await expect(ui.get_by_role("button", name="Confirm")).to_be_disabled()
    await chat.shot("1-offline")
    await page.context.set_offline(False)
    await expect(page.locator("#conn")).to_have_text("Online")
    await ui.get_by_role("button", name="Confirm").click()
    await expect(ui).to_have_attribute("data-status", "executed")
    await chat.h.settle()
    assert await chat.h.charges() == 1


async def test_a_socket_that_stops_carrying_frames_is_let_go_and_reopened(chat: Chat) -> None:
    """A first-hour probe: a network gone without the browser knowing (dropped Wi-Fi, a
    laptop waking) kept the socket looking open, and the page said "Online" while
    nothing went through. The page pings after a silence and, with nothing back in time,
    lets the socket go and connects again (shortened here to 1 s and 1 s)."""
    page = chat.page
    await page.add_init_script("sessionStorage.setItem('signoff.heartbeat', '1000,1000')")
    stalled = {"now": False}

    async def handler(ws: Any) -> None:
        server = ws.connect_to_server()

        def to_page(message: Any) -> None:
            if not stalled["now"]:
                ws.send(message)

        server.on_message(to_page)

    await page.route_web_socket(re.compile(r"/v1/ws$"), handler)
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    stalled["now"] = True  # the server's frames stop reaching the page
    await expect(page.locator("#conn")).to_have_text(re.compile("^Offline"), timeout=10_000)
    await expect(ui.get_by_role("button", name="Confirm")).to_be_disabled()
    await chat.shot("1-stalled")
    stalled["now"] = False
    await expect(page.locator("#conn")).to_have_text("Online", timeout=15_000)
    await ui.get_by_role("button", name="Confirm").click()
    await expect(ui).to_have_attribute("data-status", "executed")


async def test_an_open_form_survives_reload_and_language_and_says_when_it_was_not_sent(
    chat: Chat,
) -> None:
    """A first-hour walkthrough: an edit half typed vanished on a reload or a language
    switch, and an open form vanished without a word when the card was decided
    elsewhere, so the person could believe their edit was on its way."""
    await chat.open()
    page = chat.page
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    await ui.locator(".actions").get_by_role("button", name="Edit").click()
    await ui.get_by_label("Amount (R$)").fill("175")
    await page.reload()
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(ui.get_by_label("Amount (R$)")).to_have_value("175")  # the draft, reopened
    await page.get_by_label("Language").select_option("pt-BR")
    await expect(ui.get_by_label("Valor (R$)")).to_have_value("175")
    await page.get_by_label("Idioma").select_option("en")
    await ui.get_by_role("button", name="Cancel").click()  # cancelled: no draft any more
    await page.reload()
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(ui).to_have_attribute("data-status", "pending")
    await expect(ui.locator(".card-form")).to_be_empty()
    # A reason being typed when another tab approves the card: said, not silently lost.
    await ui.locator(".actions").get_by_role("button", name="Reject").click()
    await ui.get_by_label("Reason").fill("valor errado")
    await chat.shot("1-reason-typed")
    await approve_elsewhere(chat, card)
    await expect(ui).to_have_attribute("data-status", "executed")
    await expect(ui.locator(".card-error")).to_have_text(
        "Your rejection was not sent: the card was decided (or replaced) elsewhere first."
    )
    await expect(page.locator(".thread-badge")).to_have_count(0)  # the list follows
    await chat.shot("2-reason-not-sent")
    assert await page.evaluate("Object.keys(sessionStorage).filter(k => k.startsWith('signoff.draft.')).length") == 0  # fmt: skip
    assert chat.resolve_frames() == []
    # An edit sent by this page is no unsent draft: no such word after it is decided.
    other = await propose_charge(chat, "cobre 90 da Maria")
    other_ui = chat.card(other.id)
    await other_ui.locator(".actions").get_by_role("button", name="Edit").click()
    await other_ui.get_by_label("Amount (R$)").fill("95")
    await other_ui.get_by_role("button", name="Propose edited card").click()
    await expect(other_ui).to_have_attribute("data-status", "modified")
    await expect(other_ui.locator(".card-error")).to_be_empty()


async def test_a_message_under_a_waiting_card_asks_first_and_can_go_to_a_new_chat(
    chat: Chat,
) -> None:
    """A first-hour walkthrough: opening the chat on a second device landed under a card
    waiting there, and the first words typed replaced it without a word ("Superseded").
    The composer says what sending here would do; the person sends here (the card is
    replaced), or in a new chat (the card keeps waiting)."""
    await chat.open()
    page = chat.page
    card = await propose_charge(chat)
    await chat.say("saldo", here=False)
    guard = page.locator("#replace-guard")
    await expect(guard).to_be_visible()
    await expect(guard).to_contain_text("replaces the card waiting")
    await chat.shot("1-asked")
    assert not [f for f in chat.sent_frames if f.get("type") == "message" and f["text"] == "saldo"]
    await page.get_by_role("button", name="Send in a new chat").click()
    await expect(guard).to_be_hidden()
    await expect(page.locator(".msg.user", has_text="saldo")).to_have_count(1)
    await expect(chat.card(card.id)).to_have_count(0)  # a new conversation
    assert (await chat.h.store.get_card(card.id)).status == "pending"
    # Back in the card's conversation, a correction sent here replaces it, once chosen.
    await page.locator(".thread-link", has_text="cobre 150 do João").click()
    ui = chat.card(card.id)
    await expect(ui).to_have_attribute("data-status", "pending")
    await chat.say("não, são 120", here=False)
    await expect(guard).to_be_visible()
    await page.get_by_role("button", name="Send here").click()
    await expect(ui).to_have_attribute("data-status", "superseded")
    await expect(guard).to_be_hidden()


async def test_a_decision_cut_off_by_the_network_says_it_may_not_have_arrived(
    chat: Chat,
) -> None:
    """A first-hour walkthrough: Confirm clicked, then the network gone before the answer:
    the card went back to "Waiting for your decision" with no word, as if the click was
    lost. It says the decision may or may not have arrived; back online it shows which."""
    page = chat.page
    swallowed: list[dict[str, Any]] = []

    async def handler(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_page(raw: str | bytes) -> None:
            frame = json.loads(raw)
            if frame.get("type") == "resolve" and not swallowed:
                swallowed.append(frame)  # lost on the way: the network went first
                return
            server.send(raw)

        ws.on_message(from_page)
        server.on_message(lambda raw: ws.send(raw))

    await page.route_web_socket(re.compile(r"/v1/ws$"), handler)
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    await ui.get_by_role("button", name="Confirm").click()
    await expect(ui.locator(".progress")).to_have_text("Sending your decision…")
    await page.context.set_offline(True)
    await expect(ui.locator(".card-error")).to_contain_text("may or may not have arrived")
    await chat.shot("1-unknown")
    await page.context.set_offline(False)
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(ui).to_have_attribute("data-status", "pending")  # it did not arrive
    await ui.get_by_role("button", name="Confirm").click()
    await expect(ui).to_have_attribute("data-status", "executed")
    await expect(ui.locator(".card-error")).to_be_empty()


async def test_propose_again_beside_a_waiting_card_asks_first(chat: Chat) -> None:
    """A review: "Propose again" sent its message without the composer's question, so it
    replaced another card still waiting (a refund beside the expired charge)."""
    await chat.open()
    page = chat.page
    await chat.say("cobre 150 do João e estorne a venda V002")
    cards = await chat.wait_cards(2)
    charge = next(c for c in cards if c.tool == "create_pix_charge")
    refund = next(c for c in cards if c.tool == "refund_sale")
    await chat.h.provider.pool.execute(
        "UPDATE cards SET expires_at = now() - interval '1 second' WHERE id = $1::uuid", charge.id
    )
    await chat.h.worker.sweep()
    await expect(chat.card(charge.id)).to_have_attribute("data-status", "expired")
    await chat.card(charge.id).get_by_role("button", name="Propose again").click()
    await expect(page.locator("#replace-guard")).to_be_visible()
    box = page.get_by_label(chat.message_label, exact=True)
    await expect(box).to_have_value(re.compile(r"^Propose again: "))
    assert [f for f in chat.sent_frames if f.get("type") == "message"][1:] == []
    assert (await chat.h.store.get_card(refund.id)).status == "pending"


async def test_propose_again_of_an_edited_card_keeps_its_description(chat: Chat) -> None:
    """A first-hour walkthrough: "Propose again" of an expired card that had been edited
    (an amount and a description) proposed a card without the description: the page sent
    only the summary. It sends the card's own fields too."""
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    await ui.locator(".actions").get_by_role("button", name="Edit").click()
    await ui.get_by_label("Description").fill("aluguel de março")
    await ui.get_by_role("button", name="Propose edited card").click()
    # The old card says "modified" first: read before the edit committed, the one pending
    # card was the old one, and the test expired that (CI once proposed it again).
    await expect(ui).to_have_attribute("data-status", "modified")
    [edited] = await chat.wait_cards(1)
    await chat.h.provider.pool.execute(
        "UPDATE cards SET expires_at = now() - interval '1 second' WHERE id = $1::uuid",
        edited.id,
    )
    await chat.h.worker.sweep()
    await expect(chat.card(edited.id)).to_have_attribute("data-status", "expired")
    await chat.card(edited.id).get_by_role("button", name="Propose again").click()
    [again] = await chat.wait_cards(1)
    assert again.id != edited.id
    assert again.args_snapshot.get("description") == "aluguel de março", again.args_snapshot
    await expect(chat.card(again.id).locator(".impact")).to_contain_text("aluguel de março")


async def test_propose_again_sent_after_the_question_is_not_offered_twice(chat: Chat) -> None:
    """A review: "Propose again" under a waiting card asks first; once sent ("Send
    here"), its button stayed live, and a second press proposed the same card again (the
    waiting card gone by then, nothing asked)."""
    await chat.open()
    page = chat.page
    await chat.say("cobre 150 do João e estorne a venda V002")
    cards = await chat.wait_cards(2)
    charge = next(c for c in cards if c.tool == "create_pix_charge")
    await chat.h.provider.pool.execute(
        "UPDATE cards SET expires_at = now() - interval '1 second' WHERE id = $1::uuid", charge.id
    )
    await chat.h.worker.sweep()
    ui = chat.card(charge.id)
    await expect(ui).to_have_attribute("data-status", "expired")
    await ui.get_by_role("button", name="Propose again").click()
    await page.get_by_role("button", name="Send here").click()
    # At once, before the new card can arrive (which also takes the button away).
    offered = await page.evaluate(
        """id => [...document.querySelectorAll(`article.card[data-card-id="${id}"] button`)]
                 .filter(b => b.textContent.includes('Propose again') && !b.closest('[hidden]'))
                 .length""",
        charge.id,
    )
    assert offered == 0
    await expect(page.locator("#replace-guard")).to_be_hidden()
    await asyncio.sleep(1.0)
    sent = [f for f in chat.sent_frames if f.get("type") == "message"]
    assert len(sent) == 2, sent  # the request, and one proposal again


async def test_a_refused_edit_then_decided_elsewhere_says_it_was_not_sent(chat: Chat) -> None:
    """A review: a decision the server refused (422) left the form open but marked as
    sent, so when the card was then decided elsewhere the edit vanished without the
    "not sent" word."""
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    await ui.locator(".actions").get_by_role("button", name="Edit").click()
    await ui.get_by_label("Amount (R$)").fill("0")
    await ui.get_by_role("button", name="Propose edited card").click()
    await expect(ui.locator(".card-error")).not_to_be_empty()  # refused: the form stays
    await expect(ui).to_have_attribute("data-status", "pending")
    await approve_elsewhere(chat, card)
    await expect(ui).to_have_attribute("data-status", "executed")
    await expect(ui.locator(".card-error")).to_contain_text("was not sent")


async def test_a_message_to_send_again_asks_in_another_thread_with_waiting_cards(
    chat: Chat,
) -> None:
    """A review: a new chat's first message whose answer was lost (its text back in the
    box, to be sent again under its key) was sent unasked into another thread opened
    meanwhile, replacing the card waiting there."""
    page = chat.page
    await page.route_web_socket(re.compile(r"/v1/ws$"), socket_dropped_before_ack("saldo"))
    await chat.open()
    card = await propose_charge(chat)
    await page.locator("#new-chat").click()
    await chat.say("saldo")
    await expect(page.locator("#composer-error")).to_contain_text("will not run twice")
    await expect(page.locator("#conn")).to_have_text("Online", timeout=15_000)
    await page.locator(".thread-link", has_text="cobre 150 do João").click()
    ui = chat.card(card.id)
    await expect(ui).to_have_attribute("data-status", "pending")
    box = page.get_by_label(chat.message_label, exact=True)
    await expect(box).to_have_value("saldo")
    await box.press("Enter")
    await expect(page.locator("#replace-guard")).to_be_visible()
    assert len([f for f in chat.sent_frames if f.get("text") == "saldo"]) == 1
    assert (await chat.h.store.get_card(card.id)).status == "pending"


async def test_confirm_all_asks_again_when_its_cards_change(chat: Chat) -> None:
    """The question names the cards it would confirm; once one of them is decided
    elsewhere it closes, so a "Yes" never confirms a list the person did not read."""
    await chat.open()
    page = chat.page
    await chat.say("cobre 150 do João e estorne a venda V002")
    cards = await chat.wait_cards(2)
    await page.get_by_role("button", name="Confirm all 2").click()
    check = page.locator("#batch-check")
    await expect(check).to_be_visible()
    # The question has the focus, not "Yes" (a second Enter confirmed everything: a
    # review), and "Reject all" waits (a double click's second half landed on it).
    await expect(page.locator("#batch-check-text")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(check).to_be_visible()
    await expect(page.get_by_role("button", name="Reject all 2")).to_be_disabled()
    refund = next(c for c in cards if c.tool == "refund_sale")
    await chat.h.decisions.resolve(
        refund.id,
        Resolution(decision=Decision.REJECT, snapshot_hash=refund.snapshot_hash),
        principal=chat.user,
        channel="http",
    )
    await expect(chat.card(refund.id)).to_have_attribute("data-status", "rejected")
    await expect(check).to_be_hidden()
    assert [f for f in chat.resolve_frames() if f["decision"] == "approve"] == []


async def test_an_emptied_amount_is_refused_in_the_tools_words(chat: Chat) -> None:
    """A first-hour walkthrough: clearing the amount and proposing said "Change a field
    first", though the person had changed it. The emptied field goes to the tool, whose
    refusal says what is wrong; the card keeps waiting."""
    await chat.open()
    card = await propose_charge(chat)
    ui = chat.card(card.id)
    await ui.locator(".actions").get_by_role("button", name="Edit").click()
    await ui.get_by_label("Amount (R$)").fill("")
    await ui.get_by_role("button", name="Propose edited card").click()
    error = ui.locator(".card-error")
    await expect(error).not_to_be_empty()
    assert "Change a field first" not in (await error.text_content() or "")
    await expect(ui).to_have_attribute("data-status", "pending")
    assert (await chat.h.store.get_card(card.id)).status == "pending"


async def test_a_keyboard_user_skips_to_the_waiting_card(chat: Chat) -> None:
    """A first-hour walkthrough: reaching a card's Confirm from the page's start took a
    Tab through the header and every conversation of the list. A skip link, there while
    cards wait, takes the focus to the first of them; its Confirm is the next Tab."""
    await chat.open()
    page = chat.page
    card = await propose_charge(chat)
    skip = page.locator("#skip-cards")
    await expect(skip).to_be_attached()
    await skip.focus()
    await page.keyboard.press("Enter")
    await expect(chat.card(card.id)).to_be_focused()
    await page.keyboard.press("Tab")
    focused = await page.evaluate("document.activeElement.textContent")
    assert focused.strip() == "Confirm", focused
