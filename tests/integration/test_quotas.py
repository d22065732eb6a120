"""Per-user quotas and slow-client deadlines on a real gateway (uvicorn, real Postgres):
every refusal is a typed 429 (Retry-After; an error frame on a WebSocket) that changes
nothing, and slow headers or bodies cannot hold a connection (gateway/quotas.py,
gateway/timeouts.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from signoff.gateway import timeouts
from signoff.gateway.auth import Principal
from signoff.gateway.quotas import Quotas
from signoff.runtime.bus import Job
from signoff.runtime.bus.memory import MemoryBus
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.canonical import run_id_of
from signoff.runtime.config import Settings
from signoff.runtime.errors import MaybeQueued, RateLimited, Unavailable
from signoff.runtime.keys import Keys
from signoff.store.postgres import PostgresStore
from signoff.testing import delivery, signed, text_message
from signoff.testing.servers import free_port
from tests import services
from tests.conftest import end_runs
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, pix

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _end_runs(database_url: str) -> Iterator[None]:
    yield
    end_runs(database_url, "t-nored")


LIMITS = Settings(
    quota_threads_per_minute=3,
    quota_turns_in_flight=3,
    quota_sockets=2,
    header_timeout_seconds=1.0,
    body_timeout_seconds=1.0,
)


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    """A gateway with small limits and no running worker: accepted messages stay queued."""
    async with harness(
        database_url, model=Scripted(pix()), gateway=True, settings=LIMITS, start_worker=False
    ) as hh:
        yield hh


def auth(h: Harness, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {h.token(user)}"}


async def threads_of(h: Harness, user: str) -> int:
    n = await h.store.pool.fetchval(
        "SELECT count(*) FROM threads WHERE tenant = $1 AND owner = $2", h.tenant, user
    )
    return int(cast(int, n))


async def queued_jobs(h: Harness) -> list[Job]:
    """Drain the in-process inbox (nothing else takes from it: the worker is not started)."""
    assert isinstance(h.bus, MemoryBus)
    jobs: list[Job] = []
    while deliveries := await h.bus.take("test", 0.05):
        jobs += [d.job for d in deliveries]
    return jobs


def refused(r: httpx.Response, quota: str) -> None:
    assert r.status_code == 429, r.text
    body = r.json()
    assert body["error"] == "rate_limited" and body["detail"]["quota"] == quota, body
    assert 1 <= int(r.headers["retry-after"]) <= 60, r.headers
    assert body["detail"]["retry_after"] == int(r.headers["retry-after"])


# -- threads per minute -----------------------------------------------------------------


async def test_the_n_plus_1th_thread_in_a_minute_is_refused_and_not_created(h: Harness) -> None:
    async with httpx.AsyncClient(base_url=h.base_url) as c:
        for _ in range(3):
            r = await c.post("/v1/threads", headers=auth(h, "ana"))
            assert r.status_code == 201, r.text
        r = await c.post("/v1/threads", headers=auth(h, "ana"))
        refused(r, "threads_per_minute")
        assert await threads_of(h, "ana") == 3
        # Another user, and the same name in another tenant, have their own quota.
        r = await c.post("/v1/threads", headers=auth(h, "bia"))
        assert r.status_code == 201
        other = h.tokens.issue("ana", "another-tenant")
        r = await c.post("/v1/threads", headers={"Authorization": f"Bearer {other}"})
        assert r.status_code == 201
    # Over a WebSocket, a message with no thread_id (a new thread) gets a 429 error frame.
    ws = await ws_open(h, "ana")
    await ws.send(json.dumps({"type": "message", "id": "m1", "text": "saldo"}))
    reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert reply["type"] == "error" and reply["status"] == 429, reply
    assert reply["id"] == "m1" and reply["detail"]["quota"] == "threads_per_minute"
    await ws.close()
    assert await threads_of(h, "ana") == 3
    assert await queued_jobs(h) == []


async def test_a_burst_of_thread_creations_never_overshoots(h: Harness) -> None:
    async with httpx.AsyncClient(base_url=h.base_url, timeout=30) as c:
        rs = await asyncio.gather(
            *(c.post("/v1/threads", headers=auth(h, "burst")) for _ in range(30))
        )
    codes = sorted(r.status_code for r in rs)
    assert codes == [201] * 3 + [429] * 27, codes
    assert await threads_of(h, "burst") == 3


# -- turns in flight --------------------------------------------------------------------


async def post(c: httpx.AsyncClient, h: Harness, thread: str, user: str) -> httpx.Response:
    return await c.post(
        f"/v1/threads/{thread}/messages", json={"text": "cobre 12"}, headers=auth(h, user)
    )


async def test_the_n_plus_1th_concurrent_turn_is_refused_and_not_enqueued(h: Harness) -> None:
    threads = [await h.thread("caio") for _ in range(5)]
    async with httpx.AsyncClient(base_url=h.base_url) as c:
        for t in threads[:3]:
            assert (await post(c, h, t, "caio")).status_code == 202
        refused(await post(c, h, threads[3], "caio"), "turns_in_flight")
        # Someone else's turns are theirs.
        assert (await post(c, h, await h.thread("dora"), "dora")).status_code == 202
        jobs = await queued_jobs(h)
        assert sorted(j.user for j in jobs) == ["caio"] * 3 + ["dora"]

        # A worker starts the three runs: still three turns in flight, not six.
        runs = []
        for job in (j for j in jobs if j.user == "caio"):
            run, _, _, created = await h.store.start_run(
                job.thread_id,
                owner=job.user,
                role=job.role,
                holder=h.settings.worker_id,
                lease_seconds=30,
                content=[{"type": "text", "text": job.text}],
                actor=job.user,
                channel=job.channel,
                run_id=run_id_of(job.message_id),
            )
            assert created and str(run.status) == "running"
            runs.append(run)
        refused(await post(c, h, threads[3], "caio"), "turns_in_flight")

        # One run parks on a card (waiting: no model turn) and one finishes: two free slots.
        await h.store.set_run(runs[0].id, "waiting", {}, holder=h.settings.worker_id)
        await h.store.set_run(runs[1].id, "done", {}, holder=h.settings.worker_id)
        assert (await post(c, h, threads[3], "caio")).status_code == 202
        assert (await post(c, h, threads[4], "caio")).status_code == 202
        refused(await post(c, h, threads[4], "caio"), "turns_in_flight")
    assert len(await queued_jobs(h)) == 2


async def test_a_burst_of_turns_never_overshoots(h: Harness) -> None:
    threads = [await h.thread("eva") for _ in range(30)]
    async with httpx.AsyncClient(base_url=h.base_url, timeout=30) as c:
        rs = await asyncio.gather(*(post(c, h, t, "eva") for t in threads))
    accepted = [r for r in rs if r.status_code == 202]
    assert {r.status_code for r in rs} <= {202, 429}
    assert 1 <= len(accepted) <= 3, [r.status_code for r in rs]
    assert len(await queued_jobs(h)) == len(accepted)


async def test_a_turn_over_websocket_past_the_quota_gets_a_429_frame(h: Harness) -> None:
    threads = [await h.thread("fabi") for _ in range(4)]
    ws = await ws_open(h, "fabi")
    for i, t in enumerate(threads):
        await ws.send(json.dumps({"type": "message", "id": f"m{i}", "thread_id": t, "text": "x"}))
        while True:
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if reply.get("id") == f"m{i}":
                break
        if i < 3:
            assert reply["type"] == "ack", reply
        else:
            assert reply["type"] == "error" and reply["status"] == 429, reply
            assert reply["detail"]["quota"] == "turns_in_flight"
    await ws.close()
    assert len(await queued_jobs(h)) == 3


# -- open WebSockets --------------------------------------------------------------------


async def ws_open(h: Harness, user: str) -> Any:
    ws = await websockets.connect(h.base_url.replace("http", "ws") + "/v1/ws")
    await ws.send(json.dumps({"type": "auth", "token": h.token(user)}))
    ready = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert ready["type"] == "ready", ready
    return ws


async def test_the_n_plus_1th_socket_is_refused(h: Harness) -> None:
    first = await ws_open(h, "gil")
    second = await ws_open(h, "gil")
    third = await websockets.connect(h.base_url.replace("http", "ws") + "/v1/ws")
    await third.send(json.dumps({"type": "auth", "id": "a", "token": h.token("gil")}))
    reply = json.loads(await asyncio.wait_for(third.recv(), 10))
    assert reply["type"] == "error" and reply["status"] == 429, reply
    assert reply["id"] == "a" and reply["detail"]["quota"] == "sockets"
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(third.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4429
    # Someone else still gets in; a closed socket gives its slot back.
    other = await ws_open(h, "hana")
    await first.close()
    deadline = time.monotonic() + 5
    while True:
        try:
            again = await ws_open(h, "gil")
            break
        except (AssertionError, ConnectionClosed):
            assert time.monotonic() < deadline, "the closed socket's slot never came back"
            await asyncio.sleep(0.05)
    # The sockets that got in work as before.
    thread = await h.thread("gil")
    await again.send(json.dumps({"type": "resume", "id": "r", "thread_id": thread}))
    reply = json.loads(await asyncio.wait_for(again.recv(), 10))
    assert reply["type"] == "ack", reply
    for ws in (second, other, again):
        await ws.close()


# -- slow clients -----------------------------------------------------------------------


async def raw_connection(h: Harness) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    url = urlsplit(h.base_url)
    assert url.hostname is not None and url.port is not None
    return await asyncio.open_connection(url.hostname, url.port)


async def trickle_until_closed(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, limit: float
) -> tuple[float, bytes]:
    """Send ``data`` a byte every 0.1 s (then nothing) until the server closes; returns how
    long that took and what the server sent. Fails if it is still open after ``limit``."""
    t0 = time.monotonic()
    got = bytearray()

    async def read() -> None:
        # A byte sent after the server closed is answered with a reset, which is how a
        # close looks from here then (what came before it was read first).
        with contextlib.suppress(ConnectionResetError):
            while chunk := await reader.read(4096):
                got.extend(chunk)

    reading = asyncio.create_task(read())
    try:
        for byte in data:
            if reading.done() or time.monotonic() - t0 > limit:
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.1)
        try:
            await asyncio.wait_for(asyncio.shield(reading), max(limit - (time.monotonic() - t0), 0))
        except TimeoutError:
            raise AssertionError(f"still open after {limit}s; got {bytes(got)!r}") from None
    finally:
        reading.cancel()
        writer.close()
    return time.monotonic() - t0, bytes(got)


async def trickled_post(h: Harness, path: str, limit: float) -> tuple[float, bytes]:
    """ivo's POST to ``path`` announcing a 1000-byte JSON body, then sent a byte every
    0.1 s (:func:`trickle_until_closed`)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {h.token('ivo')}\r\n"
        f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    reader, writer = await raw_connection(h)
    writer.write(head)
    await writer.drain()
    return await trickle_until_closed(reader, writer, b"x" * 1000, limit=limit)


