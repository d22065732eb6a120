"""The Graph API sender: ``POST {base}/{version}/{phone_number_id}/messages`` with the
access token, retried with backoff on 5xx, 429 and network errors. The standard library's
HTTP client in a thread keeps the channel free of another dependency."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

log = logging.getLogger("signoff.whatsapp")


class Sent(msgspec.Struct, frozen=True, kw_only=True):
    """How one message went: ``ok`` with Meta's message id, or the last error."""

    ok: bool
    attempts: int
    message_id: str | None = None
    error: str | None = None
    taken_over: bool = False  # the claim was no longer the sender's: another sends it


class GraphSender:
    def __init__(
        self,
        *,
        base_url: str,
        api_version: str,
        phone_number_id: str,
        token: str,
        attempts: int = 4,
        backoff: float = 0.2,
        timeout: float = 10.0,
        hold_every: float = 10.0,
    ) -> None:
        """``timeout`` bounds each socket operation, not an attempt: a reply trickled in
        outlasts it. ``hold_every``: while an attempt waits for its answer, the claim is
        renewed this often (``still_ours``), a third of the claim lease or less, so that
        a live gateway's slow attempt is not taken over and sent again (design note 57)."""
        self.url = f"{base_url.rstrip('/')}/{api_version}/{phone_number_id}/messages"
        self.token = token
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.timeout = timeout
        self.hold_every = hold_every
        # A proxy configured for the outside world is honoured, except for a local fake.
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({})
            if "127.0.0.1" in base_url or "localhost" in base_url
            else urllib.request.ProxyHandler()
        )

    async def send(
        self, payload: dict[str, Any], still_ours: Callable[[], Awaitable[bool]] | None = None
    ) -> Sent:
        """``still_ours``: asked before each attempt; False stops (``taken_over``)."""
        error = "not sent"
        for attempt in range(1, self.attempts + 1):
            if still_ours is not None and not await still_ours():
                return Sent(ok=False, attempts=attempt - 1, taken_over=True)
            status, body, retry_after = await self._attempt(payload, still_ours)
            if 200 <= status < 300:
                mid = None
                try:
                    mid = json.loads(body)["messages"][0]["id"]
                except (ValueError, KeyError, IndexError, TypeError):
                    pass
                return Sent(ok=True, attempts=attempt, message_id=mid)
            error = f"HTTP {status}: {body[:300]}" if status else body[:300]
            if status and status != 429 and status < 500:
                break  # a refusal (bad token, bad payload): retrying will not help
            if attempt < self.attempts:
                wait = retry_after if retry_after is not None else self.backoff * 2 ** (attempt - 1)
                await asyncio.sleep(min(wait, 30.0))
        log.warning("WhatsApp send failed after %d attempt(s): %s", attempt, error)
        return Sent(ok=False, attempts=attempt, error=error)

    async def _attempt(
        self, payload: dict[str, Any], still_ours: Callable[[], Awaitable[bool]] | None
    ) -> tuple[int, str, float | None]:
        """One POST; its claim renewed every ``hold_every`` seconds until it is answered.
        The message is on the wire: whatever a renewal says, the answer is waited for."""
        post = asyncio.ensure_future(asyncio.to_thread(self._post, payload))
        while True:
            done, _ = await asyncio.wait({post}, timeout=self.hold_every)
            if done:
                return post.result()
            if still_ours is not None:
                try:
                    if not await still_ours():
                        log.warning("WhatsApp send in flight: its claim was taken over")
                        still_ours = None  # its finish will not count (note 55)
                except Exception as exc:  # the store away: the lease may lapse (note 57)
                    log.warning("WhatsApp send in flight: its claim not renewed: %s", exc)

    def _post(self, payload: dict[str, Any]) -> tuple[int, str, float | None]:
        req = urllib.request.Request(
            self.url,
            data=json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return resp.status, resp.read().decode(errors="replace"), None
        except urllib.error.HTTPError as exc:
            retry = exc.headers.get("Retry-After") if exc.headers else None
            number = retry.replace(".", "", 1) if retry else ""
            wait = float(retry) if retry and number.isascii() and number.isdigit() else None
            return exc.code, exc.read().decode(errors="replace"), wait
        except (OSError, urllib.error.URLError) as exc:
            return 0, f"network error: {exc}", None
