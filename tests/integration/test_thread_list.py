"""The thread list (GET /v1/threads and the WebSocket ``threads`` frame, kept live by
``threads_changed``) and result views on executed cards (issue 17). Real Postgres and
Redis, the gateway on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from signoff.gateway.service import GatewayService
from signoff.runtime.cards import Decision
from signoff.runtime.config import Settings
from signoff.testing import delivery, signed, text_message
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, pix
from tests.integration.test_gateway import auth, ws_connect
from tests.integration.test_quotas import queued_jobs

pytestmark = pytest.mark.anyio

PIX_VIEW_TITLE = {"pt-BR": "Cobrança Pix criada", "en": "Pix charge created"}


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    async with harness(database_url, model=Scripted(pix(), pix(), pix()), gateway=True) as hh:
        yield hh


async def listed(h: Harness, user: str, query: str = "") -> httpx.Response:
    async with httpx.AsyncClient() as c:
        return await c.get(f"{h.base_url}/v1/threads{query}", headers=auth(h, user))


async def test_http_lists_only_my_threads_most_recent_first_with_pending(h: Harness) -> None:
    older = await h.thread("alice")
    await h.say(older, "cobre", "alice")  # a pending card
    mine = await h.thread("alice")
    await h.say(mine, "cobre", "alice")
    [card] = await h.store.pending_cards(mine)
    await h.decide(card, Decision.REJECT)
    await h.settle()
    bobs = await h.thread("bob")
    r = await listed(h, "alice")
    assert r.status_code == 200
    threads = r.json()["threads"]
    assert [t["id"] for t in threads] == [mine, older]  # the rejection made `mine` newest
    assert [t["pending"] for t in threads] == [0, 1]
    assert threads[0]["title"] == "cobre" and threads[0]["last_seq"] > 0
    assert threads[0]["updated_at"] >= threads[1]["updated_at"]
    assert bobs not in [t["id"] for t in threads]
    assert [t["id"] for t in (await listed(h, "alice", "?limit=1")).json()["threads"]] == [mine]
    for bad in (
        "?limit=0",
        "?limit=201",
        "?limit=abc",
        "?limit=-1",
        "?limit=%C2%B2",
        "?limit=%D9%A3",
    ):
        r = await listed(h, "alice", bad)
        assert r.status_code == 422 and r.json()["error"] == "invalid_input", bad
        assert r.json()["message"] == "limit must be a whole number from 1 to 200", bad
    async with httpx.AsyncClient() as c:
        assert (await c.get(f"{h.base_url}/v1/threads")).status_code == 401
        spec = (await c.get(f"{h.base_url}/openapi.json")).json()
    op = spec["paths"]["/v1/threads"]["get"]
    assert op["parameters"][0]["name"] == "limit"
    assert "ThreadSummary" in spec["components"]["schemas"]


async def next_frame(ws: Any, kind: str) -> dict[str, Any]:
    while True:
        msg: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if msg["type"] == kind:
            return msg


async def test_a_first_list_is_not_followed_by_a_change_nothing_made(h: Harness) -> None:
    """The hostile probe: every socket's first ``threads`` request got a
    ``threads_changed {thread_id: null}`` ("a new thread was started") with it, from the
    person's channel's own subscription, and the page listed everything twice."""
    await h.thread("alice")
    ws = await ws_connect(h, "alice")
    try:
        await ws.send(json.dumps({"type": "threads", "id": "t1"}))
        seen: list[dict[str, Any]] = []
        with contextlib.suppress(TimeoutError):
            while True:
                seen.append(json.loads(await asyncio.wait_for(ws.recv(), 1.0)))
        assert [m["type"] for m in seen if m["type"].startswith("threads")] == ["threads"], seen
    finally:
        await ws.close()


async def test_a_resubscribe_re_lists_every_socket_of_the_person(h: Harness) -> None:
    """A review's finding: the watch took the first re-read hint it saw for its own
    subscribe's; a second socket of the person on the same gateway joins the first one's
    subscription and gets no such hint, so it swallowed the re-read of a real
    re-subscribe (after a Redis drop) and its page never re-listed what it missed. The
    feed's re-read after a re-subscribe (``Hint(seq=-1)``) is dispatched here as the
    feed does after a drop."""
    from signoff.runtime.hints import Hint

    thread = await h.thread("alice")
    sockets = [await ws_connect(h, "alice"), await ws_connect(h, "alice")]
    try:
        for n, ws in enumerate(sockets):
            await ws.send(json.dumps({"type": "threads", "id": f"t{n}"}))
            await next_frame(ws, "threads")
        feeds = h.asgi.state.feeds
        (user_key,) = [k for k in feeds._listeners if k.startswith("user:")]
        await feeds._dispatch(user_key, Hint(seq=-1))
        for ws in sockets:
            assert (await next_frame(ws, "threads_changed"))["thread_id"] is None
        await feeds._dispatch(thread, Hint(seq=-1))
        for ws in sockets:
            assert (await next_frame(ws, "threads_changed"))["thread_id"] == thread
    finally:
        for ws in sockets:
            await ws.close()


async def test_ws_thread_list_is_live(h: Harness) -> None:
    listed_thread = await h.thread("alice")
    await h.say(listed_thread, "cobre", "alice")
    ws = await ws_connect(h, "alice")
    try:
        await ws.send(json.dumps({"type": "threads", "id": "t1"}))
        reply = await next_frame(ws, "threads")
        assert reply["id"] == "t1" and [t["id"] for t in reply["threads"]] == [listed_thread]
        assert reply["threads"][0]["pending"] == 1
        # Another person's new thread says nothing to alice; a change in alice's listed
        # thread (made by the API, not this socket) does.
        await h.thread("bob")
        async with httpx.AsyncClient() as c:
            r = await c.post(f"{h.base_url}/v1/threads", headers=auth(h, "bob"))
            assert r.status_code == 201
        [card] = await h.store.pending_cards(listed_thread)
        await h.decide(card, Decision.REJECT)
        changed = await next_frame(ws, "threads_changed")
        assert changed["thread_id"] == listed_thread
        await h.settle()  # the rejected turn ends (its last entries come before the new thread)
        # A thread alice makes elsewhere (HTTP) is announced on her own channel.
        async with httpx.AsyncClient() as c:
            r = await c.post(f"{h.base_url}/v1/threads", headers=auth(h, "alice"))
            assert r.status_code == 201
            new = r.json()["thread"]["id"]
        while (changed := await next_frame(ws, "threads_changed"))["thread_id"] is not None:
            pass  # the rejection's own updates may still be on their way
        await ws.send(json.dumps({"type": "threads", "id": "t2"}))
        reply = await next_frame(ws, "threads")
        assert reply["threads"][0]["id"] == new
        # ... and that new thread is watched from this list on.
        await h.say(new, "cobre", "alice")
        while (changed := await next_frame(ws, "threads_changed"))["thread_id"] != new:
            pass
    finally:
        await ws.close()
    # The socket's subscriptions are gone with it (the server sees the close soon after).
    for _ in range(100):
        if h.asgi.state.feeds.listening(new) == 0:
            break
        await asyncio.sleep(0.05)
    assert h.asgi.state.feeds.listening(new) == 0


async def test_executed_card_events_carry_the_tools_result_view(h: Harness) -> None:
    thread = await h.thread("alice")
    await h.say(thread, "cobre", "alice")
    [card] = await h.store.pending_cards(thread)
    await h.decide(card, Decision.APPROVE)
    await h.settle()
    async with httpx.AsyncClient() as c:
        r = await c.get(
            f"{h.base_url}/v1/threads/{thread}/events?after_seq=0", headers=auth(h, "alice")
        )
    updates = [e["data"] for e in r.json()["events"] if e["kind"] == "card_update"]
    executed = [d for d in updates if d["status"] == "executed"]
    assert len(executed) == 1 and all("view" not in d for d in updates if d not in executed)
    view = executed[0]["view"]
    assert view["title"] == PIX_VIEW_TITLE
    assert [(f["format"], f["value"]) for f in view["fields"]] == [
        ("money_cents", 15000),
        ("copy", executed[0]["result"]["copy_paste"]),
    ]
    assert view["fields"][0]["label"] == {"pt-BR": "Valor", "en": "Amount"}
    # The log itself is unchanged: the view is added on the way out.
    stored = [e for e in await h.store.entries_after(thread, 0) if e.kind == "card_update"]
    assert all("view" not in e.body for e in stored)
    # The WebSocket replay carries it too.
    ws = await ws_connect(h, "alice")
    try:
        await ws.send(json.dumps({"type": "resume", "id": "r", "thread_id": thread}))
        while True:
            ev = await next_frame(ws, "event")
            if ev["kind"] == "card_update" and ev["data"]["status"] == "executed":
                assert ev["data"]["view"] == view
                break
    finally:
        await ws.close()


class _DeadPublish:
    """The bus with Redis gone for publishing (the thread is committed in Postgres)."""

    def __init__(self, bus: Any) -> None:
        self._bus = bus

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def publish(self, channel: str, payload: bytes) -> int:
        raise ConnectionError("redis is down")


async def test_a_thread_is_made_and_listed_when_its_hint_cannot_be_published(h: Harness) -> None:
    service: GatewayService = h.asgi.state.service
    service.bus = _DeadPublish(service.bus)
    try:
        async with httpx.AsyncClient() as c:
            r = await c.post(f"{h.base_url}/v1/threads", headers=auth(h, "carol"))
        assert r.status_code == 201
        made = r.json()["thread"]["id"]
        assert [t["id"] for t in (await listed(h, "carol")).json()["threads"]] == [made]
    finally:
        service.bus = service.bus._bus


WA_SECRET = "wa-secret"


def wa_settings() -> Settings:
    return Settings(
        whatsapp_phone_number_id="100",
        whatsapp_token="wa-token",
        whatsapp_app_secret=WA_SECRET,
        whatsapp_verify_token="verify",
        whatsapp_base_url="http://127.0.0.1:9",  # nothing is sent in these tests
    )


async def wa_post(h: Harness, message: dict[str, Any]) -> httpx.Response:
    body = delivery(message)
    async with httpx.AsyncClient(base_url=h.base_url, timeout=30) as c:
        return await c.post("/v1/whatsapp/webhook", content=body, headers=signed(body, WA_SECRET))


async def test_a_thread_started_over_whatsapp_appears_in_the_live_list(database_url: str) -> None:
    """A number's first message makes its thread: the number's open chat page (same
    tenant, user = wa_id) is told on its channel, as for a thread made over HTTP."""
    async with harness(
        database_url, model=Scripted(pix(), pix()), gateway=True, settings=wa_settings()
    ) as h:
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        ws = await ws_connect(h, wa_id)
        try:
            await ws.send(json.dumps({"type": "threads", "id": "t1"}))
            assert (await next_frame(ws, "threads"))["threads"] == []
            r = await wa_post(h, text_message(wa_id, "cobre 150 do João"))
            assert r.status_code == 200, r.text
            changed = await next_frame(ws, "threads_changed")
            assert changed["thread_id"] is None  # the person's channel: re-list
            made = await h.store.whatsapp.contact_thread(h.tenant, wa_id)
            assert made is not None
            await ws.send(json.dumps({"type": "threads", "id": "t2"}))
            assert [t["id"] for t in (await next_frame(ws, "threads"))["threads"]] == [made]
            # ... and it is watched from that list on: deciding its card (made by the
            # worker, maybe before that list) is a change of that thread.
            for _ in range(200):
                if pending := await h.store.pending_cards(made):
                    break
                await asyncio.sleep(0.05)
            await h.decide(pending[0], Decision.REJECT)
            while (await next_frame(ws, "threads_changed"))["thread_id"] != made:
                pass
            # A second message goes to the same thread: no new thread, no hint of one.
            assert (await wa_post(h, text_message(wa_id, "saldo"))).status_code == 200
            n = await h.store.pool.fetchval(
                "SELECT count(*) FROM threads WHERE tenant = $1 AND owner = $2", h.tenant, wa_id
            )
            assert n == 1
        finally:
            await ws.close()


async def test_a_whatsapp_thread_is_made_when_its_hint_cannot_be_published(
    database_url: str,
) -> None:
    async with harness(
        database_url,
        model=Scripted(pix()),
        gateway=True,
        settings=wa_settings(),
        start_worker=False,
    ) as h:
        channel = h.asgi.state.whatsapp
        channel.bus = _DeadPublish(channel.bus)
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        r = await wa_post(h, text_message(wa_id, "cobre 150 do João"))
        assert r.status_code == 200, r.text  # the hint failed after the commit: still 200
        [made] = (await listed(h, wa_id)).json()["threads"]
        # ... and the message was queued on its thread, once.
        assert [(j.thread_id, j.text) for j in await queued_jobs(h)] == [
            (made["id"], "cobre 150 do João")
        ]
