"""The chat page shows a workflow run's pending human gate as a form generated from the
JSON schema on its interrupt, and resumes the run with it (gateway/static/gate-form.js)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import pytest

from signoff import App, Registry, Workflow, WorkflowContext, WorkflowRun, await_human
from signoff.testing import Harness
from tests.browser.conftest import expect, needs_browser, unique_user

if TYPE_CHECKING:
    from playwright.async_api import Browser

pytestmark = [pytest.mark.anyio, needs_browser, pytest.mark.timeout(90)]


class Payout(msgspec.Struct):
    approved: bool
    amount: Annotated[int, msgspec.Meta(ge=1, title="Amount (cents)")]
    code: Annotated[str, msgspec.Meta(pattern="^[A-Z]{3}$", description="Three capitals.")]
    rail: Literal["pix", "ted"] = "pix"
    note: str = ""


async def prepare(ctx: WorkflowContext) -> dict[str, Any]:
    return {"prepared": True}


async def pay(ctx: WorkflowContext) -> dict[str, Any]:
    return {"paid": ctx.state["amount"] if ctx.state["approved"] else 0}


def build() -> App:
    flow = Workflow(
        "payout", steps=[prepare, await_human("Approve the payout", schema=Payout), pay]
    )
    return App(name="gate-form", tools=Registry([]), workflows=[flow])


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    async with Harness(build, database_url=database_url, offline=True, gateway=True) as harness:
        yield harness


async def wait_status(h: Harness, run_id: str, user: str, status: str) -> WorkflowRun:
    for _ in range(300):
        run, _ = await h.workflows.get(run_id, tenant=h.tenant, user=user)
        if run.status == status:
            return run
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never {status}")


async def test_a_pending_gate_is_a_form_that_resumes_the_run(h: Harness, browser: Browser) -> None:
    user = unique_user()
    run = await h.workflows.start("payout", tenant=h.tenant, owner=user)
    await wait_status(h, run.id, user, "awaiting_human")
    context = await browser.new_context()
    errors: list[str] = []
    try:
        page = await context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(f"{h.base_url}/#token={h.token(user)}")
        form = page.locator(f'form.gate[data-run-id="{run.id}"]')
        await expect(form).to_be_visible()
        await expect(form.get_by_role("heading")).to_have_text("Approve the payout")
        # one control per declared field, typed from the schema
        # A required yes/no is asked (a checkbox left unticked sent a rejection for a
        # person who only pressed Submit: the newcomer probe).
        yes, no = form.get_by_label("Yes", exact=True), form.get_by_label("No", exact=True)
        await expect(yes).to_have_attribute("type", "radio")
        await expect(yes).not_to_be_checked()
        await expect(no).not_to_be_checked()
        amount = form.get_by_label("Amount (cents) *")
        await expect(amount).to_have_attribute("type", "number")
        await expect(amount).to_have_attribute("min", "1")
        await expect(form.locator("select[name=rail] option")).to_have_count(2)
        await expect(form.get_by_text("Three capitals.")).to_be_visible()
        await amount.fill("1500")
        await form.get_by_label("code *").fill("ABC")
        await form.get_by_role("button", name="Submit").click()  # no answer to "approved"
        still, _ = await h.workflows.get(run.id, tenant=h.tenant, user=user)
        assert still.status == "awaiting_human"  # the browser asked for it first
        await yes.check()
        await form.get_by_label("code *").fill("abc")  # the server's schema refuses it
        await form.get_by_role("button", name="Submit").click()
        await expect(form.get_by_role("alert")).to_contain_text("invalid payload")
        still, _ = await h.workflows.get(run.id, tenant=h.tenant, user=user)
        assert still.status == "awaiting_human"
        await form.get_by_label("code *").fill("ABC")
        await form.locator("select[name=rail]").select_option("ted")
        await form.get_by_role("button", name="Submit").click()
        await expect(form).to_have_count(0)
        await expect(page.locator(".gate-sent")).to_have_text("Sent: payout goes on.")
        done = await wait_status(h, run.id, user, "completed")
        assert {k: done.state[k] for k in ("approved", "amount", "code", "rail", "paid")} == {
            "approved": True,
            "amount": 1500,
            "code": "ABC",
            "rail": "ted",
            "paid": 1500,
        }
        _, interrupts = await h.workflows.get(run.id, tenant=h.tenant, user=user)
        assert interrupts[-1].resolved_by == user
    finally:
        await context.close()
    assert errors == []


async def test_another_persons_gate_is_not_shown(h: Harness, browser: Browser) -> None:
    owner, other = unique_user("owner"), unique_user("other")
    run = await h.workflows.start("payout", tenant=h.tenant, owner=owner)
    await wait_status(h, run.id, owner, "awaiting_human")
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await page.goto(f"{h.base_url}/#token={h.token(other)}")
        await expect(page.locator("#conn")).to_have_text("Online")
        await asyncio.sleep(3.5)  # one poll of the gate list
        await expect(page.locator("form.gate")).to_have_count(0)
    finally:
        await context.close()


async def test_an_agent_steps_cards_are_decided_in_one_form(
    database_url: str, browser: Browser
) -> None:
    """An agent step's gate lists its pending cards: approve, reject or edit (and approve)
    each, one submit."""
    from tests import agent_wf_app

    user = unique_user()
    async with Harness(
        agent_wf_app.build, database_url=database_url, offline=True, gateway=True
    ) as h:
        run = await h.workflows.start("approvals", tenant=h.tenant, owner=user)
        await wait_status(h, run.id, user, "awaiting_human")
        context = await browser.new_context()
        try:
            page = await context.new_page()
            await page.goto(f"{h.base_url}/#token={h.token(user)}")
            form = page.locator(f'form.gate[data-run-id="{run.id}"]')
            await expect(form.locator("fieldset.gate-card")).to_have_count(3)
            for summary, choice in (
                ("Pay 10 to ana", "Approve"),
                ("Pay 20 to bruno", "Reject"),
                ("Pay 30 to carla", "Edit and approve"),
            ):
                card = form.locator("fieldset.gate-card", has_text=summary)
                await card.get_by_label(choice, exact=True).check()
            carla = form.locator("fieldset.gate-card", has_text="Pay 30 to carla")
            amount = carla.get_by_label("amount")
            await expect(amount).to_have_value("30")  # the card's current value
            await amount.fill("25")
            await form.get_by_role("button", name="Submit").click()
            await expect(form).to_have_count(0)
            done = await wait_status(h, run.id, user, "completed")
            assert done.state["agent"]["reply"] == "paid: ana=10, carla=25"
        finally:
            await context.close()


async def test_an_edit_the_tool_refuses_is_said_in_the_persons_language(
    database_url: str, browser: Browser
) -> None:
    """A review: the gate form showed a tool's English refusal on a Portuguese page (the
    chat's cards already picked ``detail.localized``)."""
    from tests import agent_wf_app

    user = unique_user()
    async with Harness(
        agent_wf_app.build, database_url=database_url, offline=True, gateway=True
    ) as h:
        run = await h.workflows.start("approvals", tenant=h.tenant, owner=user)
        parked = await wait_status(h, run.id, user, "awaiting_human")
        context = await browser.new_context(locale="pt-BR")
        try:
            page = await context.new_page()
            await page.goto(f"{h.base_url}/#token={h.token(user)}")
            form = page.locator(f'form.gate[data-run-id="{run.id}"]')
            for summary, choice in (
                ("Pay 10 to ana", "Aprovar"),
                ("Pay 20 to bruno", "Recusar"),
                ("Pay 30 to carla", "Editar e aprovar"),
            ):
                card = form.locator("fieldset.gate-card", has_text=summary)
                await card.get_by_label(choice, exact=True).check()
            carla = form.locator("fieldset.gate-card", has_text="Pay 30 to carla")
            await carla.get_by_label("amount").fill("5000")
            await form.get_by_role("button", name="Enviar").click()
            await expect(form.locator(".gate-error")).to_have_text("valor acima do limite de 1000")
            after = await wait_status(h, run.id, user, "awaiting_human")
            assert after.step == parked.step and after.state == parked.state  # nothing applied
        finally:
            await context.close()


