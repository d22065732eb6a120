"""The fake Messages API server, driven through the real ``anthropic`` SDK and AnthropicModel."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import anthropic
import anyio
import httpx
import pytest

from signoff.runtime.errors import ConfigError, ModelRefused, Unavailable
from signoff.runtime.models.anthropic_model import AnthropicModel
from signoff.runtime.models.base import ModelReply
from signoff.testing import FakeMessagesServer, ScriptedReply, text, tool_use

T = TypeVar("T")

MODEL = "claude-test-model"
TOOLS = [
    {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {
        "name": "send_email",
        "description": "Send an email (needs sign-off).",
        "input_schema": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
            "required": ["to", "body"],
        },
    },
]
USER: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and Oslo, then email Bob."}
]


@pytest.fixture
def server() -> Iterator[FakeMessagesServer]:
    with FakeMessagesServer() as srv:
        yield srv


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine function on a fresh event loop in its own thread.

    A session-scoped async fixture elsewhere (the browser suite) keeps anyio's
    runner alive in the main thread, where a nested ``anyio.run`` is refused.
    """
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, fn).result()


def run_with_client(
    server: FakeMessagesServer, fn: Callable[[anthropic.AsyncAnthropic], Awaitable[T]]
) -> T:
    async def main() -> T:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=server.base_url, max_retries=0)
        try:
            return await fn(client)
        finally:
            await client.close()

    return run_async(main)


def respond(
    server: FakeMessagesServer,
    *,
    stream: bool,
    messages: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[ModelReply, list[str]]:
    deltas: list[str] = []

    async def on_text(chunk: str) -> None:
        deltas.append(chunk)

    async def call(client: anthropic.AsyncAnthropic) -> ModelReply:
        model = AnthropicModel(client, MODEL, stream=stream)
        return await model.respond(
            system="You are terse.",
            messages=messages if messages is not None else USER,
            tools=tools if tools is not None else TOOLS,
            on_text=on_text,
        )

    return run_with_client(server, call), deltas


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_plain_text_reply(server: FakeMessagesServer, stream: bool) -> None:
    server.add(ScriptedReply([text("It is sunny in Paris today.")]))

    reply, deltas = respond(server, stream=stream)

    assert reply == ModelReply(
        content=[{"type": "text", "text": "It is sunny in Paris today."}], stop_reason="end_turn"
    )
    assert reply.text() == "It is sunny in Paris today."
    assert "".join(deltas) == "It is sunny in Paris today."
    if stream:
        assert len(deltas) > 1  # really streamed, word by word
    else:
        assert deltas == ["It is sunny in Paris today."]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_parallel_tool_use(server: FakeMessagesServer, stream: bool) -> None:
    paris = tool_use("get_weather", {"city": "Paris"})
    oslo = tool_use("get_weather", {"city": "Oslo", "units": {"temp": "C", "days": [1, 2]}})
    server.add(ScriptedReply([text("Checking both cities."), paris, oslo], stop_reason="tool_use"))

    reply, deltas = respond(server, stream=stream)

    assert reply.stop_reason == "tool_use"
    assert reply.content == [{"type": "text", "text": "Checking both cities."}, paris, oslo]
    assert [b["id"] for b in reply.tool_uses()] == [paris["id"], oslo["id"]]
    assert all(b["id"].startswith("toolu_") for b in reply.tool_uses())
    # Only API-valid input fields: nothing like citations/caller/parsed_output leaks.
    assert set(reply.content[0]) == {"type", "text"}
    assert all(set(b) == {"type", "id", "name", "input"} for b in reply.tool_uses())
    assert "".join(deltas) == "Checking both cities."

    [sent] = server.requests
    assert sent["model"] == MODEL
    assert sent["tools"] == TOOLS
    assert sent["messages"] == USER
    assert sent["system"] == "You are terse."
    assert sent.get("stream", False) is stream


def test_server_records_tools_and_messages_and_auth_headers(server: FakeMessagesServer) -> None:
    server.add(ScriptedReply([text("one")]), ScriptedReply([text("two")]))

    async def call(client: anthropic.AsyncAnthropic) -> list[str]:
        first = await client.messages.create(
            model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        )
        second = await client.messages.create(
            model=MODEL,
            max_tokens=50,
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "one"},
                {"role": "user", "content": [{"type": "text", "text": "again"}]},
            ],
            tools=[TOOLS[0]],  # type: ignore[list-item]
        )
        return [b.text for m in (first, second) for b in m.content if b.type == "text"]

    assert run_with_client(server, call) == ["one", "two"]
    assert [len(r["messages"]) for r in server.requests] == [1, 3]
    assert "tools" not in server.requests[0]
    assert [t["name"] for t in server.requests[1]["tools"]] == ["get_weather"]
    headers = server.request_headers[0]
    assert headers["authorization"] == "Bearer test" or headers.get("x-api-key") == "test"
    assert headers["anthropic-version"]


