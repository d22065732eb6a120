"""The model protocol the agent loop talks to.

Messages and content blocks use the Anthropic Messages API shapes as plain
dicts (``{"role": "user", "content": [...]}``), so a stored conversation can
be sent to any adapter unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec

Block = dict[str, Any]
Message = dict[str, Any]
ToolSpec = dict[str, Any]  # {"name", "description", "input_schema"}

TextSink = Callable[[str], Awaitable[None]]


class ModelReply(msgspec.Struct, frozen=True):
    """One assistant message: its content blocks and why it stopped."""

    content: list[Block]
    stop_reason: str

    def tool_uses(self) -> list[Block]:
        return [b for b in self.content if b.get("type") == "tool_use"]

    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")


class Model(Protocol):
    """Anything that can produce the next assistant message."""

    name: str

    async def respond(
        self,
        *,
        system: str,
        messages: list[Message],
        tools: list[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        """Return the next assistant message. ``on_text`` receives streamed text deltas."""
        ...
