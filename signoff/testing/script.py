"""The harness's scripted model: replies planned per user message, and tool results.

The fake Messages API serves its own script first (``FakeMessagesServer.add``, in
order); when that is empty it asks a :class:`Plan`. A plan answers the turn of a user
message with the replies planned for that message, one per model call, then a short text
(``Done.`` after a tool result, ``OK.`` otherwise). Keying by message lets several
threads run at once without their replies crossing.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import msgspec

from signoff.runtime.records import Entry
from signoff.testing.fake_messages import ScriptedReply, reply, text

__all__ = ["ANSWER_TEXT", "CLOSING_TEXT", "Plan", "ToolResult", "find_result"]

CLOSING_TEXT = "Done."  # what the scripted model says after a tool result
ANSWER_TEXT = "OK."  # ... and to a message nothing was planned for


class ToolResult(msgspec.Struct, frozen=True):
    """A ``tool_result`` the model was sent: the outcome of one of its tool calls."""

    tool_use_id: str
    content: str
    is_error: bool = False

    def json(self) -> Any:
        """``content`` parsed as JSON (an executed card's result, a read tool's answer)."""
        return json.loads(self.content)


class Plan:
    """Replies planned per user message; thread-safe (the fake server calls
    :meth:`respond` on its own thread)."""

    def __init__(self) -> None:
        self._planned: dict[str, list[ScriptedReply]] = {}
        self._lock = threading.Lock()
        self._count = 0

    def add(self, message: str, *replies: ScriptedReply) -> None:
        with self._lock:
            self._planned.setdefault(message, []).extend(replies)

    def message(self, what: str) -> str:
        """A user message text no other turn of this plan uses."""
        with self._lock:
            self._count += 1
            return f"[signoff.testing #{self._count}] {what}"

    def respond(self, body: dict[str, Any]) -> ScriptedReply:
        """The reply to one Messages API request."""
        messages: list[dict[str, Any]] = body["messages"]
        turn = _turn_text(messages)
        with self._lock:
            planned = self._planned.get(turn) if turn is not None else None
            if planned:
                return planned.pop(0)
        last = messages[-1]["content"]
        answered = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        return reply(text(CLOSING_TEXT if answered else ANSWER_TEXT))


def find_result(conversation: list[Entry], tool_use_id: str) -> ToolResult | None:
    """The tool result for ``tool_use_id`` in a thread's stored conversation."""
    for entry in reversed(conversation):
        for block in entry.body.get("content", []):
            if block.get("type") == "tool_result" and block.get("tool_use_id") == tool_use_id:
                return ToolResult(
                    tool_use_id=tool_use_id,
                    content=_text_of(block.get("content")),
                    is_error=bool(block.get("is_error", False)),
                )
    return None


def _turn_text(messages: list[dict[str, Any]]) -> str | None:
    """The user message the current turn answers: the last user text in the conversation."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content or [] if b.get("type") == "text"]
        if texts:
            return str(texts[-1])
    return None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""
