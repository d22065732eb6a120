"""One app, on one database, per key prefix of a Redis.

Gateways enqueue a user message on the prefix's inbox and any worker reading that inbox
takes it. Two apps with their own databases but one Redis and one ``SIGNOFF_KEY_PREFIX``
(a newcomer probe, following "give each app its own database") therefore took each
other's messages: a worker whose database has no such thread acknowledged the entry, and
the message accepted with a ``202`` was never run. Presence (runtime/presence.py) is
recorded per database, so neither side could see the other.

Every gateway and worker claims the prefix in Redis for its app and database
(``Keys.owner``, expiring after :data:`TTL_SECONDS` unless renewed every
:data:`BEAT_SECONDS`). A process that finds it held for another app or database refuses
to start (``SIGNOFF_ALLOW_APP_SKEW`` lets it start with a warning, for renaming an app
in a rolling deploy). Redis away at start is no refusal: the claim is made once it
answers, tried every :data:`CONFIRM_SECONDS`, and until then the process's inbox is shut
(``Bus.gate_inbox``: its worker takes nothing, its gateway queues nothing; a review
found both going on for a beat, another app's messages taken meanwhile). A process that then finds the prefix held by another app or database (it
started while Redis was away, or its claim lapsed during a long outage and another took
it) stops: :attr:`Claim.lost` is set, its worker takes no more messages and its command
exits non-zero, and ``/readyz`` fails meanwhile (an operator probe: it was only logged,
and the two apps went on taking each other's messages). A restart then refuses with
:class:`PrefixTaken`, which names both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from signoff.runtime.bus.protocol import Bus
from signoff.runtime.errors import ConfigError, SignoffError
from signoff.runtime.metrics import COUNTERS

log = logging.getLogger("signoff.presence")

BEAT_SECONDS = 5.0
TTL_SECONDS = 4 * BEAT_SECONDS
# Tries of a claim not made yet (Redis away at start): soon after Redis answers, the
# process knows whether the prefix is its own; its inbox is shut until then.
CONFIRM_SECONDS = 0.5


class PrefixTaken(ConfigError):
    """The Redis key prefix is used by another app, or by this app on another database."""

    code = "prefix_taken"


@dataclass
class Claim:
    """A process's hold on its prefix: ``lost`` is set (and ``why`` says by whom) when
    another app or database turns out to hold it; the process must stop."""

    owner: str
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""
    # Set once Redis said the prefix is this app's (or another's, allowed by
    # SIGNOFF_ALLOW_APP_SKEW): the bus's inbox is shut until then (Bus.gate_inbox).
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)


class PrefixLost(ConfigError):
    """The key prefix turned out, after start, to be held by another app or database."""

    code = "prefix_lost"


def database_identity(url: str | None) -> str:
    """A database named without credentials: host:port/name (``<unparsed>`` when the URL
    cannot be read without risking its password)."""
    if not url:
        return "<none>"
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "localhost").lower()
        port = parts.port or 5432
    except ValueError:
        return "<unparsed>"
    return f"{host}:{port}/{parts.path.strip('/') or '<default>'}"


def owner_of(app: str, installation: str) -> str:
    """Who claims a prefix: the app's name and its database's own id (migration 0014:
    the same through PgBouncer, a proxy or another host name)."""
    return f"app {app!r} on database {installation}"


def _taken(where: str, held: str, owner: str, database: str) -> str:
    return (
        f"the Redis bus {where} is used by {held}, and this process serves {owner}"
        + (f" (reached at {database})" if database else "")
        + ": each app (and each database) needs its own SIGNOFF_KEY_PREFIX or Redis, or "
        "its workers take the other's messages"
    )


@asynccontextmanager
async def hold(
    bus: Bus, owner: str, *, where: str, database: str = "", allow_skew: bool = False
) -> AsyncIterator[Claim]:
    """The prefix claimed for ``owner`` for the duration of the block (or refused)."""
    ttl_ms = int(TTL_SECONDS * 1000)
    claim = Claim(owner)
    bus.gate_inbox(claim.confirmed)
    try:
        held = await bus.claim_owner(owner, ttl_ms)
    except SignoffError as exc:  # Redis away: the renewals claim it when it is back
        log.warning(
            "key prefix not claimed yet (%s): claimed once Redis answers (this process "
            "takes and queues no message until then, and stops if another app or "
            "database holds it)",
            exc,
        )
        held = owner
    else:
        claim.confirmed.set()  # ours, or another's with the skew allowed (below)
    if held != owner:
        text = _taken(where, held, owner, database)
        if not allow_skew:
            raise PrefixTaken(
                text + f" (a stopped process's claim lapses {TTL_SECONDS:.0f}s after it stops)"
            )
        log.warning("%s (allowed: SIGNOFF_ALLOW_APP_SKEW)", text)
    task = asyncio.create_task(
        _renew(bus, claim, ttl_ms, where, database, allow_skew), name="signoff-prefix-owner"
    )
    try:
        yield claim
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _renew(
    bus: Bus, claim: Claim, ttl_ms: int, where: str, database: str, allow_skew: bool
) -> None:
    warned = False
    while True:
        await asyncio.sleep(BEAT_SECONDS if claim.confirmed.is_set() else CONFIRM_SECONDS)
        try:
            held = await bus.claim_owner(claim.owner, ttl_ms)
        except Exception as exc:  # Redis away: tried again soon, the inbox shut meanwhile
            if claim.confirmed.is_set():
                log.warning("key prefix claim not renewed: %s (inbox shut until it is)", exc)
            # An outage may outlast the claim, and another app take the prefix: until a
            # renewal says it is still ours, nothing is taken or queued (a review found the
            # first beat after such an outage taking the other app's messages).
            claim.confirmed.clear()
            continue
        if held == claim.owner:
            claim.confirmed.set()
            continue
        text = _taken(where, held, claim.owner, database)
        if allow_skew:
            if not warned:  # once: a rename in a rolling deploy holds it for a while
                log.warning("%s (allowed: SIGNOFF_ALLOW_APP_SKEW)", text)
                warned = True
            claim.confirmed.set()
            continue
        COUNTERS.inc("signoff_prefix_lost_total")
        claim.why = text
        log.error("stopping: %s", text)
        claim.lost.set()
        return
