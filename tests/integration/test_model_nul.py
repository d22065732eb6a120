"""NUL characters in what a model or a tool returns (Postgres text cannot hold U+0000).
A hostile probe: a model reply with a NUL in its text or a call's input failed the turn
with the driver's own words in the chat, and nothing of the reply was kept. The
character is dropped from a reply's text, a call's input and a read tool's result;
the rest is kept and goes on. Real ``anthropic`` client and fake Messages API, real
Postgres and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from signoff.runtime.cards import Decision
from signoff.runtime.models.base import ModelReply
from signoff.testing import FakeMessagesServer, ScriptedReply, text, tool_use
from tests.harness import harness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def fake() -> Iterator[FakeMessagesServer]:
    with FakeMessagesServer() as server:
        yield server


async def test_nul_in_a_reply_and_its_call_is_dropped_and_the_turn_goes_on(
    database_url: str, fake: FakeMessagesServer
) -> None:
    charge = tool_use("create_pix_charge", {"customer": "Jo\u0000ão", "amount": "15\u00000"})
    fake.add(
        ScriptedReply([text("Vou\u0000 cobrar."), charge], "tool_use"),
        ScriptedReply([text("Feito\u0000.")], "end_turn"),
    )
    async with harness(database_url, fake=fake) as h:
        thread = await h.thread("alice")
        run = await h.say(thread, "cobre 150 do João", "alice")
        assert run is not None and run.status == "waiting", run
        (card,) = await h.store.pending_cards(thread)
        assert "\x00" not in card.summary and "R$ 150,00" in card.summary
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        final = await h.store.get_run(run.id)
        assert final.status == "done", final
        assert await h.charges() == 1
        said = [
            b.get("text")
            for e in await h.store.entries_after(thread, 0)
            if e.kind == "assistant"
            for b in e.body["content"]
            if b.get("type") == "text"
        ]
        assert said == ["Vou cobrar.", "Feito."]


def test_a_reply_is_scrubbed_recursively() -> None:
    from signoff.runtime.replies import checked

    reply = ModelReply(
        content=[
            {"type": "text", "text": "a\x00b"},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "x",
                "input": {"k\x00": ["v\x00", {"n": 1, "s": "\x00"}], "t": True, "z": None},
            },
        ],
        stop_reason="tool_use",
    )
    content, refused = checked(reply.content, set())
    assert refused == {}
    assert content[0]["text"] == "ab"
    assert content[1]["input"] == {"k": ["v", {"n": 1, "s": ""}], "t": True, "z": None}


async def test_tools_answers_that_json_or_postgres_cannot_hold_are_kept(
    database_url: str, fake: FakeMessagesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read tool's and a write tool's answer with a NUL, half a surrogate pair, a date
    and a decimal: the write's outcome was lost after the provider had acted (its record
    failed; the card stayed executing until flagged), the read failed the turn."""
    from signoff.demo import tools as demo_tools

    odd = {
        "note": "ok\x00 \ud800!",
        "at": datetime(2026, 12, 6, 12, 0, tzinfo=UTC),
        "fee": Decimal("1.50"),
    }
    charge = demo_tools.CreatePixCharge.execute

    async def balance(self: object, args: object, op: str, ctx: object) -> object:
        return {"balance": "R$ 1\x00", **odd}

    async def charged(self: object, args: object, op: str, ctx: object) -> object:
        return {**(await charge(self, args, op, ctx)), **odd}  # type: ignore[arg-type]

    monkeypatch.setattr(demo_tools.GetBalance, "execute", balance)
    monkeypatch.setattr(demo_tools.CreatePixCharge, "execute", charged)
    read = tool_use("get_balance", {})
    write = tool_use("create_pix_charge", {"customer": "João", "amount": "150"})
    fake.add(
        ScriptedReply([read], "tool_use"),
        ScriptedReply([write], "tool_use"),
        ScriptedReply([text("Feito.")], "end_turn"),
    )
    async with harness(database_url, fake=fake) as h:
        thread = await h.thread("alice")
        run = await h.say(thread, "saldo e cobre 150 do João", "alice")
        assert run is not None and run.status == "waiting", run
        (card,) = await h.store.pending_cards(thread)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        done = await h.store.get_card(card.id)
        assert done.status == "executed", done
        assert done.result is not None
        assert done.result["note"] == "ok \ufffd!"
        assert done.result["at"] == "2026-12-06T12:00:00Z" and done.result["fee"] == "1.50"
        assert (await h.store.get_run(run.id)).status == "done"
        told = str(fake.requests[1]["messages"][-1]["content"])
        assert "R$ 1" in told and "2026-12-06" in told


class _Opaque:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _cyclic() -> dict[str, object]:
    loop: dict[str, object] = {"id": "ch_1"}
    loop["self"] = loop
    return loop


@pytest.mark.parametrize(
    "answer",
    [{None: 1, "id": "ch_1"}, {(1, 2): "x"}, _cyclic(), _Opaque()],
    ids=["none-key", "tuple-key", "cycle", "raising-repr"],
)
async def test_a_write_whose_answer_cannot_be_walked_is_executed_not_failed(
    database_url: str,
    fake: FakeMessagesServer,
    monkeypatch: pytest.MonkeyPatch,
    answer: object,
) -> None:
    """A provider that acted and answered with a value msgspec cannot walk (a key that is
    None or a tuple, a cycle, a repr that raises): its card was recorded ``failed`` and
    the model told so (it might charge again). Now it is ``executed`` with what can be
    shown of the answer, and a read tool's such answer does not fail the turn."""
    from signoff.demo import tools as demo_tools

    charge = demo_tools.CreatePixCharge.execute
    charged_ids: list[str] = []

    async def charged(self: object, args: object, op: str, ctx: object) -> object:
        charged_ids.append(op)
        await charge(self, args, op, ctx)  # type: ignore[arg-type]
        return answer

    async def balance(self: object, args: object, op: str, ctx: object) -> object:
        return answer

    monkeypatch.setattr(demo_tools.CreatePixCharge, "execute", charged)
    monkeypatch.setattr(demo_tools.GetBalance, "execute", balance)
    read = tool_use("get_balance", {})
    write = tool_use("create_pix_charge", {"customer": "João", "amount": "150"})
    fake.add(
        ScriptedReply([read], "tool_use"),
        ScriptedReply([write], "tool_use"),
        ScriptedReply([text("Feito.")], "end_turn"),
    )
    async with harness(database_url, fake=fake) as h:
        thread = await h.thread("alice")
        run = await h.say(thread, "saldo e cobre 150 do João", "alice")
        assert run is not None and run.status == "waiting", run
        (card,) = await h.store.pending_cards(thread)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        done = await h.store.get_card(card.id)
        assert done.status == "executed", done
        assert done.result is not None and done.result != {}
        assert len(charged_ids) == 1
        assert (await h.store.get_run(run.id)).status == "done"
        told = str(fake.requests[2]["messages"][-1]["content"])
        assert '"status": "executed"' in told or "'status': 'executed'" in told, told