def test_response_is_a_valid_message(server: FakeMessagesServer) -> None:
    server.add(ScriptedReply([text("hello")]))
    response = httpx.post(
        f"{server.base_url}/v1/messages",
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        json={"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {
        "id",
        "type",
        "role",
        "model",
        "content",
        "stop_reason",
        "stop_sequence",
        "usage",
    }
    assert body["type"] == "message" and body["role"] == "assistant" and body["model"] == MODEL
    assert body["id"].startswith("msg_")
    assert set(body["usage"]) == {"input_tokens", "output_tokens"}
    anthropic.types.Message.model_validate(body)


def test_stream_sends_the_event_sequence(server: FakeMessagesServer) -> None:
    server.add(ScriptedReply([text("hi there"), tool_use("get_weather", {"city": "Rome"})]))
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/messages",
        headers={"authorization": "Bearer k", "anthropic-version": "2023-06-01"},
        json={
            "model": MODEL,
            "max_tokens": 10,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = [
        line.removeprefix("event: ") for line in raw.splitlines() if line.startswith("event: ")
    ]
    datas = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert [d["type"] for d in datas] == events  # every event is named, data type matches
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    assert events.count("content_block_start") == 2 == events.count("content_block_stop")
    kinds = {d["delta"]["type"] for d in datas if d["type"] == "content_block_delta"}
    assert kinds == {"text_delta", "input_json_delta"}
    [delta] = [d for d in datas if d["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == "end_turn"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_exhausted_script_raises_unavailable(server: FakeMessagesServer, stream: bool) -> None:
    with pytest.raises(Unavailable) as info:
        respond(server, stream=stream)
    cause = info.value.__cause__
    assert isinstance(cause, anthropic.InternalServerError)
    assert cause.status_code == 500
    assert cause.type == "api_error"
    assert "exhausted" in (cause.api_message or "")
    assert info.value.detail["status"] == 500
    assert len(server.requests) == 1  # x-should-retry: false, so no SDK retries


def test_exhausted_script_raw_sdk_error(server: FakeMessagesServer) -> None:
    async def call(client: anthropic.AsyncAnthropic) -> None:
        await client.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )

    with pytest.raises(anthropic.InternalServerError) as info:
        run_with_client(server, call)
    assert info.value.body == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "fake server script exhausted after 1 request(s)",
        },
    }


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_tool_round_trip_is_accepted(server: FakeMessagesServer, stream: bool) -> None:
    paris = tool_use("get_weather", {"city": "Paris"})
    oslo = tool_use("get_weather", {"city": "Oslo"})
    server.add(
        ScriptedReply([text("Looking."), paris, oslo], stop_reason="tool_use"),
        ScriptedReply([text("Paris 21C, Oslo 9C.")]),
    )

    first, _ = respond(server, stream=stream)
    conversation: list[dict[str, Any]] = [
        *USER,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": paris["id"], "content": "21C sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": oslo["id"],
                    "content": [{"type": "text", "text": "9C rain"}],
                    "is_error": False,
                },
            ],
        },
    ]
    second, deltas = respond(server, stream=stream, messages=conversation)

    assert second.text() == "Paris 21C, Oslo 9C."
    assert "".join(deltas) == "Paris 21C, Oslo 9C."
    assert len(server.requests) == 2
    assert server.requests[1]["messages"] == conversation
    assert server.remaining == 0


def test_missing_tool_result_is_rejected_like_the_api(server: FakeMessagesServer) -> None:
    call = tool_use("get_weather", {"city": "Paris"})
    bad: list[dict[str, Any]] = [
        *USER,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": "never mind"},
    ]
    with pytest.raises(ModelRefused) as info:  # a 400: trying it again would not help
        respond(server, stream=True, messages=bad)
    cause = info.value.__cause__
    assert isinstance(cause, anthropic.BadRequestError)
    assert cause.type == "invalid_request_error"
    assert call["id"] in (cause.api_message or "")


