"""The frames a WebSocket client sends (docs/websocket.md section 2), decoded and checked.

Unknown fields are ignored on every frame but ``resolve``: a decision is refused with
what it does not understand (``args_snapshot``, say: what runs is the frozen snapshot,
never values a client sends), as over HTTP.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from signoff.gateway.service import LONE_SURROGATE, one_value_per_name
from signoff.runtime.errors import InvalidInput

# A thread position is a Postgres bigint (the HTTP API checks the same range).
Seq = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class Frame(msgspec.Struct, frozen=True):
    type: str
    id: str | None = None
    token: str | None = None
    thread_id: str | None = None
    text: str | None = None
    after_seq: Seq | None = None
    card_id: str | None = None
    decision: str | None = None
    snapshot_hash: str | None = None
    reason: str | None = None
    edits: dict[str, Any] | None = None
    idempotency_key: str | None = None  # a message's (gateway/service.py MessageIn)


class ResolveFrame(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The fields a ``resolve`` frame may carry."""

    type: str
    card_id: str | None = None
    decision: str | None = None
    snapshot_hash: str | None = None
    id: str | None = None
    reason: str | None = None
    edits: dict[str, Any] | None = None
    token: str | None = None  # (ignored, as on every frame but auth)


class _FrameId(msgspec.Struct):
    id: str | None = None


_frame = msgspec.json.Decoder(Frame)
_resolve_frame = msgspec.json.Decoder(ResolveFrame)
_frame_id = msgspec.json.Decoder(_FrameId)
# What a frame that does not parse raises: msgspec's errors, RecursionError on deep nesting,
# and UnicodeDecodeError on a binary frame that is not UTF-8.
BAD_FRAME = (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError)


def decode_frame(raw: bytes | str) -> Frame:
    """The frame, or :class:`InvalidInput` (422) saying what is wrong with it."""
    try:
        frame = _frame.decode(raw)
        if frame.type == "resolve":
            _resolve_frame.decode(raw)
        one_value_per_name(raw)
    except BAD_FRAME as exc:
        if isinstance(exc, msgspec.DecodeError) and LONE_SURROGATE.search(_bytes(raw)):
            # (msgspec says "Input data was truncated" for these)
            raise InvalidInput("invalid frame: not valid Unicode (a lone surrogate)") from exc
        if isinstance(exc, UnicodeDecodeError):  # said as the HTTP API says it
            raise InvalidInput("invalid frame: not UTF-8") from exc
        if isinstance(exc, RecursionError):
            raise InvalidInput("invalid frame: nested too deeply") from exc
        raise InvalidInput(f"invalid frame: {exc}") from exc
    return frame


def id_of(raw: bytes | str) -> str | None:
    """The ``id`` of a frame that did not parse as a whole, when it can be read."""
    try:
        return _frame_id.decode(LONE_SURROGATE.sub(rb"\\ufffd", _bytes(raw))).id
    except BAD_FRAME:
        return None


def _bytes(raw: bytes | str) -> bytes:
    return raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
