"""A message's ``idempotency_key``: what it names, and for how long (design notes 52, 54).

The same key and text from the same user is the same message: on a thread, its message
id is derived from them (so the run it starts is, I5); naming no thread, its thread is
too, so a send repeated after a lost answer finds the thread the first one made. A key
is remembered for :data:`KEY_SECONDS` from its first use, as a payment API's keys are;
after that it names a new message, and that one is again the same however often it is
sent: each expired use leads, by derivation, to the next (a "generation"), so retries
of the new message derive the same ids as its first send did.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable

from signoff.gateway.auth import Principal
from signoff.runtime.errors import InvalidInput

KEY = re.compile(r"[A-Za-z0-9._:-]{1,100}")
# How long a key is remembered, from its first use (by the database's clock).
KEY_SECONDS = 24 * 3600.0
# Expired uses of one key (days of a client reusing it) looked through before a random id.
MAX_GENERATIONS = 64
_MESSAGE_NS = uuid.UUID("5b0f7a52-2f4e-4c61-9a57-6d1c0e3f8b21")
_THREAD_NS = uuid.UUID("0c3e9d4a-51b7-4f0e-8a2d-7e6b1f9c4d35")


def check_key(key: str | None) -> None:
    """An idempotency key: 1-100 letters, digits or ``._:-`` (a UUID fits)."""
    if key is not None and not KEY.fullmatch(key):
        raise InvalidInput("idempotency_key must be 1-100 letters, digits or . _ : - (a UUID fits)")


def message_id_for(who: Principal, thread_id: str, key: str, text: str) -> uuid.UUID:
    """The message a client's key names: its user's, on its thread, with its text (another
    user's key, the same key on another thread, or another text under the same key, is
    another message: a client reusing keys, say its per-socket frame ids after a
    reconnect, must not have a new message dropped as a repeat). The run it starts is
    derived from it (runtime/agent.py), so the same message queued twice runs once (I5)."""
    return uuid.uuid5(_MESSAGE_NS, "\x1f".join((who.tenant, who.user, thread_id, key, text)))


def thread_id_for(who: Principal, key: str, text: str) -> str:
    """The thread a keyed message that names none is given: sent again after its answer
    was lost (a dropped socket), it finds the same thread, and so is the same message."""
    return str(uuid.uuid5(_THREAD_NS, "\x1f".join((who.tenant, who.user, key, text))))


def next_generation(earlier: str) -> str:
    """The id a key names once the use that had ``earlier`` has expired."""
    return str(uuid.uuid5(_MESSAGE_NS, earlier + "\x1fnext"))


async def current(first: str, age: Callable[[str], Awaitable[float | None]]) -> str | None:
    """The first id of ``first``'s generations not used more than :data:`KEY_SECONDS`
    ago (``age``: seconds since an id's use, None if unused); None past
    :data:`MAX_GENERATIONS` expired uses."""
    candidate = first
    for _ in range(MAX_GENERATIONS):
        seconds = await age(candidate)
        if seconds is None or seconds < KEY_SECONDS:
            return candidate
        candidate = next_generation(candidate)
    return None
