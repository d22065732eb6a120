"""``/openapi.json``: the HTTP API described from the same msgspec types that parse it."""

from __future__ import annotations

from typing import Any

import msgspec

from signoff import __version__
from signoff.gateway.service import BatchIn, MessageIn, ResolveIn
from signoff.gateway.workflows import EventIn, ResumeIn, StartIn, openapi_paths
from signoff.runtime.records import ThreadSummary

ERRORS = {
    "401": "missing, expired or forged token",
    "403": "not the owner",
    "404": "unknown thread, card, run, workflow or workflow run",
    "408": "the request body did not arrive in time (SIGNOFF_BODY_TIMEOUT_SECONDS)",
    "409": "already decided, stale snapshot_hash, or a card of a tool this gateway does not "
    "serve (unknown_tool); a workflow run not parked at that gate (not_parked), another "
    "event awaited (wrong_event), not failed at a gate (not_retriable), already over "
    "(run_inactive); a message to a workflow's agent-step thread (workflow_thread)",
    "410": "the card expired (database clock)",
    "422": "invalid payload (reserved_key: a workflow payload setting an engine-owned key)",
    "429": "over a per-user quota (threads a minute, turns in flight); see Retry-After",
    "503": "a backing service is unavailable (unavailable), or this gateway is at its "
    "in-flight limit (overloaded, SIGNOFF_MAX_IN_FLIGHT); retry after Retry-After",
}


def _responses(ok: str, code: str = "200") -> dict[str, Any]:
    out: dict[str, Any] = {code: {"description": ok}}
    err = {"$ref": "#/components/schemas/Error"}
    for status, text in ERRORS.items():
        out[status] = {"description": text, "content": {"application/json": {"schema": err}}}
    return out


def _threads_ok() -> dict[str, Any]:
    out = _responses("threads")
    item = {"$ref": "#/components/schemas/ThreadSummary"}
    schema = {
        "type": "object",
        "required": ["threads"],
        "properties": {"threads": {"type": "array", "items": item}},
    }
    out["200"]["content"] = {"application/json": {"schema": schema}}
    return out


def _body(name: str) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{name}"}
    return {"required": True, "content": {"application/json": {"schema": ref}}}


def _param(name: str, where: str = "path") -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": {"type": "integer" if name in ("after_seq", "limit") else "string"},
    }


def build_openapi() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [MessageIn, ResolveIn, BatchIn, ThreadSummary, StartIn, ResumeIn, EventIn],
        ref_template="#/components/schemas/{name}",
    )
    components["Error"] = {
        "type": "object",
        "required": ["error", "message"],
        "properties": {
            "error": {"type": "string"},
            "message": {"type": "string"},
            "detail": {"type": "object"},
        },
    }
    sec: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "signoff",
            "version": __version__,
            "description": "Human-in-the-loop runtime: threads, cards, decisions.",
        },
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
        },
        "paths": {
            "/v1/threads": {
                "post": {
                    "summary": "Create a thread",
                    "security": sec,
                    "responses": _responses("created", "201"),
                },
                "get": {
                    "summary": "The caller's threads, most recently active first, with the "
                    "number of cards waiting in each (pending); limit 1-200, default 50",
                    "security": sec,
                    "parameters": [_param("limit", "query")],
                    "responses": _threads_ok(),
                },
            },
            "/v1/threads/{thread_id}": {
                "get": {
                    "summary": "Thread state with pending cards",
                    "security": sec,
                    "parameters": [_param("thread_id")],
                    "responses": _responses("state"),
                }
            },
            "/v1/threads/{thread_id}/messages": {
                "post": {
                    "summary": "Post a user message (runs a turn)",
                    "security": sec,
                    "parameters": [_param("thread_id")],
                    "requestBody": _body("MessageIn"),
                    "responses": _responses("accepted", "202"),
                }
            },
            "/v1/threads/{thread_id}/events": {
                "get": {
                    "summary": "Thread events after a seq",
                    "security": sec,
                    "parameters": [_param("thread_id"), _param("after_seq", "query")],
                    "responses": _responses("events"),
                }
            },
            "/v1/cards/{card_id}": {
                "get": {
                    "summary": "A confirmation card",
                    "security": sec,
                    "parameters": [_param("card_id")],
                    "responses": _responses("card"),
                }
            },
            "/v1/cards/{card_id}/events": {
                "get": {
                    "summary": "The card's audit trail",
                    "security": sec,
                    "parameters": [_param("card_id")],
                    "responses": _responses("audit"),
                }
            },
            "/v1/cards/{card_id}/resolve": {
                "post": {
                    "summary": "Approve, reject or edit a card",
                    "security": sec,
                    "parameters": [_param("card_id")],
                    "requestBody": _body("ResolveIn"),
                    "responses": _responses("decided"),
                }
            },
            "/v1/runs/{run_id}/decisions": {
                "post": {
                    "summary": "Decide several cards of one run",
                    "security": sec,
                    "parameters": [_param("run_id")],
                    "requestBody": _body("BatchIn"),
                    "responses": _responses("results"),
                }
            },
            **openapi_paths(sec, _responses, _body, _param),
            "/healthz": {
                "get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: not stopping, Postgres and Redis answer",
                    "parameters": [
                        {
                            "name": "redis",
                            "in": "query",
                            "required": False,
                            "description": "optional: ready without Redis (decisions "
                            "still commit in Postgres)",
                            "schema": {"type": "string", "enum": ["optional"]},
                        }
                    ],
                    "responses": {
                        "200": {"description": "ready"},
                        "503": {"description": "not ready"},
                    },
                }
            },
        },
    }
