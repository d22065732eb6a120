"""Who sends: every gateway with the channel on runs a courier that claims the new
thread-log entries of WhatsApp threads in Postgres (``wa_outbound``, one row per entry,
``INSERT ... ON CONFLICT DO NOTHING``) and sends only what it claimed. However many
gateways run, each entry is claimed once, so it is sent once (a claim left unfinished
past ``SIGNOFF_WHATSAPP_CLAIM_LEASE_SECONDS`` by a dead gateway is taken over by a live
one: a rare duplicate rather than a lost card); a failed send is
recorded on its row (status ``failed``, attempts, error) and the card stays decidable on
the other channels (design note 24)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from signoff.gateway.channels.whatsapp import outbound
from signoff.gateway.channels.whatsapp.graph import GraphSender, Sent
from signoff.runtime.config import Settings
from signoff.runtime.metrics import COUNTERS
from signoff.store.whatsapp import Outgoing

log = logging.getLogger("signoff.whatsapp")


class OutboundRows(Protocol):
    async def claim_outgoing(
        self, claimer: str, window_seconds: float, limit: int = 100
    ) -> list[Outgoing]: ...

    async def reclaim_outgoing(
        self, claimer: str, lease_seconds: float, window_seconds: float, limit: int = 100
    ) -> list[Outgoing]: ...

    async def hold_outgoing(self, key: str, claimer: str) -> bool: ...

    async def finish_outgoing(
        self,
        key: str,
        status: str,
        attempts: int,
        error: str | None,
        wa_message: str | None,
        claimer: str | None = None,
    ) -> None: ...


class Courier:
    def __init__(
        self, rows: OutboundRows, sender: GraphSender, settings: Settings, claimer: str
    ) -> None:
        self.rows = rows
        self.sender = sender
        self.settings = settings
        self.claimer = claimer

    async def run(self) -> None:
        """Poll until cancelled; a failing tick is logged and retried at the next poll."""
        while True:
            try:
                claimed = await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("WhatsApp courier tick failed: %s", exc)
                claimed = 0
            if not claimed:
                await asyncio.sleep(self.settings.whatsapp_poll_seconds)

    async def tick(self) -> int:
        """Claim and send one batch; how many entries were claimed."""
        s = self.settings
        # Claims whose gateway died before sending come first (older), then new entries.
        items = await self.rows.reclaim_outgoing(
            self.claimer, s.whatsapp_claim_lease_seconds, s.whatsapp_window_seconds
        )
        items += await self.rows.claim_outgoing(self.claimer, s.whatsapp_window_seconds)
        for item in items:
            payload = self.payload(item)
            if payload is None:
                await self.rows.finish_outgoing(item.key, "skipped", 0, None, None, self.claimer)
                continue
            # Asked before each attempt: a batch held up by a slow Graph API outlives the
            # claims' lease, and another gateway takes over (and sends) what it reclaims.
            await self.finish(
                item.key, await self.sender.send(payload, still_ours=self.holds(item.key))
            )
        return len(items)

    def holds(self, key: str) -> Callable[[], Awaitable[bool]]:
        """Whether this gateway still holds ``key``'s claim (renewed if so): asked before
        each attempt to send it (design note 55)."""

        async def holds() -> bool:
            return await self.rows.hold_outgoing(key, self.claimer)

        return holds

    async def finish(self, key: str, sent: Sent) -> None:
        """Record a send on its row, if this gateway still holds it."""
        if sent.taken_over:
            COUNTERS.inc("signoff_whatsapp_claims_taken_over_total")
            log.info("WhatsApp entry %s taken over by another gateway; not sent here", key)
            return
        status = "sent" if sent.ok else "failed"
        COUNTERS.inc(f"signoff_whatsapp_{status}_total")
        await self.rows.finish_outgoing(
            key, status, sent.attempts, sent.error, sent.message_id, self.claimer
        )

    def payload(self, item: Outgoing) -> dict[str, Any] | None:
        s = self.settings
        body = item.body
        if item.kind == "card":
            if body.get("status") != "pending":
                return None
            if item.in_window:
                return outbound.interactive_card(item.wa_id, body)
            # Outside the window no interactive message is allowed: the template says what
            # waits; the card stays decidable on the other channels.
            return outbound.template(
                item.wa_id,
                s.whatsapp_template_name,
                s.whatsapp_template_language,
                outbound.card_text(body, " · "),  # a template parameter has no newlines
            )
        if item.kind == "card_update":
            said = outbound.notice(body)
            if said is None:
                return None
            if item.in_window:
                return outbound.text(item.wa_id, said)
            return outbound.template(
                item.wa_id, s.whatsapp_template_name, s.whatsapp_template_language, said
            )
        if item.kind == "assistant" and item.in_window:
            said = outbound.assistant_text(body)
            return outbound.text(item.wa_id, said) if said else None
        return None
