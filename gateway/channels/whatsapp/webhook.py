"""The webhook: ``GET /v1/whatsapp/webhook`` (Meta's verification handshake) and
``POST /v1/whatsapp/webhook`` (deliveries). A delivery's raw bytes are verified
(``X-Hub-Signature-256``) before anything is parsed or stored; each message is handled
once (``deliveries``, ``ON CONFLICT``), whichever gateway receives it and however often
Meta redelivers it. Button decisions take the web's path, ``Decisions.resolve``."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from signoff.gateway.auth import Principal
from signoff.gateway.channels.whatsapp import inbound, nudges, outbound, policy, signature
from signoff.gateway.channels.whatsapp.courier import Courier, OutboundRows
from signoff.gateway.channels.whatsapp.graph import GraphSender
from signoff.gateway.errors import Internal
from signoff.gateway.http import error_response, json_response
from signoff.gateway.quotas import MemoryLedger, Quotas
from signoff.gateway.service import LONE_SURROGATE, announce_thread
from signoff.runtime.bus import Bus, Job
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Decisions, Resolution
from signoff.runtime.errors import (
    AlreadyDecided,
    CardNotFound,
    Expired,
    Forbidden,
    InvalidInput,
    NotOwner,
    RateLimited,
    SignoffError,
    StaleCard,
    Unavailable,
    UnknownTool,
)
from signoff.runtime.keys import Keys
from signoff.runtime.store import Store
from signoff.store.whatsapp import DeliveryClaim

log = logging.getLogger("signoff.whatsapp")

CHANNEL = "whatsapp"
# A message another request is handling: how long to wait for it, looking how often.
BUSY_WAIT_SECONDS = 3.0
BUSY_POLL_SECONDS = 0.1
# A text's effect under SIGNOFF_WHATSAPP_TEXT_CONFIRM (deliveries.effect).
CONFIRM = "confirm:"
MESSAGE = "message"
PRESS = "press"  # a button's decision (made once; handled again, it says nothing)
# A "yes" that cannot be tied to one card the person had seen: answered with how to
# decide, and nothing else done (it superseded every waiting card as a message).
ASK = "ask:"
SEVERAL, RISK, GONE, QUOTE = nudges.SEVERAL, nudges.RISK, nudges.GONE, nudges.QUOTE
MAX_BODY = 1024 * 1024
# Run ids derive from the inbox message id (design note 5); WhatsApp's own message id
# makes that id stable across Meta's redeliveries too.
_NS = uuid.UUID("5f0e1d52-8c35-4d7e-9a53-0d3f3a1c9b11")


class ChannelRows(OutboundRows, Protocol):
    async def claim_delivery(
        self, channel: str, message_id: str, lease_seconds: float
    ) -> DeliveryClaim: ...
    async def delivery_effect(
        self, channel: str, message_id: str, claim: DeliveryClaim, effect: str
    ) -> bool: ...
    async def delivery_handled(
        self, channel: str, message_id: str, claim: DeliveryClaim
    ) -> None: ...
    async def delivery_held(self, channel: str, message_id: str, claim: DeliveryClaim) -> bool: ...
    async def forget_delivery(
        self, channel: str, message_id: str, claim: DeliveryClaim
    ) -> None: ...
    async def contact_thread(self, tenant: str, wa_id: str) -> str | None: ...
    async def card_shown(
        self, thread_id: str, card_id: str, before: int, *, quoted: bool = False
    ) -> bool: ...
    async def quoted_card(self, thread_id: str, wa_message: str) -> str | None: ...
    async def wrote_text(self, tenant: str, wa_id: str, sent: int) -> None: ...
    async def written_since(self, thread_id: str, card_id: str, before: int) -> bool: ...
    async def wrote_on_thread(self, thread_id: str) -> None: ...
    async def add_contact(self, tenant: str, wa_id: str, thread_id: str) -> str | None: ...
    async def touch_inbound(self, tenant: str, wa_id: str) -> None: ...
    async def in_window(self, tenant: str, wa_id: str, window_seconds: float) -> bool: ...
    async def claim_reply(
        self, key: str, tenant: str, wa_id: str, kind: str, claimer: str, lease: float
    ) -> bool: ...
    async def refuse(
        self, card_id: str, actor: str, channel: str, reason: str, detail: dict[str, Any]
    ) -> None: ...


class WhatsAppChannel:
    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        rows: ChannelRows,
        bus: Bus,
        decisions: Decisions,
        sender: GraphSender | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.rows = rows
        self.bus = bus
        self.decisions = decisions
        # The web's per-user turn quota applies to a number's messages too: each one
        # is a model turn paid for, whatever channel it came through.
        self.quotas = quotas or Quotas(store=store, ledger=MemoryLedger(), keys=Keys())
        self.tenant = settings.tenant
        self.sender = sender or GraphSender(
            base_url=settings.whatsapp_base_url,
            api_version=settings.whatsapp_api_version,
            phone_number_id=settings.whatsapp_phone_number_id,
            token=settings.whatsapp_token,
            attempts=settings.whatsapp_send_attempts,
            hold_every=settings.whatsapp_claim_lease_seconds / 3,
        )
        self.claimer = f"gateway-{settings.worker_id}"
        self.courier = Courier(rows, self.sender, settings, self.claimer)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/whatsapp/webhook", self.verify, methods=["GET"]),
            Route("/v1/whatsapp/webhook", self.receive, methods=["POST"]),
        ]

    async def verify(self, request: Request) -> Response:
        q = request.query_params
        if q.get("hub.mode") == "subscribe" and signature.verify_token_matches(
            q.get("hub.verify_token"), self.settings.whatsapp_verify_token
        ):
            return PlainTextResponse(q.get("hub.challenge", ""))
        return error_response(Forbidden("the webhook's verify token or mode does not match"))

    async def receive(self, request: Request) -> Response:
        size = request.headers.get("content-length")
        if size is not None and size.isascii() and size.isdigit() and int(size) > MAX_BODY:
            return error_response(InvalidInput("body too large"))
        # Read with a running cap: a chunked body has no Content-Length, and the signature
        # can only be checked once the body is in, so anyone could make this gateway hold
        # tens of MB per request before its 401.
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BODY:
                return error_response(InvalidInput("body too large"))
        raw = bytes(data)
        try:
            signature.verify(
                raw, request.headers.get("x-hub-signature-256"), self.settings.whatsapp_app_secret
            )
            try:
                payload = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                # Half a surrogate pair in a person's text (no UTF-8 for it) fails the whole
                # delivery, which Meta would redeliver for days: the character is replaced,
                # as inbound.clean_text does, and the rest is read. (The signature was
                # checked on the bytes as they came.)
                if not LONE_SURROGATE.search(raw):
                    raise
                payload = msgspec.json.decode(LONE_SURROGATE.sub(rb"\\ufffd", raw))
            items = inbound.messages(payload, self.settings.whatsapp_phone_number_id)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            return error_response(InvalidInput("invalid JSON"))
        except SignoffError as exc:
            return error_response(exc)
        refused: SignoffError | None = None
        failed = False
        lease = self.settings.whatsapp_delivery_lease_seconds
        try:
            await self._mark_texts(items)
        except SignoffError as exc:
            return error_response(exc)
        for item in items:
            # Claimed for a lease, marked handled once its effect committed (design note
            # 64): a gateway killed while handling it leaves a claim that lapses, and a
            # redelivery after that handles it (a decision or a message is applied once
            # however often it is handled: a card is decided once, a message's run id is
            # its WhatsApp id's).
            claim = await self._claim(item.message_id, lease)
            if claim.state == "handled":
                continue  # seen before: by this gateway, another one, or days ago
            if claim.state == "busy":  # being handled elsewhere (or by a gateway that died)
                refused = refused or Unavailable(
                    "a message of this delivery is being handled by another request; "
                    "send it again later",
                    retry_after=lease,
                )
                continue
            try:
                await self.handle(item, claim)
            except (RateLimited, Unavailable, UnknownTool) as exc:
                # Over the sender's turn quota, the inbox unreachable, or a card of a tool
                # this version does not serve (a rolling deploy): not taken, not counted as
                # seen. Meta redelivers a delivery answered non-200 (for days), so nothing
                # the person did is lost and no model turn is paid for now.
                await self.rows.forget_delivery(CHANNEL, item.message_id, claim)
                log.info(
                    "WhatsApp message %s from %s not taken: %s", item.message_id, item.wa_id, exc
                )
                refused = exc
            except Exception:
                # Not handled: let go, so Meta's redelivery gets another chance. The
                # other messages of the delivery are still handled: one that fails every
                # time must not take the ones after it down with it.
                await self.rows.forget_delivery(CHANNEL, item.message_id, claim)
                log.exception("WhatsApp message %s from %s failed", item.message_id, item.wa_id)
                failed = True
            else:
                try:
                    await self.rows.delivery_handled(CHANNEL, item.message_id, claim)
                except SignoffError as exc:  # handled all the same: a redelivery after the
                    # lease handles it again, which changes nothing (see above)
                    log.warning(
                        "WhatsApp message %s: not marked handled (%s)", item.message_id, exc
                    )
        if failed:
            return error_response(Internal("a message of this delivery could not be handled"))
        if refused is not None:
            return error_response(refused)
        return json_response({"ok": True})

    async def _claim(self, message_id: str, lease: float) -> DeliveryClaim:
        """The delivery's claim; a claim another request holds is waited for a little
        (Meta sends a message twice at once now and then: the second is answered 200 once
        the first is handled, not 503 and sent again)."""
        deadline = time.monotonic() + BUSY_WAIT_SECONDS
        while True:
            claim = await self.rows.claim_delivery(CHANNEL, message_id, lease)
            if claim.state != "busy" or time.monotonic() >= deadline:
                return claim
            await asyncio.sleep(BUSY_POLL_SECONDS)

    async def _mark_texts(self, items: list[inbound.Inbound]) -> None:
        """Under text confirmation, each text of the delivery that is not a bare yes is
        marked before any of them is handled: a "sim" is not about a card shown before
        a text written before it, even one after it in the same delivery (a review: Meta
        batched "sim" (t+1) ahead of "não, cancela A002" (t), and A001 ran)."""
        if not self.settings.whatsapp_text_confirm:
            return
        for item in items:
            if item.text is not None and item.sent is not None and not policy.is_yes(item.text):
                await self.rows.wrote_text(self.tenant, item.wa_id, item.sent)

    async def handle(self, item: inbound.Inbound, claim: DeliveryClaim) -> None:
        """``claim``: this request's claim on the message, with what an earlier handling
        of it chose to do, if any (design notes 64 and 66)."""
        if item.button_id is not None:
            await self.button(item, claim)
        elif item.text is not None:
            await self.text(item, claim)
        elif item.nudge is not None:
            await nudges.answer(self, item)

    async def thread_of(self, wa_id: str) -> str:
        """The number's thread in this tenant, made on its first message."""
        found = await self.rows.contact_thread(self.tenant, wa_id)
        if found is not None:
            return found
        thread = await self.store.create_thread(self.tenant, wa_id)
        bound = await self.rows.add_contact(self.tenant, wa_id, thread.id)
        if bound is None:  # another gateway bound the number first
            await self.store.delete_empty_thread(thread.id)
            again = await self.rows.contact_thread(self.tenant, wa_id)
            assert again is not None
            return again
        # The number's thread is committed: a chat page of the same person (tenant,
        # wa_id) re-lists, as for a thread made over HTTP. Never fails the delivery.
        await announce_thread(self.bus, self.quotas.keys, self.tenant, wa_id)
        return bound

    async def text(self, item: inbound.Inbound, claim: DeliveryClaim) -> None:
        assert item.text is not None
        confirming = self.settings.whatsapp_text_confirm  # the text was marked (_mark_texts)
        thread_id = await self.thread_of(item.wa_id)
        await self.rows.touch_inbound(self.tenant, item.wa_id)
        if confirming or claim.effect is not None:
            # Approve a card, answer, or pass the text on: chosen once and written before
            # it is done, so a redelivery after a lapsed claim does the same (a "sim" whose
            # card was approved meanwhile became a message superseding the person's next
            # card: a hostile probe), even with text confirmation turned off since.
            effect = claim.effect
            if effect is None:
                effect = await self._confirms(item, thread_id)
                await self._chose(item, claim, effect)
            if effect.startswith(CONFIRM):
                await self._confirm(item, effect.removeprefix(CONFIRM), claim)
                return
            if effect.startswith(ASK):
                await nudges.ask(self, item, effect.removeprefix(ASK))
                return
            if effect != MESSAGE:  # chosen by a later version: done, as far as we know
                log.warning("WhatsApp message %s: unknown effect %r", item.message_id, effect)
                return
            if item.sent is not None:  # a "sim" after this text is about what follows it
                await self.rows.wrote_text(self.tenant, item.wa_id, item.sent)
        text = item.text.strip()[:8000]
        message_id = str(uuid.uuid5(_NS, item.message_id))
        who = Principal(tenant=self.tenant, user=item.wa_id)
        async with self.quotas.turn(who, message_id):  # RateLimited here enqueues nothing
            await self.bus.enqueue(
                Job(
                    thread_id=thread_id,
                    text=text,
                    user=item.wa_id,
                    tenant=self.tenant,
                    channel=CHANNEL,
                    message_id=message_id,
                )
            )

    async def _confirms(self, item: inbound.Inbound, thread_id: str) -> str:
        """``confirm:<card id>`` if the text approves a card, ``ask:<why>`` if it only says
        yes about a card the person had seen but cannot approve it (two cards were
        waiting; the card's risk needs its button; the card it quotes waits no more),
        else ``message``. Seen: sent to this number before it wrote (Meta's timestamp);
        an "ok" written before any card reached WhatsApp (or while its sending failed)
        is about something else, and is a message like any other."""
        assert item.text is not None
        if not policy.is_yes(item.text) or item.sent is None:
            return MESSAGE
        sent = item.sent
        # A swipe reply quoting a card is about that card only (quoting one a correction
        # replaced, it approved the newer card: a hostile probe), even beside others; a
        # quote of anything else (a notice, a text) approves nothing.
        quoted = None
        if item.quoted is not None:
            quoted = await self.rows.quoted_card(thread_id, item.quoted)
        pending = [
            c for c in await self.store.pending_cards(thread_id) if c.status is Status.PENDING
        ]
        if quoted is not None and all(c.id != quoted for c in pending):
            return ASK + GONE + quoted
        waiting = [
            c for c in pending if c.owner == item.wa_id and (quoted is None or c.id == quoted)
        ]
        seen = [
            c for c in waiting if await self.rows.card_shown(thread_id, c.id, sent, quoted=True)
        ]
        if quoted is None and item.quoted is not None:
            # A "sim" quoting our notice ("use the card's buttons, or reply quoting it")
            # or a text, under a card seen and waiting: told again, nothing replaced (a
            # review: as a message it replaced the cards the notice protected).
            return ASK + QUOTE if seen else MESSAGE
        if quoted is None:
            # Not a card shown before a text the number wrote since (passed on as a
            # message, still waiting for a worker to supersede that card): a "sim" after
            # "charge João 3000" approved the card shown before it (a hostile probe).
            seen = [c for c in seen if not await self.rows.written_since(thread_id, c.id, sent)]
        if not seen:
            return MESSAGE
        card = seen[0]
        # Unquoted, the one card waiting, and no other card sent by then was still
        # waiting at that second (a "sim" written under two cards chose neither,
        # whichever is left when it is handled: a hostile probe).
        if len(waiting) > 1 or not await self.rows.card_shown(
            thread_id, card.id, sent, quoted=quoted is not None
        ):
            return ASK + SEVERAL
        if not policy.allowed(card, self.settings.whatsapp_text_confirm_max_risk):
            return ASK + RISK + ":" + card.id
        if quoted is None:
            # A text the person wrote before this "sim" may reach us after it (Meta does
            # not promise order: a hostile probe's "não, cancela A002" came second and
            # the "sim" approved A001). Given a moment to arrive, it is looked for again.
            await asyncio.sleep(self.settings.whatsapp_text_confirm_settle_seconds)
            if await self.rows.written_since(thread_id, card.id, sent):
                return MESSAGE
        return CONFIRM + card.id

    async def _confirm(self, item: inbound.Inbound, card_id: str, claim: DeliveryClaim) -> None:
        try:
            card = await self.store.get_card(card_id)
        except CardNotFound:  # gone since (retention)
            log.info("WhatsApp confirmation for unknown card %s ignored", card_id)
            return
        await self.decide(item, card, Decision.APPROVE, claim)

    async def _chose(self, item: inbound.Inbound, claim: DeliveryClaim, effect: str) -> None:
        """Write what this handling chose, before doing it; only while this request still
        holds the claim: a handling slow past its lease, whose message another request
        re-claimed and handled meanwhile, chose after that one had acted (and differently:
        its card approved, a "sim" became a message too). It stops here (design note 66)."""
        if not await self.rows.delivery_effect(CHANNEL, item.message_id, claim, effect):
            raise Unavailable(
                "this message was taken over by another request (its claim lapsed)",
                retry_after=1.0,
            )

    async def button(self, item: inbound.Inbound, claim: DeliveryClaim) -> None:
        assert item.button_id is not None
        parsed = inbound.parse_button(item.button_id)
        if parsed is None:
            log.info("unknown WhatsApp button id %r from %s ignored", item.button_id, item.wa_id)
            return
        decision, card_id = parsed
        try:
            card = await self.store.get_card(card_id)
        except (CardNotFound, InvalidInput):
            card = None
        if card is None or card.tenant != self.tenant:  # another tenant's: not there for us
            log.info("WhatsApp button for unknown card %s ignored", card_id)
            return
        if await self.rows.contact_thread(self.tenant, item.wa_id) is not None:
            await self.rows.touch_inbound(self.tenant, item.wa_id)
        # A press handled again (its answer lost, a claim that lapsed) finds its own
        # decision made: it says nothing then ("already approved" to a person who pressed
        # once). Marked on the claim before deciding, as a text's choice is.
        if claim.effect is None:
            await self._chose(item, claim, PRESS)
        await self.decide(item, card, decision, claim)

    async def decide(
        self, item: inbound.Inbound, card: Card, decision: Decision, claim: DeliveryClaim
    ) -> None:
        """``claim``: this request's, with the effect an earlier handling chose if any."""
        res = Resolution(decision=decision, snapshot_hash=card.snapshot_hash)
        try:
            await self.decisions.resolve(
                card.id, res, principal=item.wa_id, channel=CHANNEL, tenant=self.tenant
            )
        except NotOwner:
            # Refused and kept (card_refusals, not card_events: no transition happened).
            log.warning(
                "WhatsApp %s tried to %s card %s it does not own", item.wa_id, decision, card.id
            )
            await self.rows.refuse(
                card.id,
                item.wa_id,
                CHANNEL,
                "not_owner",
                {"decision": str(decision), "message_id": item.message_id},
            )
        except CardNotFound:  # gone since it was read (retention): as an unknown card
            log.info("WhatsApp button for unknown card %s ignored", card.id)
        except (AlreadyDecided, Expired, StaleCard):
            if card.owner != item.wa_id:  # another number: refused, and told nothing
                await self.rows.refuse(
                    card.id,
                    item.wa_id,
                    CHANNEL,
                    "not_owner",
                    {"decision": str(decision), "message_id": item.message_id},
                )
                return
            fresh = await self.store.get_card(card.id)
            if fresh.decided_by == item.wa_id and policy.decided_as(fresh.status, decision):
                # Most likely this message's own decision: handled again (an earlier
                # handling chose), or by the request that took this one's claim over
                # while it was held up (a review: it told a person who pressed once
                # "already approved"). Nothing to tell.
                if claim.effect is not None or not await self.rows.delivery_held(
                    CHANNEL, item.message_id, claim
                ):
                    return
            await self.reply(item, outbound.decided_notice(fresh.public()))

    async def reply(
        self, item: inbound.Inbound, body: str, card: dict[str, Any] | None = None
    ) -> None:
        """A direct answer to one inbound message, claimed once (keyed by its id). With
        ``card`` (public), the card itself with its buttons when the window is open."""
        key = f"reply:{item.message_id}"
        lease = self.settings.whatsapp_claim_lease_seconds
        if not await self.rows.claim_reply(
            key, self.tenant, item.wa_id, "notice", self.claimer, lease
        ):
            return
        if await self.rows.in_window(
            self.tenant, item.wa_id, self.settings.whatsapp_window_seconds
        ):
            payload = (
                outbound.text(item.wa_id, body)
                if card is None
                else outbound.interactive_card(item.wa_id, card)
            )
        else:
            s = self.settings
            payload = outbound.template(
                item.wa_id, s.whatsapp_template_name, s.whatsapp_template_language, body
            )
        await self.courier.finish(
            key, await self.sender.send(payload, still_ours=self.courier.holds(key))
        )
