"""The first hour of a person using the chat (issue 17), in Brazilian Portuguese and in
English: the page's own words and formats follow the browser's language, a full card
flow (propose, edit, reject, approve, the executed result view), the thread list with
its live badges and deep links, reload scrolled to the newest message, and no axe-core
violation of impact serious or critical in any state.

Screenshots of every state go to ``tests/artifacts/screenshots/`` and, with
``SIGNOFF_UPDATE_SCREENS=1``, to ``docs/screens/`` too (two of those are in the README),
so that a test run does not rewrite tracked files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import SCREENSHOTS, Chat, expect, needs_browser

pytestmark = [pytest.mark.anyio, needs_browser]

SCREENS = Path(__file__).resolve().parents[2] / "docs" / "screens"


@dataclass(frozen=True)
class Words:
    """What the page says, per language, and what the person types."""

    locale: str
    lang: str
    online: str
    none: str
    title: str
    confirm: str
    reject: str
    edit: str
    propose_edited: str
    reason_label: str
    pending_one: str
    waiting: str
    amount_150: str
    amount_200: str
    modified: str
    rejected: str
    reason: str
    created: str
    approved: str
    copy: str
    code_label: str
    new_chat: str
    charge: str
    charge_maria: str
    balance: str
    balance_reply: str
    charge_reply: str
    reject_reply: str
    announce_new: str
    toggle: str
    message: str


PT = Words(
    locale="pt-BR",
    lang="pt-BR",
    online="Conectado",
    none="Nenhuma conversa ainda.",
    title="Confirmação",
    confirm="Confirmar",
    reject="Recusar",
    edit="Editar",
    propose_edited="Propor cartão editado",
    reason_label="Motivo (opcional)",
    pending_one="1 confirmação pendente",
    waiting="1 aguardando",
    amount_150=r"R\$\s150,00",
    amount_200=r"R\$\s200,00",
    modified=r"Editado por {user} no chat às \d\d:\d\d; substituído por um novo cartão\.",
    rejected=r"Recusado por {user} no chat às \d\d:\d\d\. Nada foi feito\.",
    reason="Motivo: valor errado",
    created=r"^Cobrança Pix criada · R\$\s150,00$",
    code_label="código copia-e-cola",
    approved=r"Aprovado por {user} no chat às \d\d:\d\d\.",
    copy="Copiar",
    new_chat="Nova conversa",
    charge="cobre 150 do João",
    charge_maria="cobra a Maria em 20",
    balance="saldo",
    balance_reply="Seu saldo é R$ 5.000,00.",
    charge_reply="Cobrança Pix de R$ 150,00 criada para João",
    reject_reply="Certo, não fiz nada: você recusou o cartão.",
    announce_new="Novo cartão de confirmação",
    toggle="Conversas",
    message="Mensagem",
)

EN = Words(
    locale="en-US",
    lang="en",
    online="Online",
    none="No conversations yet.",
    title="Confirmation",
    confirm="Confirm",
    reject="Reject",
    edit="Edit",
    propose_edited="Propose edited card",
    reason_label="Reason (optional)",
    pending_one="1 confirmation pending",
    waiting="1 waiting",
    amount_150=r"R\$150\.00",
    amount_200=r"R\$200\.00",
    modified=r"Edited by {user} in the chat at \d\d:\d\d [AP]M; replaced by a new card\.",
    rejected=r"Rejected by {user} in the chat at \d\d:\d\d [AP]M\. Nothing was done\.",
    reason="Reason: valor errado",
    created=r"^Pix charge created · R\$150\.00$",
    code_label="copy-and-paste code",
    approved=r"Approved by {user} in the chat at \d\d:\d\d [AP]M\.",
    copy="Copy",
    new_chat="New chat",
    charge="charge João 150",
    charge_maria="charge 20 to Maria",
    balance="balance",
    balance_reply="Your balance is R$ 5,000.00.",
    charge_reply="Pix charge of R$ 150.00 created for João",
    reject_reply="OK, nothing was done: you rejected the card.",
    announce_new="New confirmation card",
    toggle="Conversations",
    message="Message",
)


async def shot(chat: Chat, name: str) -> None:
    folders = [SCREENSHOTS / "languages"]
    if os.environ.get("SIGNOFF_UPDATE_SCREENS") == "1":
        folders.append(SCREENS)
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        await chat.page.screenshot(path=str(folder / f"{name}.png"), full_page=False)


async def no_axe_violations(chat: Chat, state: str) -> None:
    found = await chat.axe()
    assert found == [], (state, found)


async def thread_list(chat: Chat, w: Words, mobile: bool) -> Any:
    """The thread list, opened first on a phone (it sits behind its header button)."""
    nav = chat.page.get_by_role("navigation", name=w.toggle)
    if mobile and not await nav.is_visible():
        await chat.page.get_by_role("button", name=re.compile(w.toggle)).click()
    await expect(nav).to_be_visible()
    return nav


async def close_list(chat: Chat, w: Words, mobile: bool) -> None:
    if mobile:
        toggle = chat.page.get_by_role("button", name=re.compile(w.toggle))
        if await toggle.get_attribute("aria-expanded") == "true":
            await toggle.click()


@pytest.mark.parametrize(
    ("w", "size"),
    [
        pytest.param(PT, (1100, 800), id="pt-BR-desktop"),
        pytest.param(EN, (390, 844), id="en-mobile"),
    ],
)
async def test_full_flow_in_the_persons_language(
    chat_factory: Callable[..., Awaitable[Chat]], w: Words, size: tuple[int, int]
) -> None:
    chat = await chat_factory(locale=w.locale)
    chat.message_label = w.message
    page = chat.page
    mobile = size[0] < 600
    tag = f"{w.lang}-{'mobile' if mobile else 'desktop'}"
    await page.set_viewport_size({"width": size[0], "height": size[1]})
    await page.goto(chat.url + f"#token={chat.h.token(chat.user)}")
    await expect(page.locator("#conn")).to_have_text(w.online)
    await expect(page.locator("html")).to_have_attribute("lang", w.lang)
    nav = await thread_list(chat, w, mobile)
    await expect(page.locator("#threads-none")).to_have_text(w.none)
    await no_axe_violations(chat, "empty")
    await shot(chat, f"{tag}-1-empty")
    await close_list(chat, w, mobile)

    # Propose: the page's words in the person's language, the summary as the tool wrote it.
    await chat.say(w.charge)
    [first] = await chat.wait_cards(1)
    ui = chat.card(first.id)
    await expect(ui.locator(".card-summary")).to_have_text(first.summary)
    await expect(ui.locator(".card-title")).to_have_text(w.title)
    await expect(ui.locator(".impact")).to_contain_text(re.compile(w.amount_150))
    await expect(page.locator("#pending-text")).to_have_text(w.pending_one)
    await expect(page.locator("#announcer")).to_contain_text(w.announce_new)
    # No words about a card before the card (nor any English internals).
    assert await page.locator(".msg.assistant").count() == 0
    nav = await thread_list(chat, w, mobile)
    await expect(nav.locator(".thread-badge")).to_have_text([w.waiting])
    await no_axe_violations(chat, "pending")
    await shot(chat, f"{tag}-2-pending")
    await close_list(chat, w, mobile)

    # Edit: Confirm waits while the form is open; saving makes a new card.
    await ui.get_by_role("button", name=w.edit, exact=True).click()
    await expect(ui.get_by_role("button", name=w.confirm, exact=True)).to_be_disabled()
    amount = ui.get_by_role("textbox").first
    await expect(amount).to_be_focused()
    await amount.fill("200")
    await no_axe_violations(chat, "edit form")
    await shot(chat, f"{tag}-3-edit")
    await ui.get_by_role("button", name=w.propose_edited).click()
    await expect(ui).to_have_attribute("data-status", "modified")
    await expect(ui.locator(".outcome")).to_contain_text(
        re.compile(w.modified.format(user=re.escape(chat.user)))
    )
    [edited] = await chat.wait_cards(1)
    assert edited.id != first.id and edited.snapshot_hash != first.snapshot_hash
    new_ui = chat.card(edited.id)
    await expect(new_ui.locator(".impact")).to_contain_text(re.compile(w.amount_200))

    # Reject: one Reject action while its form is open.
    await new_ui.get_by_role("button", name=w.reject, exact=True).click()
    await expect(new_ui.get_by_role("button", name=w.reject, exact=True)).to_have_count(1)
    await expect(new_ui.get_by_label(w.reason_label)).to_be_focused()
    await page.keyboard.type("valor errado")
    await no_axe_violations(chat, "reject form")
    await page.keyboard.press("Enter")
    await expect(new_ui).to_have_attribute("data-status", "rejected")
    await expect(new_ui.locator(".outcome")).to_contain_text(
        re.compile(w.rejected.format(user=re.escape(chat.user)))
    )
    await expect(new_ui.locator(".outcome")).to_contain_text(w.reason)
    await expect(page.locator(".msg.assistant").last).to_contain_text(w.reject_reply)
    # Nothing waits any more: the list's badge went away by itself.
    await expect(page.locator("#thread-list .thread-badge")).to_have_count(0)
    await expect(page.locator("#threads-toggle-badge")).to_be_hidden()
    await shot(chat, f"{tag}-4-rejected")

    # Approve: the executed card shows the tool's result view, not the provider's output.
    await chat.say(w.charge)
    [third] = await chat.wait_cards(1)
    third_ui = chat.card(third.id)
    await third_ui.get_by_role("button", name=w.confirm, exact=True).click()
    await expect(third_ui).to_have_attribute("data-status", "executed")
    outcome = third_ui.locator(".outcome")
    await expect(outcome.locator(".result-line")).to_have_text(re.compile(w.created))
    await expect(outcome).to_contain_text(re.compile(w.approved.format(user=re.escape(chat.user))))
    await expect(outcome.get_by_role("button", name=re.compile(w.copy))).to_be_visible()
    await expect(outcome.locator("code")).to_have_text(re.compile(r"^00020126PIX\d{8}$"))
    # The code's label is said once, on its row, with its button (not in the line above).
    assert (await outcome.inner_text()).count(w.code_label) == 1
    for raw in ("copy_paste", "charge_id", "15000", "amount"):
        assert raw not in (await outcome.inner_text()), raw
    await expect(page.locator(".msg.assistant").last).to_contain_text(w.charge_reply)
    await no_axe_violations(chat, "executed")
    await shot(chat, f"{tag}-5-executed")
    await chat.h.settle()
    assert await chat.h.charges() == 1
    first_thread = first.thread_id

    # A second thread: the list puts it first; a card made elsewhere (the HTTP API) in
    # the first thread shows its badge live and moves it up.
    await page.get_by_role("button", name=w.new_chat).click()
    await chat.say(w.balance)
    await expect(page.locator(".msg.assistant").last).to_have_text(
        re.compile(re.escape(w.balance_reply) + "$")
    )
    nav = await thread_list(chat, w, mobile)
    links = nav.locator(".thread-link")
    await expect(links).to_have_count(2)
    await expect(links.first).to_have_attribute("aria-current", "page")
    await expect(links.nth(1)).to_have_attribute("href", f"?thread={first_thread}")
    async with httpx.AsyncClient(base_url=chat.h.base_url) as client:
        res = await client.post(
            f"/v1/threads/{first_thread}/messages",
            json={"text": w.charge_maria},
            headers={"Authorization": f"Bearer {chat.h.token(chat.user)}"},
        )
        assert res.status_code == 202, res.text
    await expect(links.first).to_have_attribute("href", f"?thread={first_thread}")
    await expect(links.first.locator(".thread-badge")).to_have_text(w.waiting)
    await no_axe_violations(chat, "thread list")
    await shot(chat, f"{tag}-6-threads")

    # Open it from the list: its cards are there, and the newest one is in view.
    await links.first.click()
    assert f"thread={first_thread}" in page.url
    [maria] = await chat.db_cards("pending")
    await expect(chat.card(maria.id)).to_have_attribute("data-status", "pending")
    await expect(page.locator("#transcript > li").last).to_be_in_viewport()

    # A reload (the deep link) comes back scrolled to the newest message.
    await page.reload()
    await expect(page.locator("#conn")).to_have_text(w.online)
    await expect(chat.card(maria.id)).to_have_attribute("data-status", "pending")
    await expect(page.locator("#transcript > li").last).to_be_in_viewport()
    await expect(chat.card(first.id)).not_to_be_in_viewport()
    await shot(chat, f"{tag}-7-reloaded")


async def test_language_is_switchable_on_the_page(chat: Chat) -> None:
    page = chat.page
    await chat.open()  # en-US browser
    await chat.say("cobre 150 do João")
    [card] = await chat.wait_cards(1)
    ui = chat.card(card.id)
    await expect(ui.get_by_role("button", name="Confirm", exact=True)).to_be_visible()
    await page.get_by_label("Language").select_option("pt-BR")
    await expect(page.locator("html")).to_have_attribute("lang", "pt-BR")
    await expect(page.locator("#conn")).to_have_text("Conectado")
    await expect(ui.get_by_role("button", name="Confirmar", exact=True)).to_be_visible()
    await expect(ui.locator(".impact")).to_contain_text(re.compile(r"R\$\s150,00"))
    await expect(ui.locator(".card-summary")).to_have_text(card.summary)
    await expect(page.get_by_label("Mensagem", exact=True)).to_be_visible()
    # The choice is kept across a reload.
    await page.reload()
    await expect(page.locator("#conn")).to_have_text("Conectado")
    await page.get_by_label("Idioma").select_option("en")
    await expect(page.locator("#conn")).to_have_text("Online")


async def test_the_accessibility_check_finds_what_it_is_for(chat: Chat) -> None:
    """A check that cannot fail proves nothing: without its label, the message box is a
    violation axe-core reports (so the zero counts above are real)."""
    await chat.open()
    assert await chat.axe() == []
    await chat.page.evaluate("document.querySelector('label[for=text]').remove()")
    await chat.page.evaluate("document.getElementById('text').removeAttribute('placeholder')")
    found = await chat.axe()
    assert [v["id"] for v in found] == ["label"], found
    assert found[0]["impact"] == "critical"


async def test_keyboard_order_and_labels_in_portuguese(
    chat_factory: Callable[..., Awaitable[Chat]],
) -> None:
    """Tab walks the page in reading order: the skip link, the header, the thread list,
    the card's decision buttons, then the message box; every control has a name."""
    chat = await chat_factory(locale="pt-BR")
    chat.message_label = PT.message
    page = chat.page
    await page.set_viewport_size({"width": 1100, "height": 800})
    await page.goto(chat.url + f"#token={chat.h.token(chat.user)}")
    await expect(page.locator("#conn")).to_have_text(PT.online)
    await chat.say(PT.charge)
    [card] = await chat.wait_cards(1)
    await expect(page.locator(".thread-link")).to_have_count(1)
    await page.reload()  # the deep link; focus starts at the top of the document
    await expect(chat.card(card.id)).to_have_attribute("data-status", "pending")
    names: list[str] = []
    for _ in range(12):
        await page.keyboard.press("Tab")
        names.append(
            await page.evaluate(
                """() => { const e = document.activeElement;
                           return e.tagName.toLowerCase() + ':' +
                             (e.getAttribute('aria-label') || (e.labels && e.labels[0] &&
                              e.labels[0].textContent) || e.textContent).trim(); }"""
            )
        )
        if names[-1].startswith("textarea"):
            break
    assert names[0] == "a:Pular para a caixa de mensagem", names
    order = [n.split(":", 1)[1].split("\n")[0] for n in names]
    expected = ["Nova conversa", "Idioma", "Sair", "Confirmar", "Recusar", "Editar", "Mensagem"]
    positions = [next(i for i, n in enumerate(order) if n.startswith(e)) for e in expected]
    assert positions == sorted(positions), names
    thread = next(i for i, n in enumerate(names) if n.startswith("a:cobre 150 do João"))
    assert positions[2] < thread < positions[3], names  # the list comes before the chat
    # The skip link goes straight to the message box.
    await page.reload()
    await expect(chat.card(card.id)).to_have_attribute("data-status", "pending")
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")
    await expect(page.get_by_label(PT.message, exact=True)).to_be_focused()
    assert card.status == "pending"


