"""The gateway's Starlette application."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from signoff.gateway.auth import Tokens
from signoff.gateway.errors import Internal
from signoff.gateway.feed import Feeds
from signoff.gateway.http import HttpApi, error_response, json_response
from signoff.gateway.openapi import build_openapi
from signoff.gateway.overload import Admission
from signoff.gateway.quotas import Quotas, SocketGate, SocketSlots
from signoff.gateway.service import GatewayService
from signoff.gateway.socket_limits import deny
from signoff.gateway.workflows import WorkflowRoutes
from signoff.gateway.ws import websocket_endpoint
from signoff.runtime.bus import Bus
from signoff.runtime.config import Settings
from signoff.runtime.decisions import Decisions
from signoff.runtime.errors import ConfigError, SignoffError
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.store import Store
from signoff.runtime.workflows.service import WorkflowService

log = logging.getLogger("signoff.gateway")

READY_TIMEOUT = 2.0  # /readyz: how long Redis may take to answer a PING


SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    # No answer may be shown inside another site's frame: the page is also served as
    # /static/index.html, where its Confirm buttons were clickable in a frame.
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
)


class Total:
    """Every HTTP request ends in a typed answer (I9): an exception nothing inside typed is
    logged once and answered ``{"error": "internal"}`` 500 in JSON (not Starlette's or
    uvicorn's text/plain); a client gone mid-request ends it quietly, with no traceback.
    WebSockets are made total in ``gateway.ws``; whatever still escapes one is logged here,
    and uvicorn closes the socket."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                # Every answer, the page, its assets and the API alike: no content sniffing
                # (a JSON body is never run as a script) and no Referer leaving the page.
                headers = list(message.get("headers", ()))
                have = {name.lower() for name, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in have]
                message["headers"] = headers
            await send(message)

        if scope["type"] == "http" and framed_twice(scope):
            await ambiguous_length()(scope, receive, sending)
            return
        try:
            await self.app(scope, receive, sending)
        except ClientDisconnect:
            return
        except Exception:
            if scope["type"] != "http":
                log.exception("WebSocket %s failed", scope.get("path"))
                return
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if not started:
                await error_response(Internal("internal error"))(scope, receive, sending)


def framed_twice(scope: Scope) -> bool:
    """Both ``Transfer-Encoding`` and ``Content-Length``: two answers to where the body
    ends, the shape of request smuggling behind a proxy that reads the other one."""
    names = {name.lower() for name, _ in scope.get("headers", ())}
    return b"transfer-encoding" in names and b"content-length" in names


def ambiguous_length() -> Response:
    """Refused before any handler runs, and the connection closed (RFC 9112 6.3)."""
    response = json_response(
        {
            "error": "bad_request",
            "message": "a request may not carry both Transfer-Encoding and Content-Length",
        },
        400,
    )
    response.headers["Connection"] = "close"
    return response


async def no_websocket_here(websocket: WebSocket) -> None:
    """An upgrade on a path with no WebSocket: a typed 404 (Starlette's router closes the
    handshake, which the client sees as a bare 403 with no body)."""
    await deny(websocket, 404, "not_found", f"no WebSocket at {websocket.url.path}")


async def http_error(request: Request, exc: Exception) -> Response:
    """The router's own refusals (unknown path, wrong method) as typed JSON errors too (I9)."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    response = json_response({"error": code, "message": str(detail)}, status)
    if isinstance(exc, HTTPException) and exc.headers:
        response.headers.update(exc.headers)
    return response


def build_app(
    *,
    settings: Settings,
    store: Store,
    bus: Bus,
    decisions: Decisions,
    tokens: Tokens,
    extra_routes: list[Any] | None = None,
    workflows: WorkflowService | None = None,
    hint: str | Mapping[str, str] | None = None,
) -> Starlette:
    """``hint``: the app's example request, sent to every chat page in its ``ready`` frame."""
    quotas = Quotas.from_settings(settings, store, bus)
    admission = Admission(settings.max_in_flight)
    service = GatewayService(
        store=store, bus=bus, decisions=decisions, quotas=quotas, admission=admission, hint=hint
    )
    feeds = Feeds(bus, Keys(settings.key_prefix))
    api = HttpApi(service, tokens, body_timeout=settings.body_timeout_seconds)
    slots = SocketSlots(settings.quota_sockets)  # open WebSockets per user, this process
    openapi = build_openapi()

    async def healthz(request: Request) -> Response:
        return json_response({"ok": True})

    async def readyz(request: Request) -> Response:
        """Ready: not stopping (gateway/drain.py), Postgres and Redis both answer."""
        if getattr(request.app.state, "prefix_lost", False):  # stopping (prefix_owner.py)
            return json_response({"ok": False, "error": "key prefix held by another app"}, 503)
        if getattr(request.app.state, "draining", False):
            return json_response({"ok": False, "error": "draining"}, 503)
        ping_bus = getattr(bus, "ping", None)
        checks: list[tuple[str, Callable[[], Awaitable[None]]]] = [("postgres", store.ping)]
        # ?redis=optional: ready without Redis (decisions still commit in Postgres, I6),
        # for a balancer that would otherwise drop every gateway in a Redis outage.
        if ping_bus is not None and request.query_params.get("redis") != "optional":
            checks.append(("redis", lambda: asyncio.wait_for(ping_bus(), READY_TIMEOUT)))
        # The answer names the dependency, never its error: the probe is unauthenticated
        # and a driver's message carries hosts and ports; the log has the whole error.
        for name, check in checks:
            try:
                await check()
            except Exception as exc:  # a probe that cannot prove ready: not ready
                # A ping past READY_TIMEOUT (TimeoutError) or whatever a driver raises
                # that nothing below typed: not ready, never a 500 the balancer misreads,
                # and counted as that dependency's error like any other failed call
                # (typed errors were counted where they were typed).
                if not isinstance(exc, SignoffError):
                    COUNTERS.inc(f"signoff_{name}_errors_total")
                log.warning("/readyz: %s: %s: %s", name, type(exc).__name__, exc)
                return json_response({"ok": False, "error": f"{name} unavailable"}, 503)
        return json_response({"ok": True})

    async def openapi_json(request: Request) -> Response:
        return json_response(openapi)

    async def index(request: Request) -> Response:
        page = resources.files("signoff.gateway").joinpath("static/index.html")
        # The approve buttons must not be clickable inside another site's frame.
        headers = {"Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY"}
        if not page.is_file():
            return HTMLResponse(
                "<h1>signoff</h1><p>API at /v1, docs at /openapi.json</p>", headers=headers
            )
        return HTMLResponse(page.read_text(), headers=headers)

    sockets = [0]  # open WebSockets, for the metrics port

    async def ws(websocket: WebSocket) -> None:
        sockets[0] += 1
        try:
            await websocket_endpoint(
                websocket,
                service=service,
                feeds=feeds,
                tokens=tokens,
                allowed_origins=settings.allowed_origins,
                max_bytes=settings.max_ws_message_bytes,
                rate=settings.ws_frames_per_second,
                burst=settings.ws_burst,
            )
        finally:
            sockets[0] -= 1

    whatsapp = None
    if settings.whatsapp_enabled:
        from signoff.gateway.channels.whatsapp.webhook import ChannelRows, WhatsAppChannel

        rows: ChannelRows | None = getattr(store, "whatsapp", None)
        if rows is None:
            raise ConfigError("the WhatsApp channel needs the Postgres store")
        whatsapp = WhatsAppChannel(
            settings=settings,
            store=store,
            rows=rows,
            bus=bus,
            decisions=decisions,
            quotas=quotas,
        )
        if settings.whatsapp_text_confirm:
            wa_rows = rows

            async def wrote_elsewhere(thread_id: str) -> None:
                # A request typed on the chat page in a number's thread: a WhatsApp "sim"
                # after it is about what follows it (a review), as after a text.
                await wa_rows.wrote_on_thread(thread_id)

            service.message_hooks.append(wrote_elsewhere)

    routes: list[Any] = [
        Route("/", index),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/openapi.json", openapi_json),
        # The first frame takes one of the user's socket slots (a 429 frame and 4429 over it).
        WebSocketRoute("/v1/ws", SocketGate(slots, tokens, ws)),
        # Any other upgrade: a typed 404 (before the Mount, which would take /static's).
        WebSocketRoute("/{path:path}", no_websocket_here),
        # The chat page's assets (app.js, style.css): served by the gateway, no CDN.
        Mount("/static", StaticFiles(packages=[("signoff.gateway", "static")]), name="static"),
        *api.routes(),
        *(whatsapp.routes() if whatsapp is not None else []),
        *(WorkflowRoutes(api, workflows).routes() if workflows is not None else []),
        *(extra_routes or []),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Total)],
        exception_handlers={HTTPException: http_error},
    )
    # No redirect to the path with a slash added: Starlette builds its Location from the
    # request's Host header, which a client chooses (a hostile probe: `/static` with
    # `Host: evil.example` answered 307 to http://evil.example/static/). A typed 404.
    app.router.redirect_slashes = False
    app.state.feeds = feeds
    app.state.service = service
    app.state.workflows = workflows
    app.state.socket_slots = slots
    app.state.draining = False  # set by a stopping gateway (gateway/drain.py)
    app.state.gauges = lambda: [
        ("signoff_websockets", "Open WebSocket connections.", sockets[0]),
        (
            "signoff_gateway_in_flight",
            "API requests and WebSocket writes this gateway works on now.",
            admission.in_flight,
        ),
    ]
    app.state.whatsapp = whatsapp  # its courier is started by the process (runtime/node.py)
    return app
