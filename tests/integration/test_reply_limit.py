"""At most ``MAX_USES_PER_REPLY`` calls of one model reply run (a hostile probe: one
message of 8,000 characters made the offline model ask for 300 charges, 300 cards in
one run); the rest are told to the model as not run."""

from __future__ import annotations

import pytest

from signoff.runtime.cards import Decision
from signoff.runtime.outcomes import MAX_USES_PER_REPLY
from tests.harness import harness
from tests.integration.test_decisions import Scripted, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def test_calls_past_the_limit_of_one_reply_are_not_run(database_url: str) -> None:
    asked = MAX_USES_PER_REPLY + 5
    model = Scripted(*(pix(str(i + 1)) for i in range(asked)))
    async with harness(database_url, model=model) as h:
        thread = await h.thread("alice")
        await h.say(thread, "cobre muitos", "alice")
        pending = await h.store.pending_cards(thread)
        assert len(pending) == MAX_USES_PER_REPLY
        for card in pending:
            await h.decide(card, Decision.REJECT)
        await h.settle()
        told = [
            b
            for e in await h.store.entries_after(thread, 0)
            if e.kind == "tool_results"
            for b in e.body["content"]
        ]
        assert len(told) == asked
        left_out = [b for b in told if "Not run: at most" in str(b["content"])]
        assert len(left_out) == 5 and all(b.get("is_error") for b in left_out)
