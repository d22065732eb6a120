"""A local fake of the WhatsApp Cloud (Graph) API, so WhatsApp flows are tested offline.

::

    with FakeGraphAPI() as graph:
        settings = {"SIGNOFF_WHATSAPP_BASE_URL": graph.url, ...}
        ...
        msg = graph.wait_for(lambda m: m["type"] == "interactive")

It records every ``POST /{version}/{phone_number_id}/messages`` it receives (``.sent``),
answers like Meta (``{"messages": [{"id": "wamid..."}]}``), checks the bearer token when
given one, and can be told to fail the next requests (``fail_next(3, status=503)``, or
only those a predicate accepts: ``fail_next(3, 429, match=lambda m: m["to"] == n)``).
:func:`delivery`, :func:`text_message` and :func:`button_message` build webhook payloads,
and :func:`signed` signs them as Meta does (``X-Hub-Signature-256``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["FakeGraphAPI", "button_message", "delivery", "signed", "text_message"]


class FakeGraphAPI:
    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.sent: list[dict[str, Any]] = []
        self.requests = 0
        self._seen: list[dict[str, Any]] = []
        self._fail: list[tuple[int, Callable[[dict[str, Any]], bool] | None]] = []
        self._lock = threading.Condition()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(size)
                status, answer = fake._answer(self.path, self.headers.get("authorization"), body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeGraphAPI:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeGraphAPI:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def fail_next(
        self, n: int, status: int = 503, match: Callable[[dict[str, Any]], bool] | None = None
    ) -> None:
        """The next ``n`` requests (only those ``match`` accepts, when given) are answered
        ``status`` and not recorded as sent."""
        with self._lock:
            self._fail.extend([(status, match)] * n)

    def attempts(self, match: Callable[[dict[str, Any]], bool]) -> int:
        """How many requests ``match`` accepted, failed ones included."""
        with self._lock:
            return sum(1 for m in self._seen if match(m))

    def _answer(self, path: str, auth: str | None, body: bytes) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests += 1
            if not path.endswith("/messages"):
                return 404, {"error": {"message": "unknown path"}}
            if self.token is not None and auth != f"Bearer {self.token}":
                return 401, {"error": {"message": "invalid access token", "code": 190}}
            try:
                message = json.loads(body)
            except ValueError:
                return 400, {"error": {"message": "invalid JSON"}}
            self._seen.append(message)
            for i, (status, match) in enumerate(self._fail):
                if match is None or match(message):
                    del self._fail[i]
                    return status, {"error": {"message": "try again", "code": 2}}
            self.sent.append(message)
            self._lock.notify_all()
            return 200, {
                "messaging_product": "whatsapp",
                "contacts": [{"input": message.get("to"), "wa_id": message.get("to")}],
                "messages": [{"id": "wamid.fake" + secrets.token_hex(8)}],
            }

    def wait_for(
        self, match: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> dict[str, Any]:
        """The first sent message ``match`` accepts, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for m in self.sent:
                    if match(m):
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no such message sent; sent: {self.sent!r}")
                self._lock.wait(left)

    def matching(self, match: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        with self._lock:
            return [m for m in self.sent if match(m)]


def text_message(wa_id: str, body: str, message_id: str | None = None) -> dict[str, Any]:
    return {
        "from": wa_id,
        "id": message_id or "wamid.in" + secrets.token_hex(8),
        "timestamp": str(int(time.time())),
        "type": "text",
        "text": {"body": body},
    }


def button_message(wa_id: str, button_id: str, message_id: str | None = None) -> dict[str, Any]:
    return {
        "from": wa_id,
        "id": message_id or "wamid.in" + secrets.token_hex(8),
        "timestamp": str(int(time.time())),
        "type": "interactive",
        "interactive": {"type": "button_reply", "button_reply": {"id": button_id, "title": "ok"}},
    }


def delivery(*messages: dict[str, Any], phone_number_id: str = "100") -> bytes:
    """A webhook body carrying ``messages``, as raw bytes (what gets signed)."""
    value = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550000000", "phone_number_id": phone_number_id},
        "contacts": [{"wa_id": m["from"], "profile": {"name": "x"}} for m in messages],
        "messages": list(messages),
    }
    payload = {
        "object": "whatsapp_business_account",
        "entry": [{"id": "1", "changes": [{"field": "messages", "value": value}]}],
    }
    return json.dumps(payload).encode()


def signed(body: bytes, app_secret: str) -> dict[str, str]:
    """Headers for posting ``body`` to the webhook, signed as Meta does."""
    digest = hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": "sha256=" + digest, "Content-Type": "application/json"}