async def test_a_workflows_thread_shows_its_cards_and_takes_no_message(
    database_url: str, browser: Browser
) -> None:
    """The agent step's thread is in the person's list: opened, its cards show (and may be
    decided) but the message box is off and says why (a message there is refused, 409)."""
    from signoff.runtime.workflows.agent_step import workflow_thread_id
    from tests import agent_wf_app

    user = unique_user()
    async with Harness(
        agent_wf_app.build, database_url=database_url, offline=True, gateway=True
    ) as h:
        run = await h.workflows.start("approvals", tenant=h.tenant, owner=user)
        await wait_status(h, run.id, user, "awaiting_human")
        context = await browser.new_context()
        try:
            page = await context.new_page()
            thread = workflow_thread_id(run.id)
            await page.goto(f"{h.base_url}/?thread={thread}#token={h.token(user)}")
            await expect(page.locator("article.card")).to_have_count(3)
            # The step's prompt is the workflow's, not the person's (a newcomer probe).
            prompt = page.locator("li.msg.user").first
            await expect(prompt.locator(".msg-who")).to_have_text("Workflow")
            await expect(page.locator("li.msg .msg-who", has_text="You")).to_have_count(0)
            await expect(page.locator("#text")).to_be_disabled()
            await expect(page.locator("#send")).to_be_disabled()
            await expect(page.locator("#composer")).to_contain_text("belongs to a workflow")
            await page.get_by_role("button", name="New chat").click()
            await expect(page.locator("#text")).to_be_enabled()
        finally:
            await context.close()


async def test_a_gate_form_speaks_the_persons_language(h: Harness, browser: Browser) -> None:
    """The newcomer probe: "Submit", "until …" and the form's messages stayed English on
    a Portuguese page."""
    user = unique_user()
    run = await h.workflows.start("payout", tenant=h.tenant, owner=user)
    await wait_status(h, run.id, user, "awaiting_human")
    context = await browser.new_context(locale="pt-BR")
    try:
        page = await context.new_page()
        await page.goto(f"{h.base_url}/#token={h.token(user)}")
        form = page.locator(f'form.gate[data-run-id="{run.id}"]')
        await expect(form.get_by_role("button", name="Enviar")).to_be_visible()
        await expect(form.get_by_label("Sim", exact=True)).to_have_attribute("type", "radio")
        await expect(form.get_by_label("Não", exact=True)).to_be_visible()
        await expect(
            page.get_by_role("region", name="Decisões de fluxos de trabalho")
        ).to_be_visible()
    finally:
        await context.close()
