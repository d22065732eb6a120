"""What the gateway does for an authenticated principal, shared by HTTP and WebSocket."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec

from signoff.gateway import idempotency
from signoff.gateway.auth import Principal
from signoff.gateway.overload import Admission
from signoff.gateway.quotas import MemoryLedger, Quotas
from signoff.gateway.views import Views
from signoff.runtime.bus import Bus, Job
from signoff.runtime.canonical import MAX_JSON_INT, run_id_of
from signoff.runtime.cards import Decision
from signoff.runtime.decisions import Decisions, Outcome, Resolution
from signoff.runtime.errors import (
    CardNotFound,
    Conflict,
    Forbidden,
    InvalidInput,
    MaybeQueued,
    NotFound,
    NotOwner,
    RateLimited,
    SignoffError,
    Unavailable,
    WorkflowThread,
)
from signoff.runtime.keys import Keys
from signoff.runtime.notify import quietly
from signoff.runtime.records import Entry, Thread
from signoff.runtime.store import Store
from signoff.runtime.workflows.agent_step import workflow_of_thread

log = logging.getLogger("signoff.gateway")

MAX_TEXT = 8000
NEW_THREAD = b'{"seq":0}'  # the hint on a person's channel: their thread list changed


async def announce_thread(bus: Bus, keys: Keys, tenant: str, user: str) -> bool:
    """After a new thread of ``user`` is committed (HTTP, WebSocket or a channel such as
    WhatsApp): sockets watching their thread list (gateway/watch.py) re-list. Never raises
    (a lost hint only delays the list, which is read from Postgres); True if it went."""
    return await quietly(
        bus.publish(keys.user_channel(tenant, user), NEW_THREAD), "thread list hint"
    )


class MessageIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    text: str
    # The client's name for this message: sent again with the same key (after a 503, a
    # dropped connection) it runs at most once.
    idempotency_key: str | None = None


class ResolveIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    decision: Decision
    snapshot_hash: str
    reason: str | None = None
    edits: dict[str, Any] | None = None


class BatchItem(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    card_id: str
    decision: Decision
    snapshot_hash: str
    reason: str | None = None


class BatchIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    decisions: list[BatchItem]


def event_of(entry: Entry) -> dict[str, Any]:
    """A log entry as a client sees it (WS ``event`` and HTTP event lists)."""
    return {
        "thread_id": entry.thread_id,
        "seq": entry.seq,
        "kind": entry.kind,
        "run_id": entry.run_id,
        "data": entry.body,
        "at": entry.created_at.isoformat(),
    }


def checked_message(text: str, key: str | None) -> str:
    """A message's text as it will be stored, its key checked: refused (I9) before a
    thread is made or followed for it (a hostile probe: a bad key's refusal made a
    thread, announced it to the person's other sockets, and subscribed this one)."""
    idempotency.check_key(key)
    return message_text(text)


def message_text(text: str) -> str:
    """A chat message as it will be stored, or the refusal (before anything is stored)."""
    text = text.strip()
    if not text:
        raise InvalidInput("message text is empty")
    if "\x00" in text:  # Postgres text cannot hold it: refuse here, not in the worker
        raise InvalidInput("message text contains a NUL character")
    if len(text) > MAX_TEXT:
        raise InvalidInput(f"message longer than {MAX_TEXT} characters")
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON): no UTF-8 for it
        raise InvalidInput("message text is not valid Unicode (a lone surrogate)") from None
    return text


