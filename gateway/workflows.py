"""HTTP API for workflow runs (``/v1/workflows/...``, ``/v1/workflow-runs/...``).

Authenticated like the rest of ``/v1``; the principal is recorded as who resumed,
delivered, retried or cancelled. A run is its owner's (403 otherwise); events may also
be delivered by a principal of the run's tenant with the role ``service`` or ``admin``.
Errors per DESIGN.md I9: 404 unknown workflow or run, 403 not the owner, 409 not parked
at that gate / wrong event / not retriable / already over, 422 invalid payload or an
engine-owned key.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from signoff.gateway.auth import Principal
from signoff.gateway.http import HttpApi, json_response
from signoff.gateway.service import parse
from signoff.runtime.workflows.definition import WorkflowStatus
from signoff.runtime.workflows.records import Interrupt, WorkflowRun
from signoff.runtime.workflows.service import WorkflowService


class StartIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    input: dict[str, Any] | None = None
    # A UUID chosen by the client: the same start sent again returns the same run.
    run_id: str | None = None


class ResumeIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    payload: dict[str, Any]


class EventIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    # The sender's own id for the event: sent again, it applies nothing (design note 65).
    event_id: str | None = None


def run_body(run: WorkflowRun, interrupts: list[Interrupt] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"run": run.public()}
    if interrupts is not None:
        out["interrupts"] = [i.public() for i in interrupts]
        gate = next((i for i in reversed(interrupts) if i.status == "open"), None)
        out["gate"] = gate.public() if gate is not None else None
    return out


class WorkflowRoutes:
    def __init__(self, api: HttpApi, service: WorkflowService) -> None:
        self.api = api
        self.service = service

    async def start(self, request: Request, who: Principal) -> Response:
        body: StartIn = parse(await self.api.body(request) or b"{}", StartIn)
        run = await self.service.start(
            request.path_params["name"],
            body.input,
            tenant=who.tenant,
            owner=who.user,
            run_id=body.run_id,
        )
        return json_response(run_body(run), 201)

    async def list_runs(self, request: Request, who: Principal) -> Response:
        status = request.query_params.get("status")
        if status is not None:
            status = str(parse(msgspec.json.encode(status), WorkflowStatus))
        runs = await self.service.list(tenant=who.tenant, owner=who.user, status=status)
        return json_response({"runs": [r.public() for r in runs]})

    async def get(self, request: Request, who: Principal) -> Response:
        run, interrupts = await self.service.get(
            request.path_params["run_id"], tenant=who.tenant, user=who.user, role=who.role
        )
        return json_response(run_body(run, interrupts))

    async def resume(self, request: Request, who: Principal) -> Response:
        body: ResumeIn = parse(await self.api.body(request), ResumeIn)
        run = await self.service.resume(
            request.path_params["run_id"], body.payload, tenant=who.tenant, by=who.user
        )
        return json_response(run_body(run))

    async def event(self, request: Request, who: Principal) -> Response:
        body: EventIn = parse(await self.api.body(request), EventIn)
        passed = await self.service.deliver_event(
            request.path_params["run_id"],
            body.name,
            body.payload,
            tenant=who.tenant,
            by=who.user,
            role=who.role,
            event_id=body.event_id,
        )
        run = passed.run
        if run.owner == who.user:
            out = run_body(run)
        else:  # a service or admin principal may deliver, not read (its input, its state)
            out = {"run": {"id": run.id, "workflow": run.workflow, "status": str(run.status)}}
        out["delivered"] = "kept" if passed.buffered else "passed"
        if passed.repeated:
            out["repeated"] = True  # this event_id was delivered before: nothing applied now
        return json_response(out, 202 if passed.buffered else 200)

    async def retry(self, request: Request, who: Principal) -> Response:
        run = await self.service.retry(
            request.path_params["run_id"], tenant=who.tenant, by=who.user, role=who.role
        )
        return json_response(run_body(run))

    async def cancel(self, request: Request, who: Principal) -> Response:
        run = await self.service.cancel(
            request.path_params["run_id"], tenant=who.tenant, by=who.user, role=who.role
        )
        return json_response(run_body(run))

    def routes(self) -> list[Route]:
        a = self.api.authed
        runs = "/v1/workflow-runs"
        return [
            Route("/v1/workflows/{name}/runs", a(self.start), methods=["POST"]),
            Route(runs, a(self.list_runs), methods=["GET"]),
            Route(runs + "/{run_id}", a(self.get), methods=["GET"]),
            Route(runs + "/{run_id}/resume", a(self.resume), methods=["POST"]),
            Route(runs + "/{run_id}/events", a(self.event), methods=["POST"]),
            Route(runs + "/{run_id}/retry", a(self.retry), methods=["POST"]),
            Route(runs + "/{run_id}/cancel", a(self.cancel), methods=["POST"]),
        ]


def openapi_paths(
    sec: list[dict[str, list[str]]], responses: Any, body: Any, param: Any
) -> dict[str, Any]:
    """The workflow endpoints for ``/openapi.json`` (``gateway/openapi.py``)."""
    run = [param("run_id")]

    def op(summary: str, ok: str, code: str = "200", **extra: Any) -> dict[str, Any]:
        return {"summary": summary, "security": sec, "responses": responses(ok, code), **extra}

    return {
        "/v1/workflows/{name}/runs": {
            "post": op(
                "Start a run of a workflow (input validated against its input type)",
                "started",
                "201",
                parameters=[param("name")],
                requestBody=body("StartIn"),
            )
        },
        "/v1/workflow-runs": {
            "get": op(
                "The caller's workflow runs, newest first",
                "runs",
                parameters=[param("status", "query")],
            )
        },
        "/v1/workflow-runs/{run_id}": {
            "get": op(
                "A workflow run, its interrupts and its open gate (with the payload's JSON schema)",
                "run",
                parameters=run,
            )
        },
        "/v1/workflow-runs/{run_id}/resume": {
            "post": op(
                "Resume a run parked at a human gate (payload validated against the gate's "
                "schema; undeclared fields dropped; engine-owned keys refused)",
                "resumed",
                parameters=run,
                requestBody=body("ResumeIn"),
            )
        },
        "/v1/workflow-runs/{run_id}/events": {
            "post": op(
                "Deliver an event: passes the gate waiting for it (200) or is kept for a "
                "later gate with a lookback (202). The owner is answered the run; a service "
                "or admin principal only its id, workflow and status",
                "delivered",
                parameters=run,
                requestBody=body("EventIn"),
            )
        },
        "/v1/workflow-runs/{run_id}/retry": {
            "post": op("Re-arm the gate a run failed at (timed out)", "re-armed", parameters=run)
        },
        "/v1/workflow-runs/{run_id}/cancel": {
            "post": op("Cancel an active run", "cancelled", parameters=run)
        },
    }
