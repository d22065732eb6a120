"""What the fake Messages API accepts: requests checked the way the real API checks them,
as far as a test needs (the shapes of messages, content blocks and tools, and the pairing
of every ``tool_use`` with its ``tool_result``)."""

from __future__ import annotations

from typing import Any

__all__ = ["STOP_REASONS", "BadRequest", "validate_content_block", "validate_request"]

STOP_REASONS = frozenset(
    {
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "tool_use",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
    }
)

# Request-side fields the API accepts on the block types it knows; anything else
# on these blocks is rejected as the real API does ("Extra inputs are not permitted").
_BLOCK_FIELDS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text", "cache_control", "citations"}),
    "tool_use": frozenset({"type", "id", "name", "input", "cache_control", "caller"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "redacted_thinking": frozenset({"type", "data"}),
}


class BadRequest(Exception):
    """A request the real API would refuse; answered with the API's error shape."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind


def validate_content_block(block: Any, where: str) -> None:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise BadRequest(f"{where}: content block must be an object with a string 'type'")
    kind = block["type"]
    allowed = _BLOCK_FIELDS.get(kind)
    if allowed is None:
        return  # image, document, ...: accepted as-is
    extra = sorted(set(block) - allowed)
    if extra:
        raise BadRequest(f"{where}.{extra[0]}: Extra inputs are not permitted")
    if kind == "text" and not isinstance(block.get("text"), str):
        raise BadRequest(f"{where}.text: Field required")
    if kind == "tool_use":
        if not isinstance(block.get("id"), str) or not block["id"]:
            raise BadRequest(f"{where}.id: Field required")
        if not isinstance(block.get("name"), str) or not block["name"]:
            raise BadRequest(f"{where}.name: Field required")
        if not isinstance(block.get("input"), dict):
            raise BadRequest(f"{where}.input: Input should be a valid dictionary")
    if kind == "tool_result":
        if not isinstance(block.get("tool_use_id"), str):
            raise BadRequest(f"{where}.tool_use_id: Field required")
        content = block.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequest(f"{where}.content: Input should be a valid string or list")
        if isinstance(content, list):
            for j, inner in enumerate(content):
                validate_content_block(inner, f"{where}.content.{j}")


def validate_request(body: Any) -> None:
    """Reject what the real API rejects, as far as this fake needs to care."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise BadRequest("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest("max_tokens: Field required (a positive integer)")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("stream: Input should be a valid boolean")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise BadRequest("system: Input should be a valid string or list")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("tools: Input should be a valid list")
        names: set[str] = set()
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise BadRequest(f"tools.{i}.name: Field required")
            if tool["name"] in names:
                raise BadRequest(f"tools: Tool names must be unique ({tool['name']!r})")
            names.add(tool["name"])
            if "type" not in tool and not isinstance(tool.get("input_schema"), dict):
                raise BadRequest(f"tools.{i}.input_schema: Field required")

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: at least one message is required")
    pending: set[str] = set()  # tool_use ids the previous assistant turn left open
    seen_ids: set[str] = set()  # every tool_use id so far: the API refuses one used twice
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages.{i}: Input should be a valid dictionary")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise BadRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            blocks: list[Any] = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            blocks = content
        else:
            raise BadRequest(f"messages.{i}.content: Input should be a valid string or list")
        for j, block in enumerate(blocks):
            validate_content_block(block, f"messages.{i}.content.{j}")
        for j, block in enumerate(blocks):
            if block["type"] == "tool_use":
                if block.get("id") in seen_ids:
                    raise BadRequest(
                        f"messages.{i}.content.{j}: `tool_use` ids must be unique "
                        f"({block.get('id')!r} is used twice)"
                    )
                seen_ids.add(block.get("id"))
        results = {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}
        if role == "assistant" and results:
            raise BadRequest(f"messages.{i}: tool_result blocks are only allowed in user messages")
        if pending:
            missing = pending - results
            if role != "user" or missing:
                raise BadRequest(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(sorted(missing or pending))}. Each "
                    "`tool_use` block must have a corresponding `tool_result` block in the "
                    "next message."
                )
        unknown = results - pending
        if unknown:
            raise BadRequest(
                f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` "
                f"blocks: {', '.join(sorted(unknown))}. Each `tool_result` block must have a "
                "corresponding `tool_use` block in the previous message."
            )
        pending = (
            {b["id"] for b in blocks if b["type"] == "tool_use"} if role == "assistant" else set()
        )
