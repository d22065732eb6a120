"""HTTP API ``/v1`` (DESIGN.md §7)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from signoff.gateway.auth import Principal, Tokens, bearer
from signoff.gateway.errors import Internal, error_body, retry_after, status_of, typed
from signoff.gateway.service import BatchIn, GatewayService, MessageIn, ResolveIn, parse
from signoff.runtime.errors import InvalidInput, RequestTimeout, SignoffError

log = logging.getLogger("signoff.http")

MAX_BODY = 256 * 1024

_enc = msgspec.json.Encoder()


def json_response(data: Any, status: int = 200) -> Response:
    return Response(_enc.encode(data), status_code=status, media_type="application/json")


def error_response(exc: SignoffError) -> Response:
    status = status_of(exc)
    response = json_response(error_body(exc), status)
    wait = retry_after(exc)
    if wait is not None:  # transient: the same request may succeed later
        response.headers["Retry-After"] = str(wait)
    if isinstance(exc, RequestTimeout):  # the rest of the body is never read
        response.headers["Connection"] = "close"
    return response


Handler = Callable[[Request, Principal], Awaitable[Response]]


class HttpApi:
    def __init__(self, service: GatewayService, tokens: Tokens, body_timeout: float = 0.0) -> None:
        self.service = service
        self.tokens = tokens
        self.body_timeout = body_timeout if body_timeout > 0 else None  # None: no limit

    def authed(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                who = self.tokens.verify(bearer(request.headers.get("authorization")))
                if _has_body(request):
                    # Read (bounded in size and time) before the handler runs, whether or
                    # not it uses a body: the request is admitted once it is whole, so a
                    # slow client holds no slot, and a body on a request that needs none
                    # cannot skip admission (or create a thread before its body came).
                    await self.body(request)
                else:
                    self._admit(request)
                return await handler(request, who)
            except ClientDisconnect:
                raise  # nobody to answer: gateway.app ends the request quietly
            except Exception as exc:
                error = typed(exc)
                if isinstance(error, Internal):
                    log.exception("%s %s failed", request.method, request.url.path)
                return error_response(error)
            finally:
                if request.scope.get("signoff.admitted"):
                    self.service.admission.leave()

        return endpoint

    def _admit(self, request: Request) -> None:
        """Take one of the gateway's in-flight slots (gateway/overload.py) or raise
        Overloaded (503). Taken once the request is whole, so a slow client holds none."""
        if not request.scope.get("signoff.admitted"):
            self.service.admission.enter()
            request.scope["signoff.admitted"] = True

    async def body(self, request: Request) -> bytes:
        """The request's body, read once (at most MAX_BODY bytes, within the body
        timeout), after which the request is admitted."""
        read = request.scope.get("signoff.body")
        if read is not None:
            return bytes(read)
        if not _has_body(request):
            self._admit(request)
            return b""
        size = request.headers.get("content-length")
        if size is not None and size.isascii() and size.isdigit() and int(size) > MAX_BODY:
            raise InvalidInput(f"body larger than {MAX_BODY} bytes")
        data = bytearray()
        try:
            async with asyncio.timeout(self.body_timeout):  # a slow body: 408, connection closed
                async for chunk in request.stream():
                    data += chunk
                    if len(data) > MAX_BODY:  # a chunked body is never read past the limit
                        raise InvalidInput(f"body larger than {MAX_BODY} bytes")
        except TimeoutError:
            raise RequestTimeout(
                f"request body not received within {self.body_timeout:g}s"
            ) from None
        request.scope["signoff.body"] = body = bytes(data)
        self._admit(request)
        return body

    # -- endpoints ----------------------------------------------------------------------

    async def create_thread(self, request: Request, who: Principal) -> Response:
        thread = await self.service.create_thread(who)
        return json_response({"thread": msgspec.to_builtins(thread)}, 201)

    async def list_threads(self, request: Request, who: Principal) -> Response:
        raw = request.query_params.get("limit", "50")
        if not (raw.isascii() and raw.isdigit()):  # "²" is a digit to isdigit, not to int
            raise InvalidInput("limit must be a whole number from 1 to 200")
        return json_response({"threads": await self.service.list_threads(who, int(raw[:4]))})

    async def get_thread(self, request: Request, who: Principal) -> Response:
        return json_response(await self.service.thread_state(request.path_params["thread_id"], who))

    async def post_message(self, request: Request, who: Principal) -> Response:
        body: MessageIn = parse(await self.body(request), MessageIn)
        delivery = await self.service.post_message(
            request.path_params["thread_id"], body.text, who, "http", body.idempotency_key
        )
        return json_response({"accepted": True, "delivery": delivery}, 202)

    async def events(self, request: Request, who: Principal) -> Response:
        raw = request.query_params.get("after_seq", "0")
        try:
            after_seq = int(raw)
        except ValueError:
            raise InvalidInput("after_seq must be an integer") from None
        if not -(2**63) <= after_seq < 2**63:
            raise InvalidInput("after_seq out of range")
        events = await self.service.events(request.path_params["thread_id"], after_seq, who)
        return json_response({"events": events})

    async def get_card(self, request: Request, who: Principal) -> Response:
        return json_response(
            {"card": await self.service.get_card(request.path_params["card_id"], who)}
        )

    async def card_events(self, request: Request, who: Principal) -> Response:
        audit = await self.service.card_audit(request.path_params["card_id"], who)
        return json_response({"events": audit})

    async def resolve(self, request: Request, who: Principal) -> Response:
        body: ResolveIn = parse(await self.body(request), ResolveIn)
        outcome = await self.service.resolve(request.path_params["card_id"], body, who, "http")
        return json_response(msgspec.to_builtins(outcome))

    async def batch(self, request: Request, who: Principal) -> Response:
        body: BatchIn = parse(await self.body(request), BatchIn)
        results = await self.service.batch(request.path_params["run_id"], body, who, "http")
        return json_response({"results": results})

    def routes(self) -> list[Route]:
        a = self.authed
        return [
            Route("/v1/threads", a(self.create_thread), methods=["POST"]),
            Route("/v1/threads", a(self.list_threads), methods=["GET"]),
            Route("/v1/threads/{thread_id}", a(self.get_thread), methods=["GET"]),
            Route("/v1/threads/{thread_id}/messages", a(self.post_message), methods=["POST"]),
            Route("/v1/threads/{thread_id}/events", a(self.events), methods=["GET"]),
            Route("/v1/cards/{card_id}", a(self.get_card), methods=["GET"]),
            Route("/v1/cards/{card_id}/events", a(self.card_events), methods=["GET"]),
            Route("/v1/cards/{card_id}/resolve", a(self.resolve), methods=["POST"]),
            Route("/v1/runs/{run_id}/decisions", a(self.batch), methods=["POST"]),
        ]


def _has_body(request: Request) -> bool:
    headers = request.headers
    return headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
