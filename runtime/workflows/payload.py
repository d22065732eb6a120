"""Gate payloads and step results: validation against a msgspec schema (pure).

A payload is a JSON object. Keys the engine owns (``RESERVED_KEYS``, e.g. ``steps``) are
refused outright (:class:`ReservedKey`, 422); the rest is converted to the gate's schema
(a failure is :class:`InvalidInput`, 422, and changes nothing) and only the declared fields
reach the state — undeclared ones are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from signoff.runtime.errors import ConfigError, InvalidInput, ReservedKey
from signoff.runtime.workflows.definition import RESERVED_KEYS

EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def json_schema(schema: type[msgspec.Struct] | None) -> dict[str, Any]:
    """The JSON schema of a gate's payload, inlined (no ``$ref``), for UIs."""
    if schema is None:
        return dict(EMPTY_SCHEMA)
    out, defs = msgspec.json.schema_components([schema], ref_template="#/$defs/{name}")
    top = dict(out[0])
    if "$ref" in top:
        name = top.pop("$ref").rsplit("/", 1)[-1]
        top = {**defs.pop(name), **top}
    if defs:
        top["$defs"] = defs
    return top


def check_schema(schema: type[msgspec.Struct] | None, what: str) -> None:
    """A schema must be a msgspec Struct type that declares no engine-owned key."""
    if schema is None:
        return
    if not (isinstance(schema, type) and issubclass(schema, msgspec.Struct)):
        raise ConfigError(f"{what}: schema must be a msgspec.Struct type, not {schema!r}")
    declared = {f.encode_name for f in msgspec.structs.fields(schema)}
    clash = sorted(declared & RESERVED_KEYS)
    if clash:
        raise ConfigError(f"{what}: fields {clash} are owned by the workflow engine")


def reject_reserved(data: Mapping[str, Any], what: str = "payload") -> None:
    clash = sorted(k for k in data if k in RESERVED_KEYS)
    if clash:
        raise ReservedKey(
            f"{what} may not set {', '.join(clash)}: owned by the workflow engine", keys=clash
        )


def validate(schema: type[msgspec.Struct] | None, payload: Any) -> dict[str, Any]:
    """The declared fields of a valid payload, as JSON values; raises ``ReservedKey`` or
    ``InvalidInput`` (with ``detail.schema``-independent text) otherwise."""
    if not isinstance(payload, Mapping):
        raise InvalidInput("payload must be a JSON object")
    reject_reserved(payload)
    if schema is None:
        return {}
    try:
        value = msgspec.convert(dict(payload), schema)
    except msgspec.ValidationError as exc:
        raise InvalidInput(f"invalid payload: {exc}") from exc
    out = msgspec.to_builtins(value)
    assert isinstance(out, dict)
    return out


def decode_input(schema: type[msgspec.Struct] | None, data: Any) -> Any:
    """A run's stored input as its workflow's input type (None without one)."""
    if schema is None or data is None:
        return None
    return msgspec.convert(data, schema)


def step_update(result: Any, step: str) -> dict[str, Any]:
    """A step's returned mapping as a state update (JSON values); a reserved key is refused."""
    if result is None:
        return {}
    if not isinstance(result, Mapping):
        raise InvalidInput(f"step {step!r} returned {type(result).__name__}, not a mapping")
    reject_reserved(result, f"step {step!r}")
    try:
        out = msgspec.to_builtins(dict(result))
    except (TypeError, msgspec.EncodeError) as exc:
        raise InvalidInput(f"step {step!r} returned a value that is not JSON: {exc}") from exc
    assert isinstance(out, dict)
    return out
