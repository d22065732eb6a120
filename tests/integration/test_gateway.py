"""I9 over HTTP and WebSocket: every refusal is typed and changes nothing."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx
import pytest
import uvicorn
import websockets
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from signoff.gateway.app import build_app
from signoff.gateway.feed import Feeds
from signoff.runtime.bus import Job
from signoff.runtime.bus.memory import MemoryBus
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Status
from signoff.runtime.errors import Unavailable
from signoff.runtime.hints import Hint
from signoff.runtime.keys import Keys
from signoff.runtime.metrics import COUNTERS
from signoff.testing.servers import free_port
from tests import services
from tests.faults.proxy import Proxy
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, pix

pytestmark = pytest.mark.anyio


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    async with harness(database_url, model=Scripted(pix()), gateway=True) as hh:
        yield hh


async def card_for(h: Harness, user: str = "alice") -> dict[str, Any]:
    thread = await h.thread(user)
    await h.say(thread, "cobre", user)
    (card,) = await h.store.pending_cards(thread)
    return card.public()


def auth(h: Harness, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {h.token(user)}"}


async def unchanged(h: Harness, card: dict[str, Any]) -> None:
    now = await h.store.get_card(card["id"])
    assert now.status is Status.PENDING
    assert [e.to_status for e in await h.store.card_events(card["id"])] == ["pending"]


async def test_http_refusals(h: Harness) -> None:
    card = await card_for(h)
    url = f"{h.base_url}/v1/cards/{card['id']}/resolve"
    ok = {"decision": "approve", "snapshot_hash": card["snapshot_hash"]}
    async with httpx.AsyncClient() as c:
        r = await c.post(url, json=ok)
        assert r.status_code == 401 and r.json()["error"] == "unauthenticated"
        r = await c.post(url, json=ok, headers={"Authorization": "Bearer forged.token.here"})
        assert r.status_code == 401
        expired = h.tokens.issue("alice", h.tenant, ttl=-10)
        r = await c.post(url, json=ok, headers={"Authorization": f"Bearer {expired}"})
        assert r.status_code == 401 and "expired" in r.json()["message"]
        r = await c.post(url, json=ok, headers=auth(h, "mallory"))
        assert r.status_code == 403 and r.json()["error"] == "not_owner"
        r = await c.post(
            f"{h.base_url}/v1/cards/00000000-0000-0000-0000-000000000000/resolve",
            json=ok,
            headers=auth(h, "alice"),
        )
        assert r.status_code == 404
        r = await c.post(
            f"{h.base_url}/v1/cards/not-a-uuid/resolve", json=ok, headers=auth(h, "alice")
        )
        assert r.status_code == 404
        r = await c.post(url, json={**ok, "snapshot_hash": "f" * 64}, headers=auth(h, "alice"))
        assert r.status_code == 409 and r.json()["error"] == "stale_hash"
        bad: object
        for bad in (
            {"decision": "yes"},
            {"decision": "approve"},
            [],
            {"decision": 1, "snapshot_hash": 2},
            {**ok, "extra": True},
        ):
            r = await c.post(url, json=bad, headers=auth(h, "alice"))
            assert r.status_code == 422, bad
        r = await c.post(url, content=b"{not json", headers=auth(h, "alice"))
        assert r.status_code == 422
        await unchanged(h, card)

        await h.store.pool.execute(
            "UPDATE cards SET expires_at = now() - interval '1 second' WHERE id = $1", card["id"]
        )
        r = await c.post(url, json=ok, headers=auth(h, "alice"))
        assert r.status_code == 410 and r.json()["error"] == "expired"
        await unchanged(h, card)

    other = await card_for(h)
    url = f"{h.base_url}/v1/cards/{other['id']}/resolve"
    async with httpx.AsyncClient() as c:
        ok = {"decision": "approve", "snapshot_hash": other["snapshot_hash"]}
        r = await c.post(url, json=ok, headers=auth(h, "alice"))
        assert r.status_code == 200 and r.json()["card"]["status"] == "approved"
        r = await c.post(url, json=ok, headers=auth(h, "alice"))
        assert r.status_code == 409 and r.json()["error"] == "already_decided"
        assert r.json()["detail"]["status"] in ("approved", "executing", "executed")


async def test_no_redirect_is_built_from_the_clients_host_header(h: Harness) -> None:
    """A hostile probe: ``GET /static`` with ``Host: evil.example`` answered ``307`` to
    ``http://evil.example/static/`` (Starlette's added slash); a cache passing any Host
    through would serve that redirect to others. No redirect: a typed 404."""
    async with httpx.AsyncClient() as c:
        for path in ("/static", "/v1/threads/"):
            r = await c.get(
                f"{h.base_url}{path}", headers={**auth(h, "alice"), "Host": "evil.example"}
            )
            assert r.status_code == 404 and "location" not in r.headers, path
            assert r.json()["error"] == "not_found", path
        assert (await c.get(f"{h.base_url}/static/app.js")).status_code == 200


async def test_http_thread_flow_and_ownership(h: Harness) -> None:
    async with httpx.AsyncClient() as c:
        r = await c.post(f"{h.base_url}/v1/threads", headers=auth(h, "alice"))
        assert r.status_code == 201
        thread = r.json()["thread"]["id"]
        r = await c.post(
            f"{h.base_url}/v1/threads/{thread}/messages",
            json={"text": "cobre"},
            headers=auth(h, "mallory"),
        )
        assert r.status_code == 403
        r = await c.post(
            f"{h.base_url}/v1/threads/{thread}/messages",
            json={"text": "  "},
            headers=auth(h, "alice"),
        )
        assert r.status_code == 422
        r = await c.post(
            f"{h.base_url}/v1/threads/{thread}/messages",
            json={"text": "cobre"},
            headers=auth(h, "alice"),
        )
        assert r.status_code == 202
        await h.settle()
        r = await c.get(f"{h.base_url}/v1/threads/{thread}", headers=auth(h, "alice"))
        state = r.json()
        assert len(state["pending_cards"]) == 1
        r = await c.get(
            f"{h.base_url}/v1/threads/{thread}/events?after_seq=0", headers=auth(h, "alice")
        )
        kinds = [e["kind"] for e in r.json()["events"]]
        assert kinds == ["user", "assistant", "card"]
        r = await c.get(f"{h.base_url}/openapi.json")
        assert "/v1/cards/{card_id}/resolve" in r.json()["paths"]
        assert (await c.get(f"{h.base_url}/healthz")).status_code == 200
        assert (await c.get(f"{h.base_url}/readyz")).status_code == 200


async def ws_connect(h: Harness, user: str, origin: str | None = None) -> Any:
    ws_url = h.base_url.replace("http", "ws") + "/v1/ws"
    headers = {"Origin": origin} if origin else None
    ws = await websockets.connect(ws_url, additional_headers=headers)
    await ws.send(json.dumps({"type": "auth", "token": h.token(user)}))
    ready = json.loads(await ws.recv())
    assert ready["type"] == "ready", ready
    return ws


async def ws_call(ws: Any, frame: dict[str, Any]) -> dict[str, Any]:
    """Send a frame and return the reply with the same id (skipping events)."""
    await ws.send(json.dumps(frame))
    while True:
        msg: dict[str, Any] = json.loads(await ws.recv())
        if msg.get("id") == frame.get("id") and msg["type"] in ("error", "resolved", "ack", "pong"):
            return msg


async def test_ws_refusals(h: Harness) -> None:
    card = await card_for(h)
    base = {
        "type": "resolve",
        "card_id": card["id"],
        "decision": "approve",
        "snapshot_hash": card["snapshot_hash"],
    }
    mallory = await ws_connect(h, "mallory")
    r = await ws_call(mallory, {**base, "id": "1"})
    assert r["type"] == "error" and r["status"] == 403
    await mallory.close()
    ws = await ws_connect(h, "alice")
    r = await ws_call(ws, {**base, "id": "2", "card_id": "00000000-0000-0000-0000-000000000000"})
    assert r["status"] == 404
    r = await ws_call(ws, {**base, "id": "3", "snapshot_hash": "0" * 64})
    assert r["status"] == 409 and r["error"] == "stale_hash"
    r = await ws_call(ws, {**base, "id": "4", "decision": "maybe"})
    assert r["status"] == 422
    r = await ws_call(ws, {"type": "resolve", "id": "5"})
    assert r["status"] == 422
    await ws.send("{broken")
    r = json.loads(await ws.recv())
    assert r["type"] == "error" and r["status"] == 422
    await unchanged(h, card)
    await h.store.pool.execute(
        "UPDATE cards SET expires_at = now() - interval '1 second' WHERE id = $1", card["id"]
    )
    r = await ws_call(ws, {**base, "id": "6"})
    assert r["status"] == 410
    await unchanged(h, card)

    other = await card_for(h)
    ok = {**base, "card_id": other["id"], "snapshot_hash": other["snapshot_hash"]}
    r = await ws_call(ws, {**ok, "id": "7"})
    assert r["type"] == "resolved" and r["card"]["status"] == "approved"
    r = await ws_call(ws, {**ok, "id": "8"})
    assert r["status"] == 409 and r["error"] == "already_decided"
    await ws.close()


async def test_ws_auth_and_origin(h: Harness) -> None:
    ws_url = h.base_url.replace("http", "ws") + "/v1/ws"
    for origin in ("https://evil.example", "null", "http://127.0.0.1.evil.example"):
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            await websockets.connect(ws_url, additional_headers={"Origin": origin})
        assert info.value.response.status_code == 403
    same = h.base_url  # same origin as the page is allowed
    ws = await ws_connect(h, "alice", origin=same)
    await ws.close()
    ws = await websockets.connect(ws_url)
    await ws.send(json.dumps({"type": "auth", "token": "forged"}))
    err = json.loads(await ws.recv())
    assert err["type"] == "error" and err["status"] == 401
    with pytest.raises(websockets.exceptions.ConnectionClosed):
        await ws.recv()
    ws = await websockets.connect(ws_url)
    await ws.send(json.dumps({"type": "message", "text": "cobre"}))  # no auth first
    err = json.loads(await ws.recv())
    assert err["status"] == 401


async def test_ws_chat_receives_events_and_resumes(h: Harness) -> None:
    ws = await ws_connect(h, "alice")
    ack = await ws_call(ws, {"type": "message", "text": "cobre", "id": "m1"})
    thread = ack["thread_id"]
    kinds: list[str] = []
    card = None
    while card is None:
        msg = json.loads(await ws.recv())
        if msg["type"] == "event":
            kinds.append(msg["kind"])
            if msg["kind"] == "card":
                card = msg["data"]
    assert kinds == ["user", "assistant", "card"]
    r = await ws_call(
        ws,
        {
            "type": "resolve",
            "id": "r1",
            "card_id": card["id"],
            "decision": "approve",
            "snapshot_hash": card["snapshot_hash"],
        },
    )
    assert r["type"] == "resolved"
    seen = []
    while "run" not in seen:
        msg = json.loads(await ws.recv())
        if msg["type"] == "event":
            seen.append(msg["kind"])
    assert seen[-1] == "run" and "tool_results" in seen
    await ws.close()
    # a second connection resumes after seq 2 and gets everything after it, in order, once
    ws2 = await ws_connect(h, "alice")
    await ws2.send(json.dumps({"type": "resume", "thread_id": thread, "after_seq": 2, "id": "x"}))
    seqs = []
    while True:
        msg = json.loads(await ws2.recv())
        if msg["type"] == "event":
            seqs.append(msg["seq"])
            if msg["kind"] == "run":
                break
    assert seqs == list(range(3, seqs[-1] + 1))
    await ws2.close()


async def test_ws_thread_ids_in_another_spelling_follow_the_thread(h: Harness) -> None:
    """A thread id in capitals (or braces) is the same thread: a `message` or `resume`
    naming it that way is answered with the id as Postgres spells it, and the socket gets
    the thread's live events (it was acknowledged, then followed a channel no hint
    uses)."""
    ws = await ws_connect(h, "alice")
    first = await ws_call(ws, {"type": "message", "text": "oi", "id": "m0"})
    thread = first["thread_id"]
    await ws.close()
    for n, spelled in enumerate((thread.upper(), "{" + thread + "}")):
        ws = await ws_connect(h, "alice")
        ack = await ws_call(ws, {"type": "resume", "thread_id": spelled, "id": f"r{n}"})
        assert ack["thread_id"] == thread, ack
        text = f"cobre {n + 1}"
        await ws.send(
            json.dumps({"type": "message", "thread_id": spelled, "text": text, "id": f"m{n}"})
        )
        # Every frame is read here (the ack and the events may come in either order): the
        # message's own `user` event is a live one, which the socket gets only if it
        # follows the thread's channel.
        acked = live = False
        while not (acked and live):
            msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if msg.get("id") == f"m{n}":
                assert (msg["type"], msg["thread_id"]) == ("ack", thread), msg
                acked = True
            elif msg["type"] == "event":
                assert msg["thread_id"] == thread, msg
                live = live or (msg["kind"] == "user" and text in json.dumps(msg["data"]))
        await ws.close()


async def test_ready_carries_the_apps_example_request(h: Harness) -> None:
    """The chat page's empty thread shows the app's own example (the demo's "charge João
    150" was shown for every app); an app without one sends none."""
    ws_url = h.base_url.replace("http", "ws") + "/v1/ws"
    async with websockets.connect(ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": h.token("alice")}))
        ready = json.loads(await ws.recv())
    assert ready["type"] == "ready" and "charge João 150" in ready["hint"]["en"], ready
    assert "cobre 150 do João" in ready["hint"]["pt-BR"]
    from signoff.demo.desk import build
    from signoff.runtime.app import load_app

    assert build().hint == ready["hint"]
    assert "refund order A100" in str(load_app("examples.helpdesk:app").hint)
    assert load_app("examples.orders:app").hint is None  # its page: the generic line
    # any Mapping is kept as a plain dict (the frame encoder knows no other kind)
    from types import MappingProxyType

    from signoff.runtime.app import App
    from signoff.runtime.errors import ConfigError
    from signoff.runtime.tools import Registry

    kept = App(name="x", tools=Registry([]), hint=MappingProxyType({"en": "“hi”"}))
    assert type(kept.hint) is dict and kept.hint == {"en": "“hi”"}
    with pytest.raises(ConfigError):
        App(name="x", tools=Registry([]), hint={"en": 1})  # type: ignore[dict-item]


async def test_200_concurrent_http_approvals(h: Harness) -> None:
    import asyncio

    card = await card_for(h)
    url = f"{h.base_url}/v1/cards/{card['id']}/resolve"
    body = {"decision": "approve", "snapshot_hash": card["snapshot_hash"]}
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(limits=limits, timeout=30) as c:
        responses = await asyncio.gather(
            *(c.post(url, json=body, headers=auth(h, "alice")) for _ in range(200))
        )
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) == 1 and codes.count(409) == 199
    for r in responses:
        if r.status_code == 409:
            assert r.json()["error"] == "already_decided"
            assert r.json()["detail"]["decided_by"] == "alice"
    await h.settle()
    events = [e.to_status for e in await h.store.card_events(card["id"])]
    assert events.count("approved") == 1 and events.count("executing") == 1
    assert await h.charges() == 1


async def test_chat_page_cannot_be_framed_and_static_serves_no_python(h: Harness) -> None:
    async with httpx.AsyncClient(base_url=h.base_url) as c:
        r = await c.get("/")
        assert r.status_code == 200
        assert r.headers["content-security-policy"] == "frame-ancestors 'none'"
        assert r.headers["x-frame-options"] == "DENY"
        assert (await c.get("/static/app.js")).status_code == 200
        assert (await c.get("/static/__init__.py")).status_code == 404
        # Every answer, the page, its assets, the API and its refusals: no sniffing, no
        # Referer.
        # The page is also /static/index.html (and /static//index.html): it was framable
        # there, its Confirm clickable inside another site's frame. No answer is now.
        paths = ("/", "/static/index.html", "/static//index.html", "/static/app.js")
        for path in (*paths, "/v1/threads", "/nowhere", "/healthz"):
            r = await c.get(path)
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["referrer-policy"] == "no-referrer", path
            assert r.headers.get_list("x-frame-options") == ["DENY"], path
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path


async def test_card_carries_the_models_input_for_edit_forms(h: Harness) -> None:
    card = await card_for(h)
    assert card["input"] == {"customer": "João", "amount": "150", "description": ""}
    assert card["editable"] == ["amount", "description"]


# -- totality: nothing untyped reaches a client -------------------------------------------


class BrokenBus(MemoryBus):
    """The in-process bus with a bug in ``enqueue``: an exception nothing types."""

    async def enqueue(self, job: Job) -> str:
        raise RuntimeError("a bug in the bus")


@asynccontextmanager
async def served(app: Starlette) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn (wsproto) on a free port; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, ws="wsproto", lifespan="off", log_level="critical"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 5)
        await app.state.feeds.close()