def parse(data: bytes | dict[str, Any], typ: type[Any]) -> Any:
    """Decode and validate a payload; any mismatch is a 422 that changes nothing.

    A NUL character anywhere in it (a reason, an edited value, a workflow's input, a key)
    is refused here, by name: Postgres stores no NUL in text or jsonb, and the driver's
    refusal, further on, would tell the client about query arguments and encodings."""
    try:
        if isinstance(data, bytes | bytearray):
            out = msgspec.json.decode(data, type=typ)
            # In JSON a NUL can only be written escaped; look closer only then.
            if b"\\u0000" in data and _has_nul(msgspec.json.decode(data)):
                raise InvalidInput(NUL_REFUSED)
            one_value_per_name(data)
            return out
        if _has_nul(data):
            raise InvalidInput(NUL_REFUSED)
        return msgspec.convert(data, typ)
    except msgspec.DecodeError as exc:
        if isinstance(data, bytes | bytearray) and LONE_SURROGATE.search(data):
            # msgspec says "Input data was truncated" for these
            raise InvalidInput("invalid payload: not valid Unicode (a lone surrogate)") from exc
        raise InvalidInput(f"invalid payload: {exc}") from exc
    except msgspec.ValidationError as exc:
        raise InvalidInput(f"invalid payload: {exc}") from exc
    except UnicodeDecodeError as exc:  # msgspec's decoder on bytes that are not UTF-8
        raise InvalidInput("invalid payload: not UTF-8") from exc
    except RecursionError as exc:  # msgspec's decoder on deeply nested JSON
        raise InvalidInput("invalid payload: nested too deeply") from exc


def _no_repeated_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # linear: a 64 KiB object of keys must not stall the loop
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise InvalidInput(f"invalid payload: {name!r} appears twice in one object")
            seen.add(name)
    return out


def _exact_int(text: str) -> int:
    value = int(text)
    if len(text) > 15 and abs(value) > MAX_JSON_INT:
        raise InvalidInput(
            f"invalid payload: the integer {text[:24]}{'...' if len(text) > 24 else ''} is out "
            f"of range (integers here lie within -{MAX_JSON_INT} and {MAX_JSON_INT})"
        )
    return value


def one_value_per_name(data: bytes | bytearray | str) -> None:
    """Refuse an object naming a member twice (``{"decision": "reject", "decision":
    "approve"}``): the decoder keeps the last value, a proxy or an audit log in front of
    us may read the first, and a decision must mean one thing to everyone who reads it.
    Refuse too an integer beyond 2**53 - 1 in magnitude: a browser, a JavaScript client or
    an audit tool reading it as a double would see another number than the one stored
    (and a workflow's ``int`` field would store 10**40 as given).
    Checked after the payload decoded (a few microseconds on a frame)."""
    try:
        json.loads(data, object_pairs_hook=_no_repeated_names, parse_int=_exact_int)
    except (ValueError, RecursionError) as exc:  # (InvalidInput is not a ValueError)
        raise InvalidInput(f"invalid payload: {exc}") from exc


# A JSON escape of half a surrogate pair without its other half (no UTF-8 for it).
LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
NUL_REFUSED = "invalid payload: text may not contain NUL characters (\\u0000)"


