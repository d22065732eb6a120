"""A message's ``idempotency_key`` (gateway/service.py, design note 52): the same key and
text on the same thread is one message, run once however often it is sent; another text
under the same key is another message (a client reusing keys, its per-socket frame ids
say, must not have a new message dropped as a repeat). Through the HTTP API of a gateway
and a worker on real Postgres; the inbox delivers each send."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
import pytest

from signoff.runtime.config import Settings
from signoff.runtime.errors import NotFound, Unavailable
from tests.harness import harness
from tests.integration.test_decisions import Scripted, pix
from tests.integration.test_gateway import ws_call, ws_connect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_one_key_and_text_run_once_and_another_text_runs_too(database_url: str) -> None:
    async with harness(database_url, model=Scripted(pix()), gateway=True) as h:
        user = "keys"
        auth = {"Authorization": f"Bearer {h.token(user)}"}
        thread = await h.thread(user)
        url = f"{h.base_url}/v1/threads/{thread}/messages"
        async with httpx.AsyncClient(timeout=30) as http:

            async def send(text: str, key: str) -> None:
                r = await http.post(url, json={"text": text, "idempotency_key": key}, headers=auth)
                assert r.status_code == 202, r.text

            await asyncio.gather(*(send("cobre 150 do João", "c1") for _ in range(3)))
            await h.settle()
            entries = await h.store.entries_after(thread, 0)
            users = [e for e in entries if e.kind == "user"]
            assert len(users) == 1 and len(await h.pending(thread)) == 1

            await send("cobre 30 da Maria", "c1")  # the same key, another message
            await h.settle()
            users = [e for e in await h.store.entries_after(thread, 0) if e.kind == "user"]
            assert len(users) == 2
            assert users[1].body["content"][0]["text"] == "cobre 30 da Maria"


async def _frames(ws: Any, seconds: float) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    with contextlib.suppress(TimeoutError):
        while True:
            seen.append(json.loads(await asyncio.wait_for(ws.recv(), seconds)))
    return seen


async def test_a_keyed_message_sent_again_after_a_lost_answer_finds_its_thread(
    database_url: str,
) -> None:
    """A review's finding: a WebSocket message naming no thread got a new thread each
    send, and its message id covers the thread, so a client whose socket dropped before
    the ``ack`` sent it again (the page does, under the same key) and ran it twice, on
    two threads. A keyed message's thread is now the key's: the second send finds the
    thread the first made, and is the same message. Sent at once from two sockets too."""
    async with harness(database_url, model=Scripted(pix()), gateway=True) as h:
        user = "keys-ws"
        frame = {"type": "message", "text": "cobre 150 do João", "idempotency_key": "n-1"}
        first = await ws_connect(h, user)
        a = await ws_call(first, {**frame, "id": "1"})
        await first.close()  # the answer lost with the socket: the page sends it again
        again = await ws_connect(h, user)
        b = await ws_call(again, {**frame, "id": "1"})
        assert a["type"] == b["type"] == "ack", (a, b)
        assert a["thread_id"] == b["thread_id"]
        racing = [await ws_connect(h, user), await ws_connect(h, user)]
        raced = await asyncio.gather(
            *(ws_call(ws, {**frame, "id": "2", "idempotency_key": "n-2"}) for ws in racing)
        )
        assert [r["type"] for r in raced] == ["ack", "ack"], raced
        assert raced[0]["thread_id"] == raced[1]["thread_id"] != a["thread_id"]
        other = await ws_call(again, {**frame, "id": "3", "text": "cobre 30 da Maria"})
        assert other["thread_id"] not in (a["thread_id"], raced[0]["thread_id"])
        await h.settle()
        for thread in (a["thread_id"], raced[0]["thread_id"], other["thread_id"]):
            users = [e for e in await h.store.entries_after(thread, 0) if e.kind == "user"]
            assert len(users) == 1, (thread, users)
            assert len(await h.pending(thread)) == 1
        assert len(await h.store.list_threads(h.tenant, user, 50)) == 3
        for ws in (again, *racing):
            await ws.close()


async def test_a_bad_key_makes_no_thread_and_follows_none(database_url: str) -> None:
    """A hostile probe: a refused key (422) on a message naming no thread made a thread,
    told the person's other sockets "a thread was started", and then deleted it; on a
    message to a thread, it subscribed the socket to that thread."""
    async with harness(database_url, model=Scripted(pix()), gateway=True) as h:
        user = "keys-bad"
        thread = await h.thread(user)
        watcher, sender = await ws_connect(h, user), await ws_connect(h, user)
        await watcher.send(json.dumps({"type": "threads", "id": "t"}))
        await _frames(watcher, 0.5)  # its list
        before = len(await h.store.list_threads(h.tenant, user, 50))
        bad = {"type": "message", "text": "saldo", "idempotency_key": "bad key"}
        r = await ws_call(sender, {**bad, "id": "1"})
        assert r["type"] == "error" and r["status"] == 422, r
        r = await ws_call(sender, {**bad, "id": "2", "thread_id": thread})
        assert r["type"] == "error" and r["status"] == 422, r
        assert len(await h.store.list_threads(h.tenant, user, 50)) == before
        assert [m for m in await _frames(watcher, 0.5) if m["type"] == "threads_changed"] == []
        await h.say(thread, "saldo", user)  # the thread moves: the sender follows none
        assert [m for m in await _frames(sender, 1.0) if m.get("thread_id") == thread] == []
        await watcher.close()
        await sender.close()


async def test_a_key_is_remembered_for_a_day(database_url: str) -> None:
    """A review's finding: a client that reuses keys across sessions (frame counters)
    sent the same text under an old key days later, with no thread: it got the old
    thread back, and its message was taken for the old one and dropped; to a thread, the
    same. A key is remembered for a day (``KEY_SECONDS``), as a payment API's are: after
    that it names a new message. (The runs and threads are aged in the database.)"""
    async with harness(database_url, model=Scripted(pix(), pix()), gateway=True) as h:
        user = "keys-day"
        frame = {"type": "message", "text": "cobre 150 do João", "idempotency_key": "1"}
        ws = await ws_connect(h, user)
        first = await ws_call(ws, {**frame, "id": "a"})
        await h.settle()
        assert len(await h.pending(first["thread_id"])) == 1
        await h.provider.pool.execute(
            "UPDATE threads SET created_at = now() - interval '25 hours' WHERE id = $1",
            first["thread_id"],
        )
        await h.provider.pool.execute(
            "UPDATE runs SET created_at = now() - interval '25 hours' WHERE thread_id = $1",
            first["thread_id"],
        )
        later = await ws_call(ws, {**frame, "id": "b"})
        assert later["type"] == "ack" and later["thread_id"] != first["thread_id"]
        # ... and that new message is itself the same however often it is sent (a review
        # found an expired key never idempotent again: a random thread each time)
        retry = await ws_call(ws, {**frame, "id": "b2"})
        assert retry["thread_id"] == later["thread_id"]
        again = await ws_call(ws, {**frame, "id": "c", "thread_id": first["thread_id"]})
        assert again["type"] == "ack"
        await h.settle()
        retry = await ws_call(ws, {**frame, "id": "c2", "thread_id": first["thread_id"]})
        assert retry["type"] == "ack"
        await h.settle()
        for thread, runs in ((first["thread_id"], 2), (later["thread_id"], 1)):
            users = [e for e in await h.store.entries_after(thread, 0) if e.kind == "user"]
            assert len(users) == runs, (thread, users)
        await ws.close()


async def test_two_sends_of_a_key_at_the_thread_quota_share_the_thread(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's finding: with room for one more thread, two sends of one keyed message
    racing both looked for the key's thread before either made it; the loser's insert
    was then refused as one thread too many: a 429 for a message whose thread exists. It
    finds that thread instead. (Each send's first look is made to miss, as in the race.)"""
    settings = Settings(quota_threads_per_minute=2)
    async with harness(database_url, model=Scripted(pix()), gateway=True, settings=settings) as h:
        user = "keys-quota"
        await h.thread(user)  # one of the two
        real = h.store.get_thread
        looks = 0

        async def raced(thread_id: str) -> Any:
            nonlocal looks
            looks += 1
            if looks in (1, 3):  # each send's first look: before the other made it
                raise NotFound(f"thread {thread_id} not found")
            return await real(thread_id)

        monkeypatch.setattr(h.store, "get_thread", raced)
        frame = {"type": "message", "text": "cobre 150 do João", "idempotency_key": "q1"}
        first, second = await ws_connect(h, user), await ws_connect(h, user)
        a = await ws_call(first, {**frame, "id": "1"})
        b = await ws_call(second, {**frame, "id": "2"})
        assert [a["type"], b["type"]] == ["ack", "ack"], (a, b)
        assert a["thread_id"] == b["thread_id"]
        await first.close()
        await second.close()