async def test_untyped_exceptions_are_typed_500s_and_the_socket_stays(h: Harness) -> None:
    """I9: an exception nothing typed (here a bug in the bus) is a JSON
    `{"error": "internal"}` 500 over HTTP (it was Starlette's text/plain), and over the
    WebSocket a typed error frame on a socket that goes on working (it was dropped). The
    thread made for the refused WS message is gone again."""

    async def boom(request: Request) -> Response:
        raise ValueError("a bug in a route")

    app = build_app(
        settings=h.settings,
        store=h.store,
        bus=BrokenBus(),
        decisions=h.decisions,
        tokens=h.tokens,
        extra_routes=[Route("/boom", boom)],
    )
    async with served(app) as base, httpx.AsyncClient(base_url=base) as c:
        r = await c.get("/boom")
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        assert r.json() == {"error": "internal", "message": "internal error"}
        assert r.headers["x-content-type-options"] == "nosniff"  # the middleware's own 500
        thread = await h.thread("alice")
        r = await c.post(
            f"/v1/threads/{thread}/messages", json={"text": "cobre"}, headers=auth(h, "alice")
        )
        assert r.status_code == 500 and r.json()["error"] == "internal", r.text

        ws = await websockets.connect(base.replace("http", "ws") + "/v1/ws")
        await ws.send(json.dumps({"type": "auth", "token": h.token("bob")}))
        assert json.loads(await ws.recv())["type"] == "ready"
        err = await ws_call(ws, {"type": "message", "text": "cobre", "id": "m"})
        assert err["type"] == "error" and err["status"] == 500 and err["error"] == "internal"
        alive = await ws_call(ws, {"type": "resume", "thread_id": thread, "id": "alive"})
        assert alive["status"] == 403  # still answering: alice's thread is not bob's
        await ws.close()
    threads = await h.store.pool.fetchval(
        "SELECT count(*) FROM threads WHERE tenant = $1 AND owner = 'bob'", h.tenant
    )
    assert threads == 0


