"""Build the Messages API conversation from the stored thread log (pure).

Consecutive same-role entries merge into one message. A ``tool_use`` left
without its ``tool_result`` (its run was superseded by a newer user message,
or its process died) gets a synthetic error result, so the conversation sent
to the model is always valid.
"""

from __future__ import annotations

from typing import Any

from signoff.runtime.records import Entry

ROLE = {"user": "user", "tool_results": "user", "assistant": "assistant"}

DANGLING = (
    "Not completed: the user sent a new message before this was decided. Nothing was executed."
)


def build_messages(entries: list[Entry]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for entry in entries:
        role = ROLE.get(entry.kind)
        if role is None:
            continue
        content = list(entry.body.get("content", []))
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(content)
        else:
            messages.append({"role": role, "content": content})
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        out.append(msg)
        if msg["role"] != "assistant":
            continue
        wanted = [b["id"] for b in msg["content"] if b.get("type") == "tool_use"]
        if not wanted:
            continue
        nxt = messages[i + 1] if i + 1 < len(messages) else None
        have = {
            b.get("tool_use_id")
            for b in (nxt["content"] if nxt else [])
            if b.get("type") == "tool_result"
        }
        missing = [
            {"type": "tool_result", "tool_use_id": t, "content": DANGLING, "is_error": True}
            for t in wanted
            if t not in have
        ]
        if not missing or nxt is None:
            continue  # a trailing assistant turn with open calls is the run still in flight
        results = [b for b in nxt["content"] if b.get("type") == "tool_result"]
        rest = [b for b in nxt["content"] if b.get("type") != "tool_result"]
        nxt["content"] = results + missing + rest
    return out
