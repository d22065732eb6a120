"""A local fake of the Anthropic Messages API, for tests (public: ``signoff.testing``).

It is a real HTTP server (Starlette served by uvicorn on 127.0.0.1), so the
real ``anthropic`` SDK talks to it through ``base_url`` exactly as it talks to
the hosted API: same headers, same JSON, same server-sent events.

``POST /v1/messages`` answers with scripted replies, in order. With
``"stream": true`` it sends the SSE sequence the SDK's ``messages.stream()``
accumulates: ``message_start``, per block ``content_block_start`` /
``content_block_delta`` (``text_delta``, ``input_json_delta``, ``thinking_delta``)
/ ``content_block_stop``, then ``message_delta`` (with ``stop_reason``) and
``message_stop``.

Every JSON body received is kept in :attr:`FakeMessagesServer.requests` (and its
headers in :attr:`FakeMessagesServer.request_headers`) so a test can assert the
tool list and conversation that were sent.

``latency`` (seconds) holds every valid request that long before it is answered, as the
hosted API takes its time to reply; :attr:`FakeMessagesServer.in_flight` counts the
requests being answered now and :attr:`FakeMessagesServer.most_in_flight` the most at
once (``reset_most_in_flight()`` starts that count again), so a test can assert how
many model calls a worker makes together.

Errors use the API's shape, ``{"type": "error", "error": {"type", "message"}}``:
400 ``invalid_request_error`` for a malformed request, 401
``authentication_error`` without credentials, 500 ``api_error`` (with
``x-should-retry: false`` so the SDK does not retry) when the script is
exhausted and there is no responder.

CLI::

    python -m signoff.testing.fake_messages --port 8765 --script replies.json

where ``replies.json`` is a list of ``{"content": [...], "stop_reason": "..."}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from types import TracebackType
from typing import Any

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from signoff.testing.fake_requests import (
    STOP_REASONS,
    BadRequest,
    validate_content_block,
    validate_request,
)

__all__ = ["FakeMessagesServer", "ScriptedReply", "reply", "text", "thinking", "tool_use"]

Block = dict[str, Any]
Responder = Callable[[dict[str, Any]], "ScriptedReply"]

_JSON_CHUNK = 12  # characters of tool input JSON per input_json_delta


class ScriptedReply(msgspec.Struct):
    """One assistant message the server will answer with."""

    content: list[dict[str, Any]]
    stop_reason: str = "end_turn"


def text(s: str) -> Block:
    """A ``text`` content block."""
    return {"type": "text", "text": s}


def tool_use(name: str, input: dict[str, Any], id: str | None = None) -> Block:
    """A ``tool_use`` content block; the id defaults to a fresh ``toolu_<hex>``."""
    return {
        "type": "tool_use",
        "id": id or f"toolu_{secrets.token_hex(12)}",
        "name": name,
        "input": input,
    }


def reply(*blocks: Block, stop_reason: str | None = None) -> ScriptedReply:
    """An assistant message of these blocks. Its ``stop_reason`` defaults to ``tool_use``
    when a block calls a tool (several ``tool_use`` blocks are parallel calls), else
    ``end_turn``."""
    if stop_reason is None:
        calls = any(b.get("type") == "tool_use" for b in blocks)
        stop_reason = "tool_use" if calls else "end_turn"
    return ScriptedReply(content=list(blocks), stop_reason=stop_reason)


def thinking(s: str, signature: str = "sig") -> Block:
    """A ``thinking`` content block (streamed as thinking_delta + signature_delta)."""
    return {"type": "thinking", "thinking": s, "signature": signature}


def _error(status: int, kind: str, message: str, *, retry: bool | None = None) -> JSONResponse:
    headers = {"request-id": f"req_{secrets.token_hex(12)}"}
    if retry is not None:
        headers["x-should-retry"] = "true" if retry else "false"
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}},
        status_code=status,
        headers=headers,
    )


def _validate_reply(reply: ScriptedReply) -> None:
    if reply.stop_reason not in STOP_REASONS:
        raise ValueError(f"unknown stop_reason {reply.stop_reason!r}")
    for block in reply.content:
        validate_content_block(block, "reply.content")


def _estimate_tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, separators=(",", ":"))) // 4)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _text_chunks(s: str) -> list[str]:
    """Split text the way a model streams it: word-ish pieces, whitespace kept."""
    return re.findall(r"\s*\S+\s*|\s+", s) or [""]


class FakeMessagesServer:
    """A scripted Messages API on a free 127.0.0.1 port, in a background thread."""

    def __init__(
        self,
        script: Sequence[ScriptedReply] | None = None,
        responder: Responder | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_keys: Collection[str] | None = None,
        latency: float = 0.0,
    ) -> None:
        """``api_keys``: the keys it accepts (401 ``authentication_error`` for any other,
        as the API answers a wrong or revoked key); None accepts any key. ``latency``:
        seconds each valid request waits before its answer (0: none)."""
        if latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, not {latency!r}")
        self.latency = latency
        self.in_flight = 0
        self.most_in_flight = 0
        self._script: list[ScriptedReply] = []
        self.api_keys = None if api_keys is None else frozenset(api_keys)
        self._lock = threading.Lock()
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self._host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self.base_url = ""
        if script:
            self.add(*script)
        self.app = Starlette(
            routes=[Route("/v1/messages", self._messages, methods=["POST"])],
            exception_handlers={HTTPException: self._http_error},
        )

    # -- script ------------------------------------------------------------

    def add(self, *replies: ScriptedReply) -> None:
        """Append replies to the script."""
        for reply in replies:
            _validate_reply(reply)
        with self._lock:
            self._script.extend(replies)

    @property
    def remaining(self) -> int:
        """How many scripted replies have not been served yet."""
        with self._lock:
            return len(self._script)

    def _next_reply(self, body: dict[str, Any]) -> ScriptedReply | None:
        with self._lock:
            if self._script:
                return self._script.pop(0)
        if self.responder is not None:
            reply = self.responder(body)
            _validate_reply(reply)
            return reply
        return None

    def reset_most_in_flight(self) -> None:
        """Start counting :attr:`most_in_flight` again from the requests in flight now."""
        with self._lock:
            self.most_in_flight = self.in_flight

    # -- HTTP --------------------------------------------------------------

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, kind, f"{request.method} {request.url.path}: {exc.detail}")

    async def _messages(self, request: Request) -> Response:
        api_key = request.headers.get("x-api-key")
        authorization = request.headers.get("authorization", "")
        bearer = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
        if not api_key and not bearer:
            return _error(
                401, "authentication_error", "x-api-key or Authorization: Bearer header required"
            )
        if self.api_keys is not None and (api_key or bearer) not in self.api_keys:
            return _error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return _error(400, "invalid_request_error", "anthropic-version: header is required")

        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return _error(400, "invalid_request_error", f"request body is not valid JSON: {exc}")
        if isinstance(body, dict):
            with self._lock:
                self.requests.append(body)
                self.request_headers.append(dict(request.headers))
        try:
            validate_request(body)
        except BadRequest as exc:
            return _error(exc.status, exc.kind, exc.message)
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
        finally:
            with self._lock:
                self.in_flight -= 1

        try:
            reply = self._next_reply(body)
        except Exception as exc:
            return _error(500, "api_error", f"responder failed: {exc!r}", retry=False)
        if reply is None:
            return _error(
                500,
                "api_error",
                f"fake server script exhausted after {len(self.requests)} request(s)",
                retry=False,
            )

        message_id = f"msg_{secrets.token_hex(12)}"
        usage = {
            "input_tokens": _estimate_tokens(body["messages"]),
            "output_tokens": _estimate_tokens(reply.content),
        }
        headers = {"request-id": f"req_{secrets.token_hex(12)}"}
        if body.get("stream"):
            return StreamingResponse(
                self._events(message_id, body["model"], reply, usage),
                media_type="text/event-stream",
                headers={**headers, "cache-control": "no-cache"},
            )
        return JSONResponse(
            {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": reply.content,
                "stop_reason": reply.stop_reason,
                "stop_sequence": None,
                "usage": usage,
            },
            headers=headers,
        )

    async def _events(
        self, message_id: str, model: str, reply: ScriptedReply, usage: dict[str, int]
    ) -> AsyncIterator[bytes]:
        yield _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1},
                },
            },
        )
        yield _sse("ping", {"type": "ping"})
        for index, block in enumerate(reply.content):
            for event, data in _block_events(index, block):
                yield _sse(event, data)
        yield _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        yield _sse("message_stop", {"type": "message_stop"})

    # -- lifecycle ---------------------------------------------------------

    def _config(self) -> uvicorn.Config:
        return uvicorn.Config(
            self.app,
            host=self._host,
            port=self._port,
            loop="asyncio",
            http="h11",
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
        )

    def start(self) -> None:
        """Serve in a background thread (its own event loop); returns once listening."""
        if self._thread is not None:
            raise RuntimeError("FakeMessagesServer already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError:
            sock.close()
            raise
        host, port = sock.getsockname()[:2]
        self._sock = sock
        self.base_url = f"http://{host}:{port}"
        server = uvicorn.Server(self._config())
        self._server = server
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="fake-messages-api", daemon=True
        )
        self._thread = thread
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("fake Messages API server did not start")
            time.sleep(0.005)

    def stop(self) -> None:
        """Stop serving and wait for the thread; safe to call twice."""
        server, thread, sock = self._server, self._thread, self._sock
        self._server = self._thread = self._sock = None
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(timeout=10)
        if sock is not None:
            sock.close()

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (used by the CLI)."""
        config = self._config()
        self.base_url = f"http://{self._host}:{self._port}"
        uvicorn.Server(config).run()

    def __enter__(self) -> FakeMessagesServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _block_events(index: int, block: Block) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events for one content block: start, deltas, stop."""
    kind = block["type"]
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        start: Block = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": c} for c in _text_chunks(block["text"])]
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        encoded = json.dumps(block["input"], separators=(",", ":"))
        if encoded == "{}":
            encoded = ""
        pieces = [encoded[i : i + _JSON_CHUNK] for i in range(0, len(encoded), _JSON_CHUNK)]
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in ["", *pieces]]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            *({"type": "thinking_delta", "thinking": c} for c in _text_chunks(block["thinking"])),
            {"type": "signature_delta", "signature": block.get("signature", "")},
        ]
    else:
        start = block  # sent whole, no deltas
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
    ]
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a scripted fake Anthropic Messages API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--script",
        help="JSON file: a list of {content: [...], stop_reason} replies, served in order",
    )
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds each request waits for its answer"
    )
    args = parser.parse_args(argv)
    script: list[ScriptedReply] = []
    if args.script:
        with open(args.script, "rb") as fh:
            script = msgspec.json.decode(fh.read(), type=list[ScriptedReply])
    server = FakeMessagesServer(script, host=args.host, port=args.port, latency=args.latency)
    print(f"fake Messages API on http://{args.host}:{args.port} ({len(script)} scripted replies)")
    server.serve_forever()


if __name__ == "__main__":
    main()
