"""The chat page itself: login, phone width, accessibility hooks, no external URLs."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from tests.browser.conftest import Chat, expect, needs_browser

pytestmark = [pytest.mark.anyio, needs_browser]

ASSETS = [
    "/",
    "/static/i18n.js",
    "/static/views.js",
    "/static/threads.js",
    "/static/app.js",
    "/static/style.css",
    "/static/gate-form.js",
    "/static/gate-form.css",
]


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "action", "srcset", "poster", "data") and value:
                self.refs.append(value)


async def test_page_has_no_external_urls(chat: Chat) -> None:
    base = chat.h.base_url
    host = urlsplit(base).netloc
    async with httpx.AsyncClient(base_url=base) as client:
        bodies = {}
        for path in ASSETS:
            res = await client.get(path)
            assert res.status_code == 200, path
            bodies[path] = res.text
    assert "text/html" in (await _content_type(base, "/"))
    # Every src/href in the HTML is same-origin (or a data: URL).
    parser = _Refs()
    parser.feed(bodies["/"])
    assert parser.refs, "the page references its assets"
    for ref in parser.refs:
        if ref.startswith(("data:", "#")):
            continue
        assert urlsplit(urljoin(base + "/", ref)).netloc == host, ref
    # No absolute http(s) URL anywhere in the page, its script or its stylesheet.
    for path, body in bodies.items():
        assert not re.findall(r"https?://", body), (path, re.findall(r"https?://\S+", body))
        assert "@import" not in body, path
    # And at run time the browser asks nothing of any other host.
    requested: list[str] = []
    chat.page.on("request", lambda r: requested.append(r.url))
    await chat.open()
    await chat.say("saldo")
    await expect(chat.page.locator(".msg.assistant").last).to_contain_text("Seu saldo")
    assert requested
    for url in requested:
        parts = urlsplit(url)
        assert parts.scheme in ("http", "ws", "data") and parts.netloc in (host, ""), url


async def _content_type(base: str, path: str) -> str:
    async with httpx.AsyncClient(base_url=base) as client:
        return (await client.get(path)).headers["content-type"]


async def test_login_form_phone_width_and_balance(chat: Chat) -> None:
    page = chat.page
    await chat.open(token=False, width=375, height=740)
    form = page.get_by_role("region", name="Sign in")
    await expect(form).to_be_visible()
    await expect(page.locator("#composer")).to_be_hidden()
    await chat.shot("1-login-375")
    # A bad token is refused with a clear message and the form stays.
    await page.get_by_label("Token").fill("not-a-token")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#login-error")).to_contain_text("refused")
    await expect(form).to_be_visible()
    # The right one connects.
    await page.get_by_label("Token").fill(chat.h.token(chat.user))
    await page.get_by_label("Token").press("Tab")
    await page.keyboard.press("Enter")
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(form).to_be_hidden()
    await expect(page.locator("#who")).to_have_text(f"Signed in as {chat.user}")
    await chat.say("saldo")
    await expect(page.locator(".msg.assistant").last).to_contain_text("5.000,00")
    await chat.say("cobre 150 do João")
    [card] = await chat.wait_cards(1)
    ui = chat.card(card.id)
    await expect(ui.get_by_role("button", name="Confirm")).to_be_visible()
    # Nothing is wider than the phone.
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375, width
    box = await ui.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375, box
    for name in ("Confirm", "Reject", "Edit"):
        b = await ui.get_by_role("button", name=name).bounding_box()
        assert b is not None and b["x"] + b["width"] <= 375 and b["height"] >= 40, (name, b)
    await chat.shot("2-card-375")
    # The token lives in the browser's storage (not in the URL); a reload keeps the session.
    assert "token" not in page.url
    await page.reload()
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(ui).to_have_attribute("data-status", "pending")


async def test_accessibility_hooks(chat: Chat) -> None:
    page = chat.page
    await chat.open()
    live = page.locator("#announcer")
    await expect(live).to_have_attribute("aria-live", "polite")
    await chat.say("cobre 150 do João")
    [card] = await chat.wait_cards(1)
    ui = chat.card(card.id)
    await expect(live).to_have_text(
        f"New confirmation card: {card.summary}. Confirm, reject or edit it."
    )
    # The card is a labelled article; its decision buttons are real buttons in a group.
    await expect(page.get_by_role("article", name="Confirmation")).to_have_count(1)
    group = ui.get_by_role("group", name="Decision")
    await expect(group.get_by_role("button")).to_have_count(3)
    # Enter on a focused Confirm button decides it.
    await group.get_by_role("button", name="Confirm").focus()
    await page.keyboard.press("Enter")
    await expect(ui).to_have_attribute("data-status", "executed")
    await expect(live).to_contain_text("Card executed")
    await chat.h.settle()
    assert await chat.h.charges() == 1


async def test_summary_is_text_not_html(chat: Chat) -> None:
    """A hostile string in a summary shows as text; no element is created from it."""
    await chat.open()
    await chat.say("cobre 150 do João")
    [card] = await chat.wait_cards(1)
    evil = '<img src=x onerror="window.__pwned=1"><b>bold</b>'
    await chat.h.provider.pool.execute(
        "UPDATE cards SET summary = $2 WHERE id = $1::uuid", card.id, evil
    )
    # Supersede through the page so that a card_update with the new summary is sent.
    await chat.say("sim")
    ui = chat.card(card.id)
    await expect(ui).to_have_attribute("data-status", "superseded")
    await expect(ui.locator(".card-summary")).to_have_text(evil)
    assert await ui.locator(".card-summary img, .card-summary b").count() == 0
    assert await chat.page.evaluate("window.__pwned === undefined")


async def test_a_link_never_swaps_the_signed_in_user_silently(chat: Chat) -> None:
    """Login CSRF: a link ``/#token=<someone else's token>`` replaced this tab's session
    without a word, and what was then typed or confirmed was theirs. The session stays
    and the page says why; a link of the same user, or into a fresh tab, signs in."""
    page = chat.page
    await chat.open()
    await expect(page.locator("#who")).to_have_text(f"Signed in as {chat.user}")
    other = chat.user + "-mallory"
    await page.goto("about:blank")  # the link opened in this tab: a new page load
    await page.goto(chat.url + f"#token={chat.h.token(other)}")
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(page.locator("#who")).to_have_text(f"Signed in as {chat.user}")
    notice = page.locator("#composer-error")
    await expect(notice).to_contain_text("as another user")
    assert other not in await notice.inner_text()  # an unverified claim is never echoed
    assert "token" not in page.url
    # the same link into the loaded tab (a fragment change only) is taken as a page load
    # takes it: it did nothing and the token stayed in the address bar and the history
    await page.evaluate(f"location.hash = '#token={chat.h.token(other)}'")
    await expect(page).not_to_have_url(re.compile("token="))
    await expect(page.locator("#who")).to_have_text(f"Signed in as {chat.user}")
    # The same user's fresh link is taken (a renewed token), and signing out lets the
    # other one in.
    await page.goto("about:blank")
    await page.goto(chat.url + f"#token={chat.h.token(chat.user)}")
    await expect(page.locator("#who")).to_have_text(f"Signed in as {chat.user}")
    await page.get_by_role("button", name="Sign out").click()
    await page.goto("about:blank")
    await page.goto(chat.url + f"#token={chat.h.token(other)}")
    await expect(page.locator("#who")).to_have_text(f"Signed in as {other}")


async def test_a_thread_opened_in_a_new_tab_is_signed_in(chat: Chat) -> None:
    """The newcomer probe: a thread of the list opened in a new tab (each line is a
    ``?thread=`` link), or its address pasted into one, asked for a token again (the
    sign-in was the tab's). It is the browser's now: the new tab opens the thread
    signed in, and signing out in one tab signs the next page load of any out."""
    page = chat.page
    await chat.open()
    await chat.say("cobre 150 do João")
    [card] = await chat.wait_cards(1)
    second = await chat.context.new_page()
    await second.goto(chat.url + f"?thread={card.thread_id}")
    await expect(second.locator("#conn")).to_have_text("Online")
    await expect(second.locator("#who")).to_have_text(f"Signed in as {chat.user}")
    await expect(second.locator(f"#card-{card.id}")).to_have_attribute("data-status", "pending")
    await second.get_by_role("button", name="Sign out").click()
    await page.reload()
    await expect(page.get_by_role("region", name="Sign in")).to_be_visible()
    await second.close()


async def test_a_new_tab_opens_the_conversation_with_a_card_waiting(chat: Chat) -> None:
    """The newcomer probe: the chat's address opened again in a new tab showed the empty
    "Ask for something" screen while a card waited (only the list's badge said so). A
    page opened with no conversation opens the most recent one with a card waiting;
    "New chat" stays new."""
    await chat.open()
    await chat.say("cobre 150 do João")
    [card] = await chat.wait_cards(1)
    await chat.page.get_by_role("button", name="New chat").click()
    await chat.say("saldo")  # a newer conversation, with nothing waiting
    await expect(chat.page.locator(".msg.assistant").last).to_contain_text("5.000,00")
    second = await chat.context.new_page()
    await second.goto(chat.url)
    await expect(second.locator(f"#card-{card.id}")).to_have_attribute("data-status", "pending")
    assert f"thread={card.thread_id}" in second.url
    # "New chat" there is not undone by the next list (a threads_changed re-read).
    await second.get_by_role("button", name="New chat").click()
    await chat.say("saldo")  # from the first tab: the lists are read again
    await expect(chat.page.locator(".msg.assistant")).to_have_count(2)
    await second.wait_for_timeout(500)
    await expect(second.locator("article.card")).to_have_count(0)
    await second.close()


async def test_a_link_signs_in_a_tab_whose_session_has_expired(chat: Chat) -> None:
    """An expired session is no session: the link's user signs in (it was refused as a
    switch, then the old token failed too and the page asked for a token)."""
    page = chat.page
    old = chat.h.tokens.issue(chat.user, chat.h.tenant, ttl=4)
    await page.goto(chat.url + f"#token={old}")
    await expect(page.locator("#who")).to_have_text(f"Signed in as {chat.user}")
    await page.goto("about:blank")  # (the tab keeps its session storage)
    await page.wait_for_timeout(4200)  # the stored token expires meanwhile
    other = chat.user + "-next"
    await page.goto(chat.url + f"#token={chat.h.token(other)}")
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(page.locator("#who")).to_have_text(f"Signed in as {other}")
    await expect(page.locator("#composer-error")).to_have_text("")


async def test_a_forged_link_of_the_same_user_does_not_sign_the_tab_out(chat: Chat) -> None:
    """The page reads a link's claims unverified: a token naming this tab's own user with
    a made-up signature was taken, refused by the gateway (4401), and the tab was signed
    out, ready for the next link (a one-click forced sign-out)."""
    page = chat.page
    await chat.open()
    real = chat.h.token(chat.user)
    head, claims, _ = real.split(".")
    forged = f"{head}.{claims}.bm90LWEtc2lnbmF0dXJl"
    await page.goto("about:blank")
    await page.goto(chat.url + f"#token={forged}")
    await expect(page.locator("#who")).to_have_text(f"Signed in as {chat.user}")
    await expect(page.locator("#conn")).to_have_text("Online")
    await expect(page.get_by_role("region", name="Sign in")).to_be_hidden()
    # The forged token's one refusal is expected (the page's first request with it).
    unexpected = [e for e in chat.errors if "401 (Unauthorized)" not in e]
    assert unexpected == [], unexpected
    chat.errors.clear()


async def test_back_returns_to_the_conversation_opened_before(chat: Chat) -> None:
    """A first-hour probe: choosing a conversation in the list replaced the address, so
    the browser's Back left the app (to a blank page on a phone) instead of going back
    to the conversation before."""
    await chat.open()
    page = chat.page
    await chat.say("saldo")
    await expect(page.locator(".msg.assistant")).to_have_count(1)
    first = new_url_thread(page.url)
    await page.locator("#new-chat").click()
    await chat.say("saldo")
    await expect(page.locator(".msg.assistant")).to_have_count(1)
    second = new_url_thread(page.url)
    assert first and second and first != second
    links = page.locator("#thread-list .thread-link")
    await expect(links).to_have_count(2)
    await page.locator(f'#thread-list .thread-link[data-thread-id="{first}"]').click()
    await expect(page).to_have_url(re.compile(f"thread={first}"))
    await page.go_back()
    await expect(page).to_have_url(re.compile(f"thread={second}"))
    await expect(page.locator('#thread-list [aria-current="page"]')).to_have_attribute(
        "data-thread-id", second
    )
    await page.go_forward()
    await expect(page).to_have_url(re.compile(f"thread={first}"))


def new_url_thread(url: str) -> str | None:
    found = re.search(r"[?&]thread=([0-9a-f-]{36})", url)
    return found.group(1) if found else None
