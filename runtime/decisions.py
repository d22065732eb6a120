"""The decision path, as the gateway calls it: approve, reject, edit, batch.

Write to Postgres first (one conditional update with its audit row), then
publish to the worker holding the run (I6). Every refusal is a typed error
raised before anything changes (I9).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import msgspec

from signoff.runtime.bus import Bus
from signoff.runtime.canonical import canonical_json
from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.errors import (
    AlreadyDecided,
    CardNotFound,
    Expired,
    Forbidden,
    InvalidInput,
    NotFound,
    NotOwner,
    SignoffError,
    ToolValidationError,
    UnknownTool,
)
from signoff.runtime.faults import Faults
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS, decided
from signoff.runtime.notify import Notifier
from signoff.runtime.policy import Policy, Verdict
from signoff.runtime.proposal import new_card
from signoff.runtime.records import Entry, NewCard
from signoff.runtime.store import Store
from signoff.runtime.telemetry import span, traceparent
from signoff.runtime.text import some_names
from signoff.runtime.tools import Registry, ToolContext, label_text

log = logging.getLogger("signoff.decisions")


MAX_REASON = 2000
# A decision is committed before its hints (the worker's signal, the wait token's delete,
# the thread's hint) are sent; the caller is answered after them. Whatever Redis does
# (one server that stalls fails fast, bus/client.py; a cluster retries ~6 s per command),
# the answer waits at most this long for them: the worker's poll finds the decision.
HINTS_BUDGET_SECONDS = 5.0


class Resolution(msgspec.Struct, frozen=True, kw_only=True):
    """A person's decision as it arrives (HTTP body, WS message, channel button)."""

    decision: Decision
    snapshot_hash: str
    reason: str | None = None
    edits: dict[str, Any] | None = None


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    card: dict[str, Any]
    new_card: dict[str, Any] | None = None