def _has_nul(value: Any) -> bool:
    """Whether a NUL character is in any string (key or value) of a decoded payload."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


class GatewayService:
    def __init__(
        self,
        *,
        store: Store,
        bus: Bus,
        decisions: Decisions,
        quotas: Quotas | None = None,
        admission: Admission | None = None,
        hint: str | Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.decisions = decisions
        self.hint = hint  # the app's example request, for the ready frame
        # Writes in flight on this gateway (gateway/overload.py); none given: no limit.
        self.admission = admission or Admission(0)
        # No quotas given: none enforced (tests that drive the service directly).
        self.quotas = quotas or Quotas(store=store, ledger=MemoryLedger(), keys=Keys())
        self.views = Views(getattr(decisions, "tools", None))
        # Told of each message queued (its thread), before it is queued: the WhatsApp
        # channel's text confirmation (a "sim" after a request typed on the chat page is
        # not about the card shown before it).
        self.message_hooks: list[Callable[[str], Awaitable[None]]] = []

    async def own_thread(self, thread_id: str, who: Principal) -> Thread:
        thread = await self.store.get_thread(thread_id)
        if thread.tenant != who.tenant:  # another tenant's thread does not exist for us
            raise NotFound(f"thread {thread_id} not found", thread_id=thread_id)
        if thread.owner != who.user:
            raise Forbidden("not your thread", thread_id=thread_id)
        return thread

    async def create_thread(self, who: Principal) -> Thread:
        thread = await self.quotas.create_thread(who)
        # After the commit, never failing the request.
        await announce_thread(self.bus, self.quotas.keys, who.tenant, who.user)
        return thread

    async def thread_for(self, who: Principal, text: str, key: str | None) -> tuple[Thread, bool]:
        """The thread a message naming none goes to, and whether it was made now. With a
        key, the thread is the key's (:func:`thread_id_for`): a second send finds the one
        its first send made (design note 54), even as both race."""
        if key is None:
            return await self.create_thread(who), True
        first = idempotency.thread_id_for(who, key, message_text(text))
        thread_id = await idempotency.current(first, self.store.thread_age)
        if thread_id is None:  # a key used on over MAX_GENERATIONS days
            return await self.create_thread(who), True
        for _ in range(2):
            try:
                thread = await self.store.get_thread(thread_id)
            except NotFound:
                try:
                    made = await self.quotas.create_thread(who, thread_id)
                except (Conflict, RateLimited) as refused:
                    # The same key's other send made it just now (at the quota's edge,
                    # this send's own insert is refused as one too many): look again.
                    if isinstance(refused, RateLimited) and (
                        await self.store.thread_age(thread_id) is None
                    ):
                        raise
                    continue
                await announce_thread(self.bus, self.quotas.keys, who.tenant, who.user)
                return made, True
            if (thread.tenant, thread.owner) != (who.tenant, who.user):
                break  # not a thread of this person's (a uuid5 collision: never seen)
            return thread, False
        raise Conflict(
            "this message's thread could not be made; send it again", thread_id=thread_id
        )

    async def _run_age(self, message_id: str) -> float | None:
        return await self.store.run_age(run_id_of(message_id))

    async def list_threads(self, who: Principal, limit: int = 50) -> list[dict[str, Any]]:
        """The person's threads, the most recently active first (an empty one too)."""
        if not 1 <= limit <= 200:
            raise InvalidInput("limit must be a whole number from 1 to 200")
        found = await self.store.list_threads(who.tenant, who.user, limit)
        return [msgspec.to_builtins(t) for t in found]

    async def discard_thread(self, thread_id: str) -> None:
        """Undo a thread created for a message that was then refused (its subscription or
        its enqueue failed): delete it while it is still empty. Best effort: the refusal
        stands either way, and a thread the worker already started on is kept."""
        try:
            await self.store.delete_empty_thread(thread_id)
        except (SignoffError, OSError) as exc:
            log.warning("could not discard the empty thread %s: %s", thread_id, exc)

    async def post_message(
        self, thread_id: str, text: str, who: Principal, channel: str, key: str | None = None
    ) -> str:
        """Queue a message for the thread's next run; its delivery id. ``key``: the
        client's idempotency key (the same key and text on the same thread: the same
        message)."""
        text = message_text(text)
        idempotency.check_key(key)
        thread_id = (await self.own_thread(thread_id, who)).id  # the id as Postgres spells it
        run_id = workflow_of_thread(thread_id)
        if run_id is not None:
            # A message there would supersede the step's run and its pending cards, and
            # the workflow would fail at its next resume (hostile probe).
            raise WorkflowThread(
                f"this thread belongs to workflow run {run_id}'s agent steps: decide its "
                "cards here or at the workflow's gate; it takes no messages",
                thread_id=thread_id,
            )
        message_id = str(uuid.uuid4())
        keyed = None
        if key is not None:  # the key's message, or the next of its generations
            first = str(idempotency.message_id_for(who, thread_id, key, text))
            keyed = await idempotency.current(first, self._run_age)
            message_id = keyed or message_id
        async with self.quotas.turn(who, message_id):  # 429 here enqueues nothing
            # Not for a message sent again under its key after it ran (a review: a card
            # it made, shown since, counted as written before by the resend).
            if self.message_hooks and (keyed is None or await self._run_age(keyed) is None):
                for hook in self.message_hooks:
                    await hook(thread_id)
            job = Job(
                thread_id=thread_id,
                text=text,
                user=who.user,
                tenant=who.tenant,
                role=who.role,
                channel=channel,
                message_id=message_id,
            )
            try:
                return await self.bus.enqueue(job)
            except Unavailable as exc:
                if not exc.maybe_applied:
                    raise  # refused, or never sent: not queued, as before
                # No answer is not "not queued" (an integrity probe: a reply held past the
                # timeout, the message stored and run, the client told 503 and sending it
                # again). Said so, with the thread; the error's own text (hosts) is logged.
                log.warning("message on thread %s: enqueue unanswered: %s", thread_id, exc)
                again = (
                    "send it again with the same idempotency_key and it runs at most once, "
                    "or read the thread to see"
                    if key is not None
                    else "read the thread before sending it again (sent with an "
                    "idempotency_key, a message can be sent again safely)"
                )
                raise MaybeQueued(
                    "the message may or may not have been queued (the queue did not answer): "
                    + again,
                    thread_id=thread_id,
                    idempotency_key=key,
                ) from None

    async def thread_state(self, thread_id: str, who: Principal) -> dict[str, Any]:
        thread = await self.own_thread(thread_id, who)
        pending = await self.store.pending_cards(thread.id)
        run = await self.store.active_run(thread.id)
        return {
            "thread": msgspec.to_builtins(thread),
            "last_seq": thread.last_seq,
            "pending_cards": [c.public() for c in pending],
            "run": None if run is None else {"id": run.id, "status": str(run.status)},
        }

    async def events(
        self, thread_id: str, after_seq: int, who: Principal, limit: int = 500
    ) -> list[dict[str, Any]]:
        await self.own_thread(thread_id, who)
        entries = await self.store.entries_after(thread_id, after_seq, limit)
        return [self.views.event(event_of(e)) for e in entries]

    async def get_card(self, card_id: str, who: Principal) -> dict[str, Any]:
        card = await self.store.get_card(card_id)
        if card.tenant != who.tenant:  # another tenant's card does not exist for us
            raise CardNotFound(f"card {card_id} not found", card_id=card_id)
        if card.owner != who.user:
            raise NotOwner("not your card", card_id=card_id)
        return card.public()

    async def card_audit(self, card_id: str, who: Principal) -> list[dict[str, Any]]:
        """The card's audit as its owner reads it: what an operator alone should read (a
        tool's exception text, why a call was flagged, which may name internal hosts or
        tables) is left out; `signoff cards show` has it all."""
        await self.get_card(card_id, who)
        return [_for_owner(msgspec.to_builtins(e)) for e in await self.store.card_events(card_id)]

    async def resolve(self, card_id: str, body: ResolveIn, who: Principal, channel: str) -> Outcome:
        res = Resolution(
            decision=body.decision,
            snapshot_hash=body.snapshot_hash,
            reason=body.reason,
            edits=body.edits,
        )
        return await self.decisions.resolve(
            card_id, res, principal=who.user, channel=channel, tenant=who.tenant
        )

    async def batch(
        self, run_id: str, body: BatchIn, who: Principal, channel: str
    ) -> list[dict[str, Any]]:
        if not body.decisions:
            raise InvalidInput("no decisions given")
        if len(body.decisions) > 100:
            raise InvalidInput("at most 100 decisions per batch")
        if any(d.decision is Decision.EDIT for d in body.decisions):
            raise InvalidInput("edits are not accepted in a batch")
        items = [
            (
                d.card_id,
                Resolution(decision=d.decision, snapshot_hash=d.snapshot_hash, reason=d.reason),
            )
            for d in body.decisions
        ]
        return await self.decisions.resolve_batch(
            run_id, items, principal=who.user, channel=channel, tenant=who.tenant
        )


def _for_owner(event: dict[str, Any]) -> dict[str, Any]:
    detail = event.get("detail")
    if isinstance(detail, dict) and ("error" in detail or detail.get("needs_reconciliation")):
        kept = {k: v for k, v in detail.items() if k != "error"}
        if kept.get("needs_reconciliation"):
            kept.pop("reason", None)
        event = {**event, "detail": kept}
    return event