async def test_slow_headers_are_cut_at_the_header_timeout(h: Harness) -> None:
    headers = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200
    took, got = await trickle_until_closed(*await raw_connection(h), headers, limit=5)
    assert took < 2.5, took
    assert got.startswith(b"HTTP/1.1 408"), got
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"] == "request_timeout"
    # A connection that never sends a byte is closed too (without a response).
    took, got = await trickle_until_closed(*await raw_connection(h), b"", limit=5)
    assert took < 2.5 and got == b"", (took, got)


async def test_slow_body_gets_a_typed_408_and_changes_nothing(h: Harness) -> None:
    thread = await h.thread("ivo")
    body = json.dumps({"text": "cobre 12 do João"}).encode()
    head = (
        f"POST /v1/threads/{thread}/messages HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {h.token('ivo')}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) + 100}\r\n\r\n"
    ).encode()
    reader, writer = await raw_connection(h)
    writer.write(head)
    await writer.drain()
    took, got = await trickle_until_closed(reader, writer, body, limit=5)
    assert took < 2.5, took
    assert got.startswith(b"HTTP/1.1 408"), got
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"] == "request_timeout"
    assert await queued_jobs(h) == []
    # A body on a request that needs none (POST /v1/threads) is read all the same before
    # anything is done: cut at the deadline, and no thread made (it was made before).
    before = await threads_of(h, "ivo")
    took, got = await trickled_post(h, "/v1/threads", limit=6)
    assert took < 3.5, took
    assert got.startswith(b"HTTP/1.1 408"), got
    assert await threads_of(h, "ivo") == before