class Decisions:
    def __init__(
        self,
        *,
        store: Store,
        bus: Bus,
        tools: Registry,
        policy: Policy,
        keys: Keys,
        services: Any = None,
        faults: Faults | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.tools = tools
        self.policy = policy
        self.keys = keys
        self.services = services
        self.faults = faults or Faults()
        self.notify = Notifier(bus, keys, store)

    async def resolve(
        self,
        card_id: str,
        res: Resolution,
        *,
        principal: str,
        channel: str,
        tenant: str | None = None,
        hints: list[Coroutine[Any, Any, None]] | None = None,
    ) -> Outcome:
        """``tenant``: the principal's (I3: the same user name in another tenant is not the owner).
        ``hints``: the decision's hints (the worker's signal, the thread's) are put there
        for the caller to send once its other decisions are committed, instead of sent
        now (a batch, a decision map: its approvals run in one continuation).

        Counted in ``signoff_decisions_total{channel,outcome}``, timed as the ``resolve``
        span (traced when configured: the trace goes on to the worker in the signal)."""
        received = time.time_ns()
        with span("resolve", card_id=card_id, channel=channel):
            try:
                outcome = await self._resolve(
                    card_id, res, principal, channel, tenant, received, hints
                )
            except SignoffError as exc:
                decided(channel, exc.code)
                raise
        decided(channel, str(res.decision))
        card = outcome.card
        log.info(
            "card decided",
            extra={
                "card_id": card_id,
                "run_id": card.get("run_id"),
                "thread_id": card.get("thread_id"),
                "decision": str(res.decision),
                "channel": channel,
                "user": principal,
            },
        )
        return outcome

    async def _resolve(
        self,
        card_id: str,
        res: Resolution,
        principal: str,
        channel: str,
        tenant: str | None,
        received: int,
        hints: list[Coroutine[Any, Any, None]] | None = None,
    ) -> Outcome:
        if res.reason is not None and len(res.reason) > MAX_REASON:
            raise InvalidInput(f"reason longer than {MAX_REASON} characters")
        if res.decision is Decision.EDIT:
            old, new = await self._edit(
                card_id, res, principal=principal, channel=channel, tenant=tenant
            )
            edited = self._notify(old, received)
            if hints is None:
                await edited
            else:
                hints.append(edited)
            return Outcome(card=old.public(), new_card=new.public())
        if res.edits is not None:
            raise InvalidInput("edits are only accepted with decision 'edit'")
        # The decision's statement also names the worker holding the card's run: the
        # signal goes there first (Notifier.card falls back to the wait token). An approval
        # is refused (UnknownTool) for a card of a tool this app does not serve: another
        # version of the app proposed it. A rejection needs no tool: a person can always
        # say no.
        known = [t.name for t in self.tools] if res.decision is Decision.APPROVE else None
        moved = await self.store.decide(
            card_id,
            tools=known,
            principal=principal,
            decision=res.decision,
            snapshot_hash=res.snapshot_hash,
            channel=channel,
            reason=res.reason,
            tenant=tenant,
        )
        hint = self._notify(moved.card, received, moved.holder, moved.entry)
        if hints is None:
            await hint
        else:
            hints.append(hint)
        return Outcome(card=moved.card.public())

    async def _notify(
        self,
        card: Card,
        received: int,
        holder: str | None = None,
        entry: Entry | None = None,
    ) -> None:
        """Tell the worker, after the commit. The decision is taken either way: a publish
        that fails (Redis down) costs latency, the worker's poll finds it in Postgres (I6);
        the notifier never raises."""
        self.faults.hit("decide.before_publish")
        try:
            async with asyncio.timeout(HINTS_BUDGET_SECONDS):
                await self.notify.card(
                    card, at_ns=received, holder=holder, entry=entry, trace=traceparent()
                )
        except TimeoutError:
            COUNTERS.inc("signoff_hints_failed_total")
            log.warning(
                "card %s decided; its hints took over %.0f s and were dropped: Postgres has it",
                card.id,
                HINTS_BUDGET_SECONDS,
            )

    async def _edit(
        self, card_id: str, res: Resolution, *, principal: str, channel: str, tenant: str | None
    ) -> tuple[Card, Card]:
        edits = res.edits or {}
        new = await self.check_edit(card_id, edits, principal=principal, tenant=tenant)
        return await self.store.edit(
            card_id,
            principal=principal,
            snapshot_hash=res.snapshot_hash,
            channel=channel,
            edits=edits,
            new=new,
            tenant=tenant,
        )

    async def check_edit(
        self, card_id: str, edits: dict[str, Any], *, principal: str, tenant: str | None
    ) -> NewCard:
        """The card an edit of ``card_id`` would propose, checked as the edit itself is
        (owner, pending, editable fields, the tool's parse and prepare, the policy), and
        written nowhere: typed refusals only. An agent step's gate checks a decision map's
        edits with it before the map is saved (a value the tool rejects was dropped
        silently after a 200)."""
        if not edits:
            raise InvalidInput("an edit needs at least one field in 'edits'")
        card = await self.store.get_card(card_id)
        if tenant is not None and card.tenant != tenant:
            raise CardNotFound(f"card {card_id} not found", card_id=card_id)
        if card.owner != principal:
            raise NotOwner("only the card's owner can decide it", card_id=card_id)
        if card.status is Status.EXPIRED:  # 410 whether or not the sweeper tidied it yet
            raise Expired("the card expired before the decision", card_id=card_id)
        if card.status is not Status.PENDING:
            raise AlreadyDecided(
                f"card already {card.status}",
                card_id=card_id,
                status=str(card.status),
                card=card.public(),
            )
        outside = sorted(set(edits) - set(card.editable))
        if outside:
            raise InvalidInput(
                f"fields not editable on this card: {some_names(outside)}",
                editable=card.editable,
            )
        check_edit_size(edits)
        tool = self.tools.get(card.tool)
        if tool is None:
            raise UnknownTool(
                f"this server does not serve the tool {card.tool!r} of card {card_id} "
                "(another version of the app proposed it); nothing was edited",
                tool=card.tool,
                card_id=card_id,
            )
        raw = {**await self.store.card_input(card_id), **edits}
        run = await self.store.get_run(card.run_id)
        ctx = ToolContext(
            tenant=card.tenant,
            user=principal,
            role=run.role,
            thread_id=card.thread_id,
            run_id=card.run_id,
            services=self.services,
        )
        # The tool's own code (parse, prepare, the card's summary and hash) now runs on
        # values a person typed: whatever it raises on them is a refusal (422), never a
        # 500, and nothing has changed yet (I9).
        try:
            args = tool.parse(raw)
            raw_input = msgspec.to_builtins(args)
            prepared = await tool.prepare(args, ctx)
            verdict = self.policy.evaluate(tool, prepared.args, tenant=card.tenant, role=run.role)
            if verdict.verdict is Verdict.DENY:
                why = verdict.reason
                localized = {"localized": dict(why)} if isinstance(why, dict) else {}
                raise Forbidden(f"policy denies the edited action: {label_text(why)}", **localized)
            new = new_card(
                tool,
                prepared,
                thread_id=card.thread_id,
                run_id=card.run_id,
                tenant=card.tenant,
                owner=card.owner,
                tool_use_id=card.tool_use_id,
                raw_input=raw_input,
                ttl=verdict.card_ttl(tool),
            )
            # An edit's card is keyed by the card it replaces: the request key stands for
            # what the model asked (its repeats find that card), and an edit back to
            # those values would otherwise collide with the card it left (a 409).
            return msgspec.structs.replace(new, request_key=f"{new.request_key}:edit:{card.id}")
        except ToolValidationError as exc:
            raise InvalidInput(exc.message, **exc.detail) from exc
        except (SignoffError, OSError):
            raise  # typed already, or a backing service down (503): not the values' fault
        except Exception as exc:
            log.info("edit of card %s refused: %s raised %r", card_id, card.tool, exc)
            raise InvalidInput(
                f"the edited values are not valid for {card.tool}: {str(exc)[:200]}"
            ) from exc

    async def resolve_batch(
        self,
        run_id: str,
        items: list[tuple[str, Resolution]],
        *,
        principal: str,
        channel: str,
        tenant: str | None = None,
    ) -> list[dict[str, Any]]:
        """Several decisions for one run's cards; each succeeds or fails on its own, and
        the answers come in the request's order. They are taken in the order the model
        called the cards, and the worker is told once they are all committed: an approved
        card runs as soon as it is approved (design note 60), so the batch's approvals run
        together, in the model's order."""
        run = await self.store.get_run(run_id)
        if tenant is not None and run.tenant != tenant:
            raise NotFound(f"run {run_id} not found", run_id=run_id)
        if run.owner != principal:
            raise NotOwner("only the run's owner can decide its cards", run_id=run_id)
        cards = {c.id: c for c in await self.store.cards_of_run(run.id)}
        later = len(run.state.get("order", [])) + 1  # not the run's: refused, in turn
        taken = sorted(
            range(len(items)),
            key=lambda i: run.call_position(cards[items[i][0]]) if items[i][0] in cards else later,
        )
        out: dict[int, dict[str, Any]] = {}
        hints: list[Coroutine[Any, Any, None]] = []
        try:
            for i in taken:
                card_id, res = items[i]
                try:
                    if card_id not in cards:
                        # Not this run's card: as if there were no such card. Whose it is,
                        # and whether it exists, is not this request's to learn.
                        raise CardNotFound(f"card {card_id} not found", card_id=card_id)
                    outcome = await self.resolve(
                        card_id,
                        res,
                        principal=principal,
                        channel=channel,
                        tenant=tenant,
                        hints=hints,
                    )
                    out[i] = {"card_id": card_id, "ok": True, **msgspec.to_builtins(outcome)}
                except SignoffError as exc:
                    out[i] = {
                        "card_id": card_id,
                        "ok": False,
                        "error": exc.code,
                        "message": exc.message,
                    }
        finally:
            await send_all(hints)
        return [out[i] for i in range(len(items))]


async def send_all(hints: list[Coroutine[Any, Any, None]]) -> None:
    """Send the hints of committed decisions, in order, however the caller ends (each
    never raises; on a cancellation the rest are closed unsent: the worker's poll finds
    the decisions in Postgres, I6)."""
    for n, hint in enumerate(hints):
        try:
            await hint
        except BaseException:
            for rest in hints[n + 1 :]:
                rest.close()
            raise


# A person's edit is a card field, not a document (a hostile probe stored a 100,000
# character description whole, in the card, its successor and their audit rows).
MAX_EDIT_CHARS = 2_000
MAX_EDIT_BYTES = 16_384


def check_edit_size(edits: dict[str, Any]) -> None:
    """Refuse an edit with a text over :data:`MAX_EDIT_CHARS` characters, or over
    :data:`MAX_EDIT_BYTES` in all (I9: typed, nothing changed)."""
    long = sorted(k for k, v in edits.items() if isinstance(v, str) and len(v) > MAX_EDIT_CHARS)
    if long:
        raise InvalidInput(
            f"an edited value may be at most {MAX_EDIT_CHARS} characters: {some_names(long)}",
            fields=long,
        )
    if len(canonical_json(edits).encode("utf-8", "replace")) > MAX_EDIT_BYTES:
        raise InvalidInput(f"an edit may be at most {MAX_EDIT_BYTES // 1024} KB in all")
