"""A model reply whose calls share an id, reuse an earlier reply's id or give none usable
(runtime/replies.py). A hostile probe: the second call of two with one id overwrote the
first's card in the run's waiting set (a card nobody's result would ever report), and
the thread's next model call was refused by the API for good (ids must be unique). Real
``anthropic`` client against the fake Messages API, which refuses a request whose
conversation repeats a tool_use id as the API does; real Postgres and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from signoff.runtime.cards import Decision
from signoff.runtime.replies import RENAMED
from signoff.testing import FakeMessagesServer, ScriptedReply, text, tool_use
from tests.harness import harness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def fake() -> Iterator[FakeMessagesServer]:
    with FakeMessagesServer() as server:
        yield server


def calls(request: dict[str, Any], index: int) -> list[dict[str, Any]]:
    return [b for b in request["messages"][index]["content"] if b.get("type") == "tool_use"]


def results(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    last = request["messages"][-1]["content"]
    return {b["tool_use_id"]: b for b in last if b.get("type") == "tool_result"}


async def test_calls_sharing_an_id_run_once_and_the_thread_goes_on(
    database_url: str, fake: FakeMessagesServer
) -> None:
    first = tool_use("create_pix_charge", {"customer": "João", "amount": "150"}, id="toolu_same")
    fake.add(
        ScriptedReply([text("Vou cobrar."), first], "tool_use"),
        ScriptedReply([text("Feito.")], "end_turn"),
        # The next turn: an earlier reply's id again, one id twice, and no usable id.
        ScriptedReply(
            [
                tool_use("create_pix_charge", {"customer": "Maria", "amount": "20"}, "toolu_same"),
                tool_use("create_pix_charge", {"customer": "Maria", "amount": "30"}, "toolu_b"),
                tool_use("create_pix_charge", {"customer": "Maria", "amount": "40"}, "toolu_b"),
                tool_use("create_pix_charge", {"customer": "Maria", "amount": "50"}, "bad id!"),
                tool_use("create_pix_charge", {"customer": "Maria", "amount": "60"}, RENAMED + "x"),
            ],
            "tool_use",
        ),
        ScriptedReply([text("Uma cobrança feita; as outras não.")], "end_turn"),
    )
    async with harness(database_url, fake=fake) as h:
        thread = await h.thread("alice")
        await h.say(thread, "cobre 150 do João", "alice")
        (card,) = await h.store.pending_cards(thread)
        await h.decide(card, Decision.APPROVE)
        await h.settle()
        assert len(fake.requests) == 2

        run = await h.say(thread, "cobre a Maria", "alice")
        assert run is not None and run.status == "waiting"
        (only,) = await h.store.pending_cards(thread)  # the first toolu_b call alone
        assert "R$ 30,00" in only.summary, only.summary
        await h.decide(only, Decision.APPROVE)
        await h.settle()

        # The API was called again (it refuses a conversation repeating an id) and the
        # run ended; two charges in all, the renamed calls told they were not run.
        assert len(fake.requests) == 4
        final = await h.store.get_run(run.id)
        assert final.status == "done", final
        assert await h.charges() == 2
        sent = calls(fake.requests[3], -2)
        ids = [c["id"] for c in sent]
        assert len(set(ids)) == 5 and ids[1] == "toolu_b"
        renamed = [i for i in ids if i.startswith(RENAMED)]
        assert len(renamed) == 4 and RENAMED + "x" not in ids
        told = results(fake.requests[3])
        assert set(told) == set(ids)
        for use_id in renamed:
            assert told[use_id]["is_error"] is True
            assert "Not run" in told[use_id]["content"]
        assert "executed" in told["toolu_b"]["content"]


async def test_a_recovered_step_does_not_run_the_renamed_calls(
    database_url: str, fake: FakeMessagesServer
) -> None:
    """The worker dies after storing the reply, before its calls ran: the run's next
    holder reads the stored reply (ids already made distinct) and proposes only the
    call that kept its id."""
    fake.add(
        ScriptedReply(
            [
                tool_use("create_pix_charge", {"customer": "Maria", "amount": "30"}, "toolu_c"),
                tool_use("create_pix_charge", {"customer": "Maria", "amount": "40"}, "toolu_c"),
            ],
            "tool_use",
        ),
    )
    async with harness(database_url, fake=fake) as h:
        thread = await h.thread("alice")
        await h.say(thread, "cobre a Maria", "alice")
        (card,) = await h.store.pending_cards(thread)
        run = await h.store.get_run(card.run_id)
        # As a worker that died after the reply was stored: running, the calls unrun.
        await h.store.set_run(run.id, "running", {}, holder=h.worker.worker_id)
        recovered = await h.worker.agent.continue_run(run.id)
        assert recovered is not None and recovered.status == "waiting"
        assert [c.id for c in await h.store.pending_cards(thread)] == [card.id]
        assert list(recovered.state["waiting"]) == ["toolu_c"]
        (renamed,) = [u for u in recovered.state["results"] if u.startswith(RENAMED)]
        assert "Not run" in recovered.state["results"][renamed]["content"]