async def test_a_body_cut_by_the_connections_deadline_gets_the_typed_408_too(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection's own body deadline (the handler's plus a grace) cut bodies no
    handler answered for in time without a word: on a loaded CI machine the handler's
    408 came later than the grace, and the client saw its connection reset."""
    monkeypatch.setattr(timeouts, "BODY_GRACE", -0.5)  # the connection's cut comes first
    thread = await h.thread("ivo")
    took, got = await trickled_post(h, f"/v1/threads/{thread}/messages", limit=5)
    assert took < 1.0, took
    assert got.startswith(b"HTTP/1.1 408"), got
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"] == "request_timeout"
    assert await queued_jobs(h) == []


async def test_a_body_does_not_skip_admission(h: Harness) -> None:
    """Requests are admitted against SIGNOFF_MAX_IN_FLIGHT once whole. A request that
    carried a body its handler never reads (a GET with one byte, say) used to skip
    admission altogether."""
    thread = await h.thread("ada")
    admission = h.asgi.state.service.admission
    limit, admission.limit = admission.limit, 1
    admission.enter()  # the one slot is taken
    try:
        async with httpx.AsyncClient(base_url=h.base_url, headers=auth(h, "ada")) as http:
            plain = await http.get(f"/v1/threads/{thread}")
            bodied = await http.request("GET", f"/v1/threads/{thread}", content=b"x")
            made = await http.request("POST", "/v1/threads", content=b"{}")
        for r in (plain, bodied, made):
            assert r.status_code == 503 and r.json()["error"] == "overloaded", r.text
        assert await threads_of(h, "ada") == 1
    finally:
        admission.leave()
        admission.limit = limit
    async with httpx.AsyncClient(base_url=h.base_url, headers=auth(h, "ada")) as http:
        assert (await http.request("GET", f"/v1/threads/{thread}", content=b"x")).status_code == 200
        assert (await http.request("POST", "/v1/threads", content=b"{}")).status_code == 201


async def test_deadlines_leave_kept_alive_connections_and_websockets_alone(h: Harness) -> None:
    ws = await ws_open(h, "joca")
    reader, writer = await raw_connection(h)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(2):  # the same connection, idle past both deadlines (1 s each) between
        writer.write(request)
        await writer.drain()
        status = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert status.startswith(b"HTTP/1.1 200"), status
        assert json.loads(await asyncio.wait_for(reader.read(100), 5)) == {"ok": True}
        await asyncio.sleep(2.5)
    writer.close()
    thread = await h.thread("joca")
    await ws.send(json.dumps({"type": "resume", "id": "r", "thread_id": thread}))
    reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert reply["type"] == "ack", reply
    await ws.close()


# -- the Redis ledger -------------------------------------------------------------------


async def test_redis_window_adds_each_see_every_add_before_them() -> None:
    bus = RedisBus.from_url(services.redis_url(), Keys(f"so-q-{secrets.token_hex(3)}:"))
    key = bus.keys.accepted_turns("t", "u")
    try:
        now = int(time.time() * 1000)
        seen = await asyncio.gather(*(bus.window_add(key, f"m{i}", now, 60_000) for i in range(50)))
        assert sorted(len(s) for s in seen) == list(range(1, 51))
        await bus.window_remove(key, [f"m{i}" for i in range(49)])
        assert await bus.window_add(key, "late", now + 70_000, 60_000) == ["late"]
    finally:
        await bus.close()


async def test_without_redis_the_turn_quota_counts_postgres_only(
    database_url: str, store: PostgresStore
) -> None:
    dead = RedisBus.from_url(f"redis://127.0.0.1:{free_port()}/0", Keys())
    quotas = Quotas(store=store, ledger=dead, keys=Keys(), turns_in_flight=1)
    who = Principal(f"u-{secrets.token_hex(3)}", "t-nored")
    try:
        async with quotas.turn(who, str(uuid.uuid4())):
            pass  # admitted: nothing running in Postgres, the ledger unreachable
        thread = await store.create_thread(who.tenant, who.user)
        await store.start_run(
            thread.id,
            owner=who.user,
            role="user",
            holder="w-nored",
            lease_seconds=30,
            content=[{"type": "text", "text": "x"}],
            actor=who.user,
            channel="test",
        )
        with pytest.raises(RateLimited):
            async with quotas.turn(who, str(uuid.uuid4())):
                raise AssertionError("admitted past a running turn")
    finally:
        await dead.close()


async def test_a_message_that_may_have_been_queued_keeps_its_turn(
    database_url: str, store: PostgresStore
) -> None:
    """A review's finding: an enqueue with no answer (MaybeQueued: the message may run)
    gave its turn back, so the next message was admitted past the quota while that one
    waited in the inbox. A refusal still gives it back. Real Redis for the window."""
    bus = RedisBus.from_url(services.redis_url(), Keys(f"q-{secrets.token_hex(3)}:"))
    quotas = Quotas(store=store, ledger=bus, keys=Keys(), turns_in_flight=1)
    who = Principal(f"u-{secrets.token_hex(3)}", "t-maybe")
    try:
        with pytest.raises(Unavailable):
            async with quotas.turn(who, str(uuid.uuid4())):
                raise Unavailable("refused: nothing queued")
        with pytest.raises(MaybeQueued):
            async with quotas.turn(who, str(uuid.uuid4())):  # admitted: the first gave back
                raise MaybeQueued("may or may not have been queued", thread_id="t")
        with pytest.raises(RateLimited):
            async with quotas.turn(who, str(uuid.uuid4())):
                raise AssertionError("admitted past a message that may be queued")
    finally:
        await bus.close()


WA_SECRET = "wa-secret"


async def test_whatsapp_messages_count_against_the_turn_quota(database_url: str) -> None:
    """A number's messages are model turns like the web's: over the quota a delivery is
    answered 429, nothing is queued and the message is not marked seen, so Meta's
    redelivery is handled once the number is back under its quota."""
    settings = Settings(
        quota_turns_in_flight=1,
        quota_queued_seconds=1.0,
        whatsapp_phone_number_id="100",
        whatsapp_token="wa-token",
        whatsapp_app_secret=WA_SECRET,
        whatsapp_verify_token="verify",
        whatsapp_base_url="http://127.0.0.1:9",  # nothing is sent in this test
    )
    async with harness(
        database_url, model=Scripted(pix()), gateway=True, settings=settings, start_worker=False
    ) as h:
        wa_id = "55119" + str(secrets.randbelow(10**8)).zfill(8)
        first = text_message(wa_id, "cobre 10 do João")
        second = text_message(wa_id, "cobre 20 do João")

        async def post(message: dict[str, Any]) -> httpx.Response:
            body = delivery(message)
            async with httpx.AsyncClient(base_url=h.base_url) as client:
                return await client.post(
                    "/v1/whatsapp/webhook", content=body, headers=signed(body, WA_SECRET)
                )

        async def seen(message: dict[str, Any]) -> bool:
            return bool(
                await h.store.pool.fetchval(
                    "SELECT handled FROM deliveries WHERE channel = 'whatsapp' AND message_id = $1",
                    message["id"],
                )
            )

        assert (await post(first)).status_code == 200
        r = await post(second)
        refused(r, "turns_in_flight")
        assert await seen(first) and not await seen(second)
        jobs = await queued_jobs(h)
        assert [j.text for j in jobs] == ["cobre 10 do João"]

        # The first message was never started: it stops counting after the queued time,
        # and Meta's redelivery of the second is then taken, once.
        await asyncio.sleep(1.3)
        assert (await post(second)).status_code == 200
        assert (await post(second)).status_code == 200  # a duplicate is ignored
        assert [j.text for j in await queued_jobs(h)] == ["cobre 20 do João"]
        assert await seen(second)
