"""The :class:`~runtime.models.base.Model` backed by the Anthropic Messages API.

Messages and tools go to the SDK as the plain dicts the rest of signoff stores;
the reply comes back as plain dicts too, trimmed to the fields the API accepts
on input, so an assistant turn can be appended to the conversation and sent
back unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import anthropic
from anthropic.types import ContentBlock, MessageParam, ToolUnionParam

from signoff.runtime.errors import ConfigError, ModelRefused, ModelUnavailable
from signoff.runtime.models.base import Block, Message, ModelReply, TextSink, ToolSpec

__all__ = ["AnthropicModel", "blocks_to_dicts"]

# Statuses a later try would get again (a wrong key, no access, no such model, a request
# the API will not take): the run fails on them. 408, 409, 429 and 5xx (529: overloaded)
# pass, and the step is tried again.
REFUSED = frozenset({400, 401, 403, 404, 413, 422})


def _block_to_dict(block: Any) -> Block:
    raw: dict[str, Any] = block.model_dump(mode="json", exclude_none=True)
    kind = raw.get("type")
    if kind == "text":
        return {"type": "text", "text": raw.get("text", "")}
    if kind == "tool_use":
        return {
            "type": "tool_use",
            "id": raw["id"],
            "name": raw["name"],
            "input": raw.get("input") or {},
        }
    if kind == "thinking":
        return {"type": "thinking", "thinking": raw["thinking"], "signature": raw["signature"]}
    # Other block types (redacted_thinking, server tool blocks, ...) keep their full
    # dump minus response-only parse helpers.
    raw.pop("parsed_output", None)
    return raw


def blocks_to_dicts(blocks: Iterable[ContentBlock | Any]) -> list[Block]:
    """SDK content blocks as plain, re-sendable dicts."""
    return [_block_to_dict(b) for b in blocks]


class AnthropicModel:
    """Calls ``client.messages`` (streaming by default) and returns a :class:`ModelReply`."""

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        model: str,
        max_tokens: int = 1024,
        stream: bool = True,
    ) -> None:
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.stream = stream
        self.name = f"anthropic:{model}"

    @classmethod
    def from_settings(cls, api_key: str | None, base_url: str | None, model: str) -> AnthropicModel:
        """Build a client from settings; ``None`` falls back to the SDK's env/profile lookup."""
        try:
            # With api_key=None the SDK resolves env vars / profiles right here, and a
            # broken or missing explicitly-chosen profile raises at construction time.
            client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url)
        except anthropic.CredentialsError as exc:
            raise ConfigError(f"Anthropic credentials: {exc}", model=model) from exc
        if client.api_key is None and client.auth_token is None and client.credentials is None:
            raise ConfigError(
                "no Anthropic credentials: set ANTHROPIC_API_KEY or pass an api_key",
                model=model,
            )
        return cls(client, model)

    async def aclose(self) -> None:
        """Close the underlying SDK client (and its connection pool)."""
        await self.client.close()

    async def respond(
        self,
        *,
        system: str,
        messages: list[Message],
        tools: list[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        """Ask for the next assistant message.

        Streaming: every ``text_delta`` goes to ``on_text`` as it arrives.
        Non-streaming: each text block goes to ``on_text`` once, whole.
        SDK connection errors and HTTP statuses a later try may not see again (408, 409,
        429, 5xx) become :class:`ModelUnavailable` (the step is tried again); the others, a
        wrong key or a request the API will not take, :class:`ModelRefused` (the run
        fails, and says why).
        """
        params = cast("list[MessageParam]", messages)
        tool_params = cast("list[ToolUnionParam]", tools) if tools else anthropic.omit
        system_param = system if system else anthropic.omit
        try:
            if self.stream:
                async with self.client.messages.stream(
                    model=self.model,
                    max_tokens=self.max_tokens,
                    system=system_param,
                    messages=params,
                    tools=tool_params,
                ) as stream:
                    async for event in stream:
                        if (
                            on_text is not None
                            and event.type == "content_block_delta"
                            and event.delta.type == "text_delta"
                        ):
                            await on_text(event.delta.text)
                    final = await stream.get_final_message()
                content = blocks_to_dicts(final.content)
                stop_reason = final.stop_reason
            else:
                message = await self.client.messages.create(
                    model=self.model,
                    max_tokens=self.max_tokens,
                    system=system_param,
                    messages=params,
                    tools=tool_params,
                )
                content = blocks_to_dicts(message.content)
                stop_reason = message.stop_reason
                if on_text is not None:
                    for block in content:
                        if block["type"] == "text" and block["text"]:
                            await on_text(block["text"])
        except anthropic.APIStatusError as exc:
            refused = exc.status_code in REFUSED
            raise (ModelRefused if refused else ModelUnavailable)(
                f"Anthropic API answered {exc.status_code}: {exc.api_message or exc.message}",
                status=exc.status_code,
                error_type=exc.type,
                request_id=exc.request_id,
                model=self.model,
            ) from exc
        except anthropic.APIConnectionError as exc:
            raise ModelUnavailable(
                f"Anthropic API unreachable: {exc.message}", model=self.model
            ) from exc
        except anthropic.APIResponseValidationError as exc:
            raise ModelUnavailable(
                f"Anthropic API sent an unexpected response: {exc.message}",
                status=exc.status_code,
                model=self.model,
            ) from exc
        return ModelReply(content=content, stop_reason=stop_reason or "end_turn")
