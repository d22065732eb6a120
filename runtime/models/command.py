"""The generic offline model: any app's tools as slash commands, no API key needed.

``/refund_order order_id=A100 reason="arrived broken"`` (or ``/tool {"json": "input"}``)
becomes the ``tool_use`` block Claude would send, so an app without its own offline
model (``App.offline_model``) shows its whole card flow on a fresh machine. Anything
else is answered with the list of commands. Clearly labelled; with
``ANTHROPIC_API_KEY`` set, Claude is used instead.
"""

from __future__ import annotations

import itertools
import json
import shlex
from typing import Any

from signoff.runtime.models.base import Message, ModelReply, TextSink, ToolSpec

LABEL = "[offline model] "
_ids = itertools.count(1)


def _value(text: str) -> Any:
    """A command argument: JSON when it parses as JSON (numbers, true, lists), else text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_command(line: str) -> tuple[str, dict[str, Any]] | None:
    """``/name key=value ...`` or ``/name {json}`` -> (name, input); None when not a command
    (or when its arguments do not parse)."""
    line = line.strip()
    if not line.startswith("/") or len(line) < 2:
        return None
    name, _, rest = line[1:].partition(" ")
    rest = rest.strip()
    if rest.startswith("{"):
        try:
            parsed = json.loads(rest)
        except ValueError:
            return None
        return (name, parsed) if isinstance(parsed, dict) else None
    try:
        words = shlex.split(rest)
    except ValueError:
        return None
    data: dict[str, Any] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            return None
        data[key] = _value(value)
    return name, data


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def readable(content: Any) -> str:
    """A tool result as a person reads it: an executed card's JSON (``{"status", "card",
    "result"}``) as its status, the card's line and ``key: value`` pairs, not raw JSON."""
    if isinstance(content, list):  # content blocks
        content = " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    text = str(content)
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if not isinstance(data, dict):
        return text
    result = data.pop("result", None)
    head = [_plain(data.pop("status")).capitalize() + " —"] if "status" in data else []
    head += [_plain(data.pop("card"))] if "card" in data else []
    pairs = {**data, **result} if isinstance(result, dict) else data
    if result is not None and not isinstance(result, dict):
        head.append(_plain(result))
    body = " · ".join(f"{k}: {_plain(v)}" for k, v in pairs.items())
    return " ".join(head + ([body] if body else []))


def usage(tools: list[ToolSpec]) -> str:
    """One line per tool: its command with the input fields it takes."""
    lines = []
    for spec in tools:
        props = spec.get("input_schema", {}).get("properties", {})
        fields = " ".join(f"{key}=…" for key in props)
        lines.append(f"/{spec['name']} {fields}".rstrip() + f"  ({spec.get('description', '')})")
    return "\n".join(lines)


def _help(text: str, tools: list[ToolSpec], known: set[str]) -> str:
    """What to type instead: why the command was not one, then the commands."""
    head = "No model is configured (set ANTHROPIC_API_KEY to use Claude). "
    if not tools:
        return head + "This app has no tools to call as commands."
    name = text.strip()[1:].partition(" ")[0] if text.strip().startswith("/") else ""
    if name and name not in known:
        head += f"There is no tool {name!r}. "
    elif name:
        head += (
            "Its arguments did not parse: write key=value pairs, quoting values with "
            'spaces (title="Buy milk"), or one JSON object. '
        )
    return head + "Call a tool as a command, e.g.:\n" + usage(tools)


class CommandModel:
    """Turns ``/tool key=value`` messages into tool calls; says what happened after."""

    name = "offline-commands"

    async def respond(
        self,
        *,
        system: str,
        messages: list[Message],
        tools: list[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        last = messages[-1] if messages else {"content": []}
        blocks = last.get("content", [])
        results = [b for b in blocks if b.get("type") == "tool_result"]
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        if results and not texts:
            said = "\n".join(readable(r.get("content", "")) for r in results)
            return await self._text(LABEL + "Tool result: " + said, on_text)
        said_text = " ".join(texts)
        command = parse_command(said_text)
        known = {spec["name"] for spec in tools}
        if command is None or command[0] not in known:
            return await self._text(LABEL + _help(said_text, tools, known), on_text)
        name, data = command
        intro = LABEL + f"Calling {name}."
        if on_text is not None:
            await on_text(intro)
        use = {
            "type": "tool_use",
            "id": f"toolu_cmd_{next(_ids):06d}",
            "name": name,
            "input": data,
        }
        return ModelReply(content=[{"type": "text", "text": intro}, use], stop_reason="tool_use")

    @staticmethod
    async def _text(text: str, on_text: TextSink | None) -> ModelReply:
        if on_text is not None:
            await on_text(text)
        return ModelReply(content=[{"type": "text", "text": text}], stop_reason="end_turn")