async def test_a_keyed_thread_another_send_found_is_kept_when_its_maker_fails(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's finding: the send that made a key's thread was refused (a plain 503: its
    subscription or enqueue failed) after another send of the same key had found that
    thread and queued the message; the refused send discarded the thread, still empty,
    and the queued message then found no thread: dropped after a 202. A key's thread is
    never discarded (the next send of the key finds it)."""
    async with harness(database_url, model=Scripted(pix()), gateway=True) as h:
        user = "keys-keep"
        service = h.asgi.state.service
        real = service.post_message
        other_queued, maker_waits = asyncio.Event(), asyncio.Event()
        calls = 0

        async def first_fails_late(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:  # the maker: refused, once the other send has queued
                maker_waits.set()
                await asyncio.wait_for(other_queued.wait(), 10)
                raise Unavailable("Redis is not answering; XADD not sent")
            delivery = await real(*args, **kwargs)
            other_queued.set()
            return delivery

        monkeypatch.setattr(service, "post_message", first_fails_late)
        frame = {"type": "message", "text": "cobre 150 do João", "idempotency_key": "k1"}
        maker, finder = await ws_connect(h, user), await ws_connect(h, user)
        refused = asyncio.ensure_future(ws_call(maker, {**frame, "id": "1"}))
        await asyncio.wait_for(maker_waits.wait(), 10)  # it has made the thread, and waits
        found = await ws_call(finder, {**frame, "id": "2"})
        assert found["type"] == "ack", found
        assert (await refused)["status"] == 503
        await h.settle()
        users = [e for e in await h.store.entries_after(found["thread_id"], 0) if e.kind == "user"]
        assert len(users) == 1 and len(await h.pending(found["thread_id"])) == 1
        await maker.close()
        await finder.close()
