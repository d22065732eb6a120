"""Browser tests: the chat page in Debian's Chromium, driven by Playwright (async API).

No browser is downloaded: Playwright launches the system Chromium
(``apt-get install -y chromium`` gives ``/usr/bin/chromium``; override with
``SIGNOFF_CHROMIUM``). The whole directory is skipped, with the reason, only
when that binary or the ``playwright`` package is missing — unless
``SIGNOFF_REQUIRE_BROWSER=1`` (CI sets it in ``.ci/run``): then every browser test
fails with the reason instead, so a CI run without a browser cannot pass.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from signoff.demo.offline_model import OfflineDemoModel
from signoff.runtime.cards import Card
from signoff.testing import FakeMessagesServer
from tests.harness import Harness, harness

CHROMIUM = os.environ.get("SIGNOFF_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[1] / "artifacts" / "screenshots"
# axe-core (MPL-2.0, its licence header kept in the file), vendored from the npm registry
# so that the accessibility check needs no network: tests/browser/axe.min.js.
AXE = Path(__file__).resolve().parent / "axe.min.js"
TIMEOUT_MS = 10_000

try:
    from playwright.async_api import Browser, BrowserContext, Page, async_playwright
    from playwright.async_api import expect as _expect

    HAVE_PLAYWRIGHT = True
except ImportError:  # pragma: no cover - depends on the machine
    HAVE_PLAYWRIGHT = False

HAVE_CHROMIUM = os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not HAVE_PLAYWRIGHT:
        return "playwright is not installed (.venv/bin/pip install playwright==1.65.2)"
    if not HAVE_CHROMIUM:
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    return None


REQUIRE_BROWSER = os.environ.get("SIGNOFF_REQUIRE_BROWSER") == "1"


@pytest.fixture(scope="session")  # before the session's `browser` fixture tries to launch it
def _browser_required() -> None:
    pytest.fail(f"SIGNOFF_REQUIRE_BROWSER=1 and {missing()}", pytrace=False)


# Every browser test module starts with ``pytestmark = [pytest.mark.anyio, needs_browser]``.
needs_browser: pytest.MarkDecorator
if missing() is not None and REQUIRE_BROWSER:
    needs_browser = pytest.mark.usefixtures("_browser_required")
else:
    needs_browser = pytest.mark.skipif(
        missing() is not None, reason=f"browser tests skipped: {missing()}"
    )


if HAVE_PLAYWRIGHT:
    _expect.set_options(timeout=TIMEOUT_MS)
    expect: Any = _expect
else:  # pragma: no cover
    expect = None


def unique_user(prefix: str = "alice") -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@dataclass
class Chat:
    """One harness (worker + gateway on a free port) and one browser page on its chat."""

    h: Harness
    browser: Browser
    context: BrowserContext
    page: Page
    user: str
    name: str
    errors: list[str] = field(default_factory=list)
    sent_frames: list[dict[str, Any]] = field(default_factory=list)
    message_label: str = "Message"  # the message box's label in the page's language

    @property
    def url(self) -> str:
        return self.h.base_url + "/"

    async def open(self, *, token: bool = True, width: int = 1000, height: int = 800) -> None:
        await self.page.set_viewport_size({"width": width, "height": height})
        target = self.url + (f"#token={self.h.token(self.user)}" if token else "")
        await self.page.goto(target)
        if token:
            await expect(self.page.locator("#conn")).to_have_text("Online")

    async def say(self, text: str, *, here: bool = True) -> None:
        """Type and send ``text``. Under waiting cards the composer asks first (it would
        replace them): ``here`` answers "Send here"; False leaves the question open."""
        box = self.page.get_by_label(self.message_label, exact=True)
        await expect(self.page.locator("#send")).to_be_enabled()
        await box.fill(text)
        await box.press("Enter")
        guard = self.page.locator("#replace-guard")
        if here and await guard.is_visible():
            await guard.locator("#guard-send").click()

    def cards(self) -> Any:
        return self.page.locator("article.card")

    def card(self, card_id: str) -> Any:
        return self.page.locator(f'article.card[data-card-id="{card_id}"]')

    async def db_cards(self, status: str | None = None) -> list[Card]:
        """This test's cards, newest first (users are unique per test)."""
        return await self.h.store.list_cards(status=status, owner=self.user)

    async def wait_cards(self, n: int, status: str = "pending") -> list[Card]:
        await expect(self.page.locator(f'article.card[data-status="{status}"]')).to_have_count(n)
        cards = await self.db_cards(status)
        assert len(cards) == n, cards
        return sorted(cards, key=lambda c: c.created_at)

    async def shot(self, state: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{self.name}-{state}.png"
        await self.page.screenshot(path=str(path), full_page=True)
        return path

    async def axe(self) -> list[dict[str, Any]]:
        """axe-core's violations of impact serious or critical on the page as it is now
        (injected through the DevTools protocol, which the page's CSP does not govern)."""
        if not await self.page.evaluate("typeof window.axe === 'object'"):
            await self.page.evaluate(AXE.read_text())
        found: list[dict[str, Any]] = await self.page.evaluate(
            """async () => {
                const r = await axe.run(document, {resultTypes: ['violations']});
                return r.violations
                    .filter(v => v.impact === 'serious' || v.impact === 'critical')
                    .map(v => ({id: v.id, impact: v.impact, help: v.help,
                                nodes: v.nodes.map(n => n.target.join(' ') + ': ' + n.failureSummary)}));
            }"""
        )
        return found

    def resolve_frames(self) -> list[dict[str, Any]]:
        return [f for f in self.sent_frames if f.get("type") == "resolve"]


def _test_name(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name).removeprefix("test_")


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One Chromium for the session; every test gets its own context (fresh storage)."""
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


def _watch(page: Page, chat_errors: list[str], frames: list[dict[str, Any]]) -> None:
    import json

    page.on("pageerror", lambda exc: chat_errors.append(f"pageerror: {exc}"))
    page.on(
        "console",
        lambda msg: (
            chat_errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None
        ),
    )

    def on_ws(ws: Any) -> None:
        def sent(payload: str | bytes) -> None:
            try:
                frames.append(json.loads(payload))
            except (ValueError, TypeError):
                frames.append({"raw": payload})

        ws.on("framesent", sent)

    page.on("websocket", on_ws)


@pytest.fixture
async def chat_factory(
    database_url: str, browser: Browser, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[..., Awaitable[Chat]]]:
    """Make a Chat; everything is torn down at the end of the test."""
    stack: list[Chat] = []
    contexts: list[BrowserContext] = []
    hs: list[Any] = []

    async def make(
        user: str | None = None, fake: FakeMessagesServer | None = None, locale: str = "en-US"
    ) -> Chat:
        """With ``fake``, the model is Claude's SDK against that scripted server;
        without, the offline demo model. ``locale``: the browser's language
        (navigator.language), which picks the page's."""
        model = None if fake is not None else OfflineDemoModel()
        cm = harness(database_url, model=model, fake=fake, gateway=True)
        h = await cm.__aenter__()
        hs.append(cm)
        context = await browser.new_context(locale=locale)
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        page = await context.new_page()
        chat = Chat(
            h=h,
            browser=browser,
            context=context,
            page=page,
            user=user or unique_user(),
            name=_test_name(request),
        )
        _watch(page, chat.errors, chat.sent_frames)
        stack.append(chat)
        return chat

    try:
        yield make
    finally:
        for context in contexts:
            await context.close()
        for cm in reversed(hs):
            await cm.__aexit__(None, None, None)
    for chat in stack:
        assert not chat.errors, f"errors in the page: {chat.errors}"


@pytest.fixture
async def chat(chat_factory: Callable[..., Awaitable[Chat]]) -> Chat:
    return await chat_factory()
