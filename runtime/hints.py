"""What goes on a thread channel: "the log grew", with the entries it grew by.

A gateway sends a socket the entries a hint carries when they follow the last seq
that socket got; on a gap (a hint lost, or two publishers' hints reordered) or a
hint without entries it re-reads the log from Postgres after that seq instead. The
log stays the truth; the entries only save the gateways a read per change. Text
deltas ride on hints too: they are ephemeral and never stored.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from signoff.runtime.records import Entry


class WireEntry(msgspec.Struct, frozen=True):
    """A log entry as a client sees it (``gateway.service.event_of``), body pre-encoded."""

    seq: int
    kind: str
    run_id: str | None
    data: msgspec.Raw
    at: str


class Hint(msgspec.Struct, frozen=True, omit_defaults=True):
    """``entries``: new log entries in seq order. ``seq=-1`` and no entries: re-read.

    For a delta, ``seq`` is the last log seq before the model call that streams it.
    """

    seq: int = 0
    delta: str = ""
    run_id: str = ""
    entries: list[WireEntry] = msgspec.field(default_factory=list)
    notice: str = ""  # a run's passing state, written by code ("model_unavailable")


RELOAD = b'{"seq":-1}'

_enc = msgspec.json.Encoder()
decode = msgspec.json.Decoder(Hint).decode


def wire(entry: Entry) -> WireEntry:
    return WireEntry(
        seq=entry.seq,
        kind=entry.kind,
        run_id=entry.run_id,
        data=msgspec.Raw(_enc.encode(entry.body)),
        at=entry.created_at.isoformat(),
    )


def of_entries(entries: Iterable[Entry]) -> bytes:
    """The hint for entries just committed (in seq order)."""
    items = [wire(e) for e in entries]
    if not items:
        return RELOAD
    return _enc.encode(Hint(seq=items[-1].seq, entries=items))


def of_delta(seq: int, delta: str, run_id: str) -> bytes:
    return _enc.encode(Hint(seq=seq, delta=delta, run_id=run_id))


def of_notice(notice: str, run_id: str) -> bytes:
    """A run's passing state for the chat (ephemeral, never stored): ``notice`` is a code
    the page words in the person's language."""
    return _enc.encode(Hint(seq=0, notice=notice, run_id=run_id))