def test_malformed_requests_get_anthropic_errors(server: FakeMessagesServer) -> None:
    url = f"{server.base_url}/v1/messages"
    ok_headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    cases: list[tuple[dict[str, str], Any, int, str]] = [
        (ok_headers, b"{not json", 400, "invalid_request_error"),
        (ok_headers, {"model": MODEL, "messages": []}, 400, "invalid_request_error"),
        (ok_headers, {"model": MODEL, "max_tokens": 5}, 400, "invalid_request_error"),
        (
            ok_headers,
            {
                "model": MODEL,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "z": 1}]}],
            },
            400,
            "invalid_request_error",
        ),
        ({"anthropic-version": "2023-06-01"}, {}, 401, "authentication_error"),
    ]
    for headers, body, status, kind in cases:
        if isinstance(body, bytes):
            response = httpx.post(url, headers=headers, content=body)
        else:
            response = httpx.post(url, headers=headers, json=body)
        assert response.status_code == status, body
        payload = response.json()
        assert payload["type"] == "error"
        assert payload["error"]["type"] == kind
        assert payload["error"]["message"]
    missing = httpx.get(f"{server.base_url}/v1/nothing", headers=ok_headers)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"


def test_responder_answers_after_script(server: FakeMessagesServer) -> None:
    seen: list[int] = []

    def responder(body: dict[str, Any]) -> ScriptedReply:
        seen.append(len(body["messages"]))
        return ScriptedReply([text(f"echo {body['messages'][-1]['content']}")])

    server.responder = responder
    server.add(ScriptedReply([text("scripted")]))
    first, _ = respond(server, stream=True, messages=[{"role": "user", "content": "a"}])
    second, _ = respond(server, stream=False, messages=[{"role": "user", "content": "b"}])
    assert (first.text(), second.text()) == ("scripted", "echo b")
    assert seen == [1]


def test_connection_error_is_unavailable() -> None:
    with FakeMessagesServer() as srv:
        base_url = srv.base_url

    async def call() -> ModelReply:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=base_url, max_retries=0)
        try:
            return await AnthropicModel(client, MODEL).respond(system="", messages=USER, tools=[])
        finally:
            await client.close()

    with pytest.raises(Unavailable) as info:
        run_async(call)
    assert isinstance(info.value.__cause__, anthropic.APIConnectionError)


def test_from_settings_uses_base_url(server: FakeMessagesServer) -> None:
    server.add(ScriptedReply([text("configured")]))

    async def call() -> ModelReply:
        model = AnthropicModel.from_settings("test", server.base_url, MODEL)
        try:
            return await model.respond(system="", messages=USER, tools=[])
        finally:
            await model.aclose()

    assert run_async(call).text() == "configured"
    assert "system" not in server.requests[0] and "tools" not in server.requests[0]


@pytest.mark.parametrize("config_dir", [False, True], ids=["nothing", "empty-config-dir"])
def test_from_settings_without_credentials_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, config_dir: bool
) -> None:
    for var in (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_PROFILE",
        "ANTHROPIC_CONFIG_DIR",
        "ANTHROPIC_IDENTITY_TOKEN",
        "ANTHROPIC_IDENTITY_TOKEN_FILE",
        "ANTHROPIC_FEDERATION_RULE_ID",
        "ANTHROPIC_ORGANIZATION_ID",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/anthropic profile
    if config_dir:
        # An explicit ANTHROPIC_CONFIG_DIR makes the SDK raise CredentialsError in __init__.
        monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path / "anthropic"))
    with pytest.raises(ConfigError):
        AnthropicModel.from_settings(None, "http://127.0.0.1:9", MODEL)


@pytest.mark.parametrize("stream", [True, False])
def test_a_wrong_api_key_is_refused_not_unavailable(stream: bool) -> None:
    """A 401 is not something a later try gets past: ModelRefused (the run fails and the
    chat says why), where a 5xx is Unavailable (the step is tried again)."""
    with FakeMessagesServer([ScriptedReply([text("hi")])], api_keys={"the-right-key"}) as srv:
        with pytest.raises(ModelRefused) as info:
            respond(srv, stream=stream)
        assert info.value.detail["status"] == 401
        assert "invalid x-api-key" in info.value.message
        assert not isinstance(info.value, Unavailable)
        assert srv.remaining == 1  # nothing was answered
