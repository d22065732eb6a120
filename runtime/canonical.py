"""Canonical JSON, snapshot hashes, request fingerprints and operation ids.

Pure functions, no I/O. ``snapshot_hash`` is what a person's decision is bound
to (I2); ``request_key`` makes a redelivered proposal find its existing card
(I5); ``operation_id`` is the provider idempotency key (I4).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

# Fixed namespace so operation ids are a pure function of the card id.
_OPERATION_NS = uuid.UUID("5a2b8f0e-3c1d-4f6a-9b7e-0d2c4e6f8a10")


def canonical_json(value: Any) -> str:
    """JSON with sorted keys, no whitespace, UTF-8 kept: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def snapshot_hash(
    tool: str, args: Mapping[str, Any], summary: str, impact: Mapping[str, Any]
) -> str:
    """sha256 over the canonical JSON of exactly what the person is shown and what will run."""
    payload = {"tool": tool, "args": args, "summary": summary, "impact": impact}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def _normalise(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    return value


def args_fingerprint(args: Mapping[str, Any], set_fields: Iterable[str] = ()) -> str:
    """Order-insensitive fingerprint of tool arguments.

    Object keys are order-insensitive by construction; list fields named in
    ``set_fields`` are compared as sets (sorted by canonical form, duplicates dropped).
    """
    norm = _normalise(args)
    for name in set_fields:
        items = norm.get(name)
        if isinstance(items, list):
            norm[name] = sorted({canonical_json(i): i for i in items}.values(), key=canonical_json)
    return hashlib.sha256(canonical_json(norm).encode()).hexdigest()


def request_key(
    run_id: str, tool: str, args: Mapping[str, Any], set_fields: Iterable[str] = ()
) -> str:
    """(run, tool, fingerprint): one card per request within a run."""
    return f"{run_id}:{tool}:{args_fingerprint(args, set_fields)}"


def operation_id(card_id: str) -> str:
    """The idempotency key a tool passes to its provider; stable for the card's life."""
    return str(uuid.uuid5(_OPERATION_NS, card_id))


# The namespace runtime/agent.py derives a message's run id with (its ``_RUN_NS``;
# tests/unit/test_quotas.py checks the two agree).
_RUN_NS = uuid.UUID("8f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b")


def run_id_of(message_id: str) -> str:
    """The id of the run an inbox message starts: known to the gateway at acceptance, so
    the turn quota can tell an accepted message from the run it became."""
    return str(uuid.uuid5(_RUN_NS, message_id))


# The integers every JSON reader agrees on (RFC 7493, I-JSON: an IEEE double holds them
# exactly): a JavaScript client or an audit tool reads any other as another number.
MAX_JSON_INT = 2**53 - 1


def inexact_int(value: Any) -> int | None:
    """The first integer beyond ``MAX_JSON_INT`` in magnitude anywhere in a JSON value
    (keys are strings), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_JSON_INT:
            return item
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None
