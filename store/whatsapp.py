"""The WhatsApp channel's rows: delivery dedup, a thread per number, the outbound claims
(design note 24) and refused decisions (gateway/channels/whatsapp)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, cast

import msgspec

from signoff.store import rows
from signoff.store.connector import Connector
from signoff.store.queries import SQL

CHANNEL = "whatsapp"

Claim = Literal["claimed", "handled", "busy"]


class DeliveryClaim(msgspec.Struct, frozen=True, kw_only=True):
    state: Claim
    # What an earlier handling of a claim that lapsed chose to do (to do again), if any.
    effect: str | None = None
    # A claimed delivery's token (its claim's end): the holder's later statements name it
    # and do nothing once the claim was lost to another request (design note 66).
    token: datetime | None = None


class Outgoing(msgspec.Struct, frozen=True, kw_only=True):
    """A thread-log entry of a WhatsApp thread, claimed by one gateway to send."""

    key: str
    tenant: str
    wa_id: str
    thread_id: str
    seq: int
    kind: str
    body: dict[str, Any]
    in_window: bool


class WhatsAppRows:
    def __init__(self, db: Connector) -> None:
        self._db = db

    async def claim_delivery(
        self, channel: str, message_id: str, lease_seconds: float
    ) -> DeliveryClaim:
        """Claim ``message_id`` on ``channel`` for ``lease_seconds`` (any process; design
        notes 64 and 66): ``claimed`` (handle it, then :meth:`delivery_handled`), ``handled``
        (seen before: drop it) or ``busy`` (another request holds a live claim)."""
        row = await self._db.fetchrow(SQL.delivery_claim, channel, message_id, lease_seconds)
        assert row is not None
        return DeliveryClaim(
            state=cast(Claim, str(row["state"])), effect=row["effect"], token=row["token"]
        )

    async def delivery_effect(
        self, channel: str, message_id: str, claim: DeliveryClaim, effect: str
    ) -> bool:
        """What the claimed delivery's handling chose, written before it is done; False if
        the claim was lost meanwhile (then nothing may be done: another request has it)."""
        return (
            await self._db.fetchval(SQL.delivery_effect, channel, message_id, claim.token, effect)
            is not None
        )

    async def delivery_handled(self, channel: str, message_id: str, claim: DeliveryClaim) -> None:
        """The claimed delivery's effect committed: its redeliveries are dropped."""
        await self._db.execute(SQL.delivery_handled, channel, message_id, claim.token)

    async def delivery_held(self, channel: str, message_id: str, claim: DeliveryClaim) -> bool:
        """Whether this request still holds its claim on the delivery."""
        return bool(await self._db.fetchval(SQL.delivery_held, channel, message_id, claim.token))

    async def forget_delivery(self, channel: str, message_id: str, claim: DeliveryClaim) -> None:
        """Let go of the claim on a delivery that could not be handled: a redelivery is
        handled at once, with the effect already chosen if one was (never deleted: a
        decision whose answer was lost may have committed)."""
        await self._db.execute(SQL.delivery_forget, channel, message_id, claim.token)

    async def quoted_card(self, thread_id: str, wa_message: str) -> str | None:
        """The card whose WhatsApp message ``wa_message`` is (a quoted reply's), if any."""
        value = await self._db.fetchval(SQL.wa_quoted_card, thread_id, wa_message)
        return None if value is None else str(value)

    async def card_shown(
        self, thread_id: str, card_id: str, before: int, *, quoted: bool = False
    ) -> bool:
        """Whether the card's proposal was sent to the thread's number before ``before``
        (the unix second of the person's message: a send within that second counts) and,
        unless the message ``quoted`` the card, no other card sent by then still waited."""
        return bool(await self._db.fetchval(SQL.wa_card_shown, thread_id, card_id, before, quoted))

    async def contact_thread(self, tenant: str, wa_id: str) -> str | None:
        value = await self._db.fetchval(SQL.wa_contact_get, tenant, wa_id)
        return None if value is None else str(value)

    async def add_contact(self, tenant: str, wa_id: str, thread_id: str) -> str | None:
        """Bind ``thread_id`` to the number; None if another process bound one first."""
        value = await self._db.fetchval(
            SQL.wa_contact_insert, tenant, wa_id, rows.uuid_of(thread_id)
        )
        return None if value is None else str(value)

    async def touch_inbound(self, tenant: str, wa_id: str) -> None:
        """The number wrote to us now: its 24-hour window opens again."""
        await self._db.execute(SQL.wa_contact_inbound, tenant, wa_id)

    async def wrote_text(self, tenant: str, wa_id: str, sent: int) -> None:
        """The number's text of unix second ``sent`` goes on to its agent as a message."""
        await self._db.execute(SQL.wa_contact_text, tenant, wa_id, sent)

    async def wrote_on_thread(self, thread_id: str) -> None:
        """A message for the thread's agent came from another channel now: a WhatsApp
        "sim" after it is about what follows it (no-op for a thread that is not a
        WhatsApp number's)."""
        await self._db.execute(SQL.wa_thread_text, rows.uuid_of(thread_id))

    async def written_since(self, thread_id: str, card_id: str, before: int) -> bool:
        """Whether the number wrote a text passed on as a message after the card was
        sent to it (in a later second) and no later than second ``before``."""
        return bool(await self._db.fetchval(SQL.wa_written_since, thread_id, card_id, before))

    async def in_window(self, tenant: str, wa_id: str, window_seconds: float) -> bool:
        value = await self._db.fetchval(SQL.wa_in_window, tenant, wa_id, float(window_seconds))
        return bool(value)

    async def claim_outgoing(
        self, claimer: str, window_seconds: float, limit: int = 100
    ) -> list[Outgoing]:
        found = await self._db.fetch(SQL.wa_outbound_claim, limit, claimer, float(window_seconds))
        return [msgspec.convert(dict(r), Outgoing) for r in found]

    async def reclaim_outgoing(
        self, claimer: str, lease_seconds: float, window_seconds: float, limit: int = 100
    ) -> list[Outgoing]:
        """Take over log-entry claims older than the lease that were never finished."""
        found = await self._db.fetch(
            SQL.wa_outbound_reclaim, limit, claimer, float(lease_seconds), float(window_seconds)
        )
        return [msgspec.convert(dict(r), Outgoing) for r in found]

    async def claim_reply(
        self, key: str, tenant: str, wa_id: str, kind: str, claimer: str, lease: float
    ) -> bool:
        """Claim a direct answer (keyed by the inbound message): True for exactly one caller,
        or for a later one when the claim was abandoned unsent (its gateway stopped: failed
        with no attempt, or claimed longer than ``lease`` seconds)."""
        value = await self._db.fetchval(
            SQL.wa_reply_claim, key, tenant, wa_id, kind, claimer, float(lease)
        )
        return value is not None

    async def hold_outgoing(self, key: str, claimer: str) -> bool:
        """Whether ``claimer`` still holds the claim on ``key`` (renewed if so)."""
        return await self._db.fetchval(SQL.wa_outbound_hold, key, claimer) is not None

    async def finish_outgoing(
        self,
        key: str,
        status: str,
        attempts: int,
        error: str | None,
        wa_message: str | None,
        claimer: str | None = None,
    ) -> None:
        """Record how a send went; with ``claimer``, only while it still holds the row."""
        await self._db.execute(
            SQL.wa_outbound_finish, key, status, attempts, error, wa_message, claimer
        )

    async def refuse(
        self, card_id: str, actor: str, channel: str, reason: str, detail: dict[str, Any]
    ) -> None:
        """Keep a refused decision attempt (not a transition: card_events stays transitions)."""
        await self._db.execute(
            SQL.card_refusal_insert, rows.uuid_of(card_id), actor, channel, reason, detail
        )

    async def refusals(self, card_id: str) -> list[dict[str, Any]]:
        found = await self._db.fetch(SQL.card_refusals_of_card, rows.uuid_of(card_id))
        return [dict(r) for r in found]