async def test_a_feed_that_cannot_subscribe_is_unavailable_and_leaks_no_listener(
    database_url: str,
) -> None:
    """Overload: the wait for a thread's subscription (Redis unreachable) ends in
    `Unavailable` (503), not a bare TimeoutError escaping the socket's handler, and the
    listener is removed again, as it is when the waiting caller is cancelled."""
    redis_url = services.redis_url()
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    keys = Keys("so-feed-" + secrets.token_hex(4) + ":")
    with Proxy(port) as proxy:
        proxy.refuse()
        bus = RedisBus.from_url(proxy.url_for(redis_url), keys)
        feeds = Feeds(bus, keys, ready_seconds=0.5)

        async def listener(hint: Hint) -> None:
            pass

        try:
            with pytest.raises(Unavailable):
                await feeds.add("t1", listener)
            assert feeds.listening("t1") == 0
            waiting = asyncio.create_task(feeds.add("t2", listener))
            await asyncio.sleep(0.1)
            assert feeds.listening("t2") == 1
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert feeds.listening("t2") == 0
        finally:
            await feeds.close()
            await bus.close()


async def test_readyz_is_not_ready_whatever_a_dependency_check_raises(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A readiness probe that cannot prove ready answers 503 naming the dependency, never a
    500 (a balancer may read 500 as the gateway's own fault) and never the error's text
    (unauthenticated; a driver's message names hosts and ports): here the store's check
    raises an error no driver layer typed."""

    async def odd() -> None:
        raise RuntimeError("the check broke oddly")

    monkeypatch.setattr(h.store, "ping", odd)
    before = COUNTERS.values.get("signoff_postgres_errors_total", 0)
    async with httpx.AsyncClient() as c:
        r = await c.get(f"{h.base_url}/readyz")
        assert r.status_code == 503, r.text
        assert r.json() == {"ok": False, "error": "postgres unavailable"}
        # counted as the dependency's error, as a failed call of the store would be
        assert COUNTERS.values.get("signoff_postgres_errors_total", 0) == before + 1
        assert (await c.get(f"{h.base_url}/healthz")).status_code == 200
    monkeypatch.undo()
    async with httpx.AsyncClient() as c:
        assert (await c.get(f"{h.base_url}/readyz")).status_code == 200


async def test_ws_ping_is_answered_pong_with_its_id(h: Harness) -> None:
    """The page's heartbeat (docs/websocket.md `ping`): a socket whose network went away
    looked open for minutes, and the page said "Online" while nothing went through."""
    ws = await ws_connect(h, "alice")
    try:
        assert await ws_call(ws, {"type": "ping", "id": "p1"}) == {"type": "pong", "id": "p1"}
    finally:
        await ws.close()


async def resolve_behind_a_lock(
    lock: asyncpg.Connection, ws: Any, card: dict[str, Any]
) -> asyncpg.transaction.Transaction:
    """Lock the card's row (``lock``'s transaction, returned) and send a ``resolve`` of it
    (id ``r1``), which waits on that lock."""
    tx = lock.transaction()
    await tx.start()
    await lock.execute("SELECT 1 FROM cards WHERE id = $1 FOR UPDATE", card["id"])
    resolve = {
        "type": "resolve", "id": "r1", "card_id": card["id"], "decision": "approve",
        "snapshot_hash": card["snapshot_hash"],
    }  # fmt: skip
    await ws.send(json.dumps(resolve))
    return tx


async def test_ws_ping_is_answered_while_an_earlier_frame_waits_on_postgres(
    h: Harness, database_url: str
) -> None:
    """A code review: frames were handled one at a time, so a `resolve` waiting on a slow
    Postgres (up to a pool wait, a statement and the hints: ~15 s) held the pong back, and
    the page's heartbeat (10 s) took a healthy socket as gone. The pong says the socket
    carries frames; the `resolve` is still answered, after the lock goes, and frames sent
    after the ping are still handled in order."""
    card = await card_for(h)
    lock = await asyncpg.connect(database_url)
    ws = await ws_connect(h, "alice")
    try:
        tx = await resolve_behind_a_lock(lock, ws, card)
        await ws.send(json.dumps({"type": "threads", "id": "t1"}))  # after the resolve
        await ws.send(json.dumps({"type": "ping", "id": "p1"}))
        seen: list[str] = []
        while "p1" not in seen:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 5))
            seen.append(msg.get("id") or "")
        assert "r1" not in seen and "t1" not in seen  # the resolve still waits, in order
        await tx.rollback()
        while "t1" not in seen:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if msg.get("id") == "r1":
                assert msg["type"] == "resolved", msg
            seen.append(msg.get("id") or "")
        assert seen.index("r1") < seen.index("t1")
    finally:
        await ws.close()
        await lock.close()


async def test_ws_frames_beyond_the_read_ahead_close_the_socket_and_pings_are_answered(
    h: Harness, database_url: str
) -> None:
    """A review: the reader blocked on a full queue behind a slow frame, so pings went
    unanswered again, and 64 frames of 64 KB held 4 MB per socket. Up to 256 KB wait
    and pings are answered meanwhile; a frame past that closes the socket (1013, try
    again later): refused alone, a later frame would be handled before it was sent again
    (a second review). What was read before is still handled (the resolve applies)."""
    card = await card_for(h)
    lock = await asyncpg.connect(database_url)
    ws = await ws_connect(h, "alice")
    try:
        tx = await resolve_behind_a_lock(lock, ws, card)
        pad = "x" * 60_000
        for i in range(4):  # 240 KB behind the resolve: they fit
            await ws.send(json.dumps({"type": "threads", "id": f"t{i}", "pad": pad}))
        await ws.send(json.dumps({"type": "ping", "id": "p1"}))
        msg = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert msg == {"type": "pong", "id": "p1"}  # before any of the frames waiting
        await ws.send(json.dumps({"type": "threads", "id": "t4", "pad": pad}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        await tx.rollback()
        deadline = asyncio.get_running_loop().time() + 10
        while (await h.store.get_card(card["id"])).status is Status.PENDING:
            assert asyncio.get_running_loop().time() < deadline, "the resolve was dropped"
            await asyncio.sleep(0.05)
    finally:
        await ws.close()
        await lock.close()
