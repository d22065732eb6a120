"""Model-supplied text on a card, in Chromium (issue 10, item 8).

The model (Claude's SDK against the scripted fake Messages API) proposes a charge
of R$ 9.000,00 whose description tries to draw a bold line "Valor: R$ 1,00" with a
newline and a bidi override. The card shows one summary line with the real amount
and the description, cleaned, in its own labelled row. The screenshot goes to
``tests/artifacts/screenshots/``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest

from signoff.testing import FakeMessagesServer, ScriptedReply, text, tool_use
from tests.browser.conftest import Chat, expect, needs_browser

pytestmark = [pytest.mark.anyio, needs_browser]

FORGED = "pedido 42\n\n**Valor: R$ 1,00**\u202e 00,1 $R\u202c\u2066 ok\u2069"
CLEAN = "pedido 42 **Valor: R$ 1,00** 00,1 $R ok"


@pytest.fixture
def fake() -> Iterator[FakeMessagesServer]:
    with FakeMessagesServer() as server:
        yield server


async def test_forged_description_renders_as_one_labelled_line(
    fake: FakeMessagesServer, chat_factory: Callable[..., Awaitable[Chat]]
) -> None:
    charge = tool_use(
        "create_pix_charge", {"customer": "João", "amount": "9000", "description": FORGED}
    )
    fake.add(ScriptedReply([text("Vou preparar a cobrança."), charge], "tool_use"))
    chat = await chat_factory(fake=fake)
    await chat.open()
    await chat.say("cobre 9000 do João")
    [card] = await chat.wait_cards(1)
    ui = chat.card(card.id)

    summary = ui.locator(".card-summary")
    await expect(summary).to_have_text(card.summary)
    shown = await summary.inner_text()  # as rendered: a newline kept by CSS would show here
    assert "\n" not in shown and "\u202e" not in shown
    assert shown.count("Valor") == 1 and shown.endswith("Valor: R$ 9.000,00")
    await expect(ui.locator(".impact")).to_contain_text("R$9,000.00")

    # The description in its own labelled row: one label, one value, one line.
    await expect(ui.locator("dt.field-label")).to_have_text(["Descrição"])
    value = ui.locator("dd.field-value")
    await expect(value).to_have_text([CLEAN])
    assert "\n" not in await value.inner_text()
    label_box = await ui.locator("dt.field-label").bounding_box()
    value_box = await value.bounding_box()
    assert label_box is not None and value_box is not None
    assert abs(label_box["y"] - value_box["y"]) < 2  # side by side: the label is its row's

    # Read line by line as the person does: exactly one line states the amount, and no
    # line starts with "Valor" (the forged bold line is gone).
    lines = [line.strip() for line in (await ui.inner_text()).split("\n") if line.strip()]
    assert [line for line in lines if "Valor" in line] == [shown, CLEAN]
    assert lines[lines.index(CLEAN) - 1] == "Descrição"
    assert [line for line in lines if "R$ 9.000,00" in line and "Valor" in line] == [shown]
    assert not [line for line in lines if line.lstrip("*").startswith("Valor")], lines
    await chat.shot("forged-line")


async def test_a_newline_in_a_stored_summary_draws_no_line(chat: Chat) -> None:
    """The page's own guard, for cards frozen before the runtime cleaned summaries: the
    summary is one paragraph (no pre-wrap), so a newline in it cannot start a line."""
    await chat.open()
    await chat.say("cobre 9000 do João")
    [card] = await chat.wait_cards(1)
    forged = card.summary + "\n**Valor: R$ 1,00**"
    await chat.h.provider.pool.execute(
        "UPDATE cards SET summary = $2 WHERE id = $1::uuid", card.id, forged
    )
    # Supersede through the page so that a card_update with the stored summary is sent.
    await chat.say("sim")
    ui = chat.card(card.id)
    await expect(ui).to_have_attribute("data-status", "superseded")
    summary = ui.locator(".card-summary")
    await expect(summary).to_have_text(forged.replace("\n", " "))
    shown = await summary.inner_text()
    assert "\n" not in shown and shown.count("Valor") == 2
    await chat.shot("stored-newline")


async def test_a_model_that_does_not_answer_is_said_beside_working(
    chat_factory: Callable[..., Awaitable[Chat]],
) -> None:
    """The newcomer probe: with the model's API unreachable the page said "working…" for
    ever. The worker's `model_unavailable` notice is shown beside it, in the page's
    language, until the model answers."""
    failures = {"left": 4}  # tried again after 0.5, 1, 2 and 4 s

    def responder(body: dict[str, object]) -> ScriptedReply:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("overloaded")  # 500 api_error
        return ScriptedReply([text("Olá! Em que posso ajudar?")], "end_turn")

    with FakeMessagesServer(responder=responder) as server:
        chat = await chat_factory(fake=server)
        await chat.open()
        await chat.say("oi")
        thinking = chat.page.locator("#thinking")
        await expect(thinking).to_contain_text("cannot be reached right now; still trying")
        await expect(chat.page.locator(".msg.assistant").last).to_contain_text("Em que posso")
        await expect(thinking).to_be_hidden()