@pytest.mark.parametrize(
    ("w", "ask", "notice", "reply"),
    [
        (PT, "cobre 150 do Zé", "Nada foi proposto", "Não encontrei nenhum cliente chamado Zé."),
        (EN, "charge Zé 150", "Nothing was proposed", "I found no customer called Zé."),
    ],
    ids=["pt-BR", "en"],
)
async def test_a_refused_request_is_explained_in_the_persons_language(
    chat_factory: Callable[..., Awaitable[Chat]], w: Words, ask: str, notice: str, reply: str
) -> None:
    chat = await chat_factory(locale=w.locale)
    chat.message_label = w.message
    page = chat.page
    await page.goto(chat.url + f"#token={chat.h.token(chat.user)}")
    await expect(page.locator("#conn")).to_have_text(w.online)
    await chat.say(ask)
    await expect(page.locator(".msg.assistant").last).to_contain_text(reply)
    box = page.locator(".notice.tool-error details")
    await expect(box.locator("summary")).to_contain_text(notice)
    # The tool's own words (for the model) are there, but only behind "details".
    await expect(box.locator(".tool-message")).to_be_hidden()
    await box.locator("summary").click()
    await expect(box.locator(".tool-message")).to_contain_text("no customer matches")
    assert await chat.cards().count() == 0
    await no_axe_violations(chat, "refused")
