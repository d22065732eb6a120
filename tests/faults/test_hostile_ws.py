"""Hostile WebSocket clients against a real gateway process: cross-site origins, bad
tokens, other owners, oversized frames, floods and malformed frames (I3, I9).

There is no WhatsApp channel yet, so there is no webhook to attack; its not-owner and
bad-signature cases belong here once it lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import jwt
import pytest
import redis.asyncio as aioredis
import websockets
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed, InvalidStatus

from signoff.runtime.keys import Keys
from tests import services
from tests.cluster import SECRET, Cluster, cluster
from tests.faults.conftest import Invariants, Profile
from tests.faults.helpers import count, start_threads, wait_until
from tests.faults.proxy import Proxy
from tests.faults.strategies import dumps, edit_value, json_value, nasty_text, not_utf8_json

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

ALLOWED = "https://chat.example"


@dataclass
class WsTarget:
    c: Cluster
    database_url: str

    @property
    def ws_url(self) -> str:
        return self.c.gateways[0].url.replace("http", "ws") + "/v1/ws"

    @property
    def own_origin(self) -> str:
        return self.c.gateways[0].url

    async def connect(
        self, user: str | None = "alice", origin: str | None = None, token: str | None = None
    ) -> Any:
        headers = {"Origin": origin} if origin else None
        ws = await websockets.connect(self.ws_url, additional_headers=headers, max_size=2**24)
        if user is not None:
            await ws.send(json.dumps({"type": "auth", "token": token or self.c.token(user)}))
            ready = json.loads(await ws.recv())
            assert ready["type"] == "ready", ready
        return ws


@pytest.fixture(scope="module")
def ws_target(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WsTarget]:
    with cluster(
        database_url,
        services.redis_url(),
        tmp_path_factory.mktemp("ws"),
        gateways=1,
        workers=1,
        SIGNOFF_ALLOWED_ORIGINS=ALLOWED,
    ) as c:
        yield WsTarget(c, database_url)


@pytest.fixture
async def w(ws_target: WsTarget, invariants: Invariants) -> AsyncIterator[WsTarget]:
    invariants.watch_cluster(ws_target.c)
    yield ws_target


async def reply(ws: Any, frame_id: str | None, timeout: float = 15) -> dict[str, Any]:
    while True:
        msg: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if msg.get("id") == frame_id and msg["type"] in ("ack", "resolved", "error", "ready"):
            return msg


async def a_card(w: WsTarget, user: str) -> asyncpg.Record:
    db = await asyncpg.connect(w.database_url)
    try:
        (thread,) = await start_threads(w.c, w.c.gateways[0].url, [user])
        row = await wait_until(
            lambda: db.fetchrow(
                "SELECT id::text, owner, snapshot_hash, thread_id::text FROM cards "
                "WHERE thread_id = $1 AND status = 'pending'",
                thread,
            ),
            what="the card",
        )
        assert row is not None
        return row
    finally:
        await db.close()


async def status_of(w: WsTarget, card_id: str) -> tuple[str, int]:
    db = await asyncpg.connect(w.database_url)
    try:
        status = await db.fetchval("SELECT status FROM cards WHERE id = $1", card_id)
        events = await db.fetchval("SELECT count(*) FROM card_events WHERE card_id = $1", card_id)
        return status, events
    finally:
        await db.close()


async def test_cross_site_origins_are_refused_before_accept(w: WsTarget) -> None:
    """A browser page of another site cannot open the socket: a bad, `null` or look-alike
    Origin is refused at the handshake. No Origin at all (not a browser) is let in, but
    cannot do anything before authenticating."""
    port = w.own_origin.rsplit(":", 1)[1]
    refused = [
        "https://evil.example",
        "null",
        "https://chat.example.evil.example",
        "https://evil-chat.example",
        "https://chat.example:444",
        "http://chat.example",
        "https://chat.example/",
        "https://chat.example@evil.example",
        "https://CHAT.EXAMPLE",
        f"http://127.0.0.1:{port}.evil.example",
        f"http://127.0.0.1.evil.example:{port}",
        f"http://localhost:{port}",
        "file://",
    ]
    for origin in refused:
        with pytest.raises(InvalidStatus) as info:
            await websockets.connect(w.ws_url, additional_headers={"Origin": origin})
        assert info.value.response.status_code == 403, origin
        refusal = json.loads(info.value.response.body)  # typed, not a bare 403
        assert refusal["error"] == "origin_rejected" and refusal["message"], refusal
    for origin in (ALLOWED, w.own_origin):
        ws = await w.connect(origin=origin)
        await ws.close()
    ws = await w.connect(user=None)  # no Origin header: let in, must authenticate first
    await ws.send(json.dumps({"type": "resume", "thread_id": "x", "id": "1"}))
    err = json.loads(await ws.recv())
    assert err["type"] == "error" and err["status"] == 401
    with pytest.raises(ConnectionClosed) as closed:
        await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


async def test_missing_expired_forged_tokens_and_expiry_mid_session(w: WsTarget) -> None:
    """Every bad token is a 401 and a 4401 close; a token that expires mid-session stops
    the very next frame."""
    now = int(time.time())
    claims = {"iss": "signoff", "sub": "alice", "tenant": w.c.tenant, "iat": now, "exp": now + 60}
    for token in (
        "",
        "forged",
        jwt.encode(claims, key=None, algorithm="none"),
        jwt.encode(claims, "other-secret-" + "q" * 40, algorithm="HS256"),
        jwt.encode({**claims, "exp": now - 1}, SECRET, algorithm="HS256"),
    ):
        ws = await websockets.connect(w.ws_url)
        await ws.send(json.dumps({"type": "auth", "token": token}))
        err = json.loads(await ws.recv())
        assert err["type"] == "error" and err["status"] == 401, token
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    card = await a_card(w, "short")
    short = w.c.tokens.issue("short", w.c.tenant, ttl=2)
    ws = await w.connect("short", token=short)
    await ws.send(json.dumps({"type": "resume", "thread_id": card["thread_id"], "id": "r"}))
    assert (await reply(ws, "r"))["type"] == "ack"
    # The client sends nothing more: the gateway's timer ends the session when the token
    # expires (it used to stream the thread's events until the client's next frame).
    err = await reply(ws, None, timeout=10)
    assert err["type"] == "error" and err["status"] == 401, err
    assert "expired" in err["message"], err
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert msg["type"] != "event", f"an event after the token expired: {msg}"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    late = {
        "type": "resolve",
        "id": "late",
        "card_id": card["id"],
        "decision": "approve",
        "snapshot_hash": card["snapshot_hash"],
    }
    with pytest.raises(ConnectionClosed):
        await ws.send(json.dumps(late))
    assert await status_of(w, card["id"]) == ("pending", 1)


async def test_not_owner_and_other_tenant_over_ws(w: WsTarget) -> None:
    """I3: another user of the tenant gets 403 for the card, the owner's user name in
    another tenant 404 (no card of another tenant exists for it); the card stays pending
    with only its creation audited."""
    card = await a_card(w, "owner1")
    frame = {
        "type": "resolve",
        "card_id": card["id"],
        "decision": "approve",
        "snapshot_hash": card["snapshot_hash"],
    }
    for user, tenant, status in (("mallory", w.c.tenant, 403), ("owner1", "another-tenant", 404)):
        ws = await w.connect(user, token=w.c.tokens.issue(user, tenant))
        await ws.send(json.dumps({**frame, "id": "x"}))
        err = await reply(ws, "x")
        assert err["type"] == "error" and err["status"] == status, (user, tenant, err)
        await ws.close()
    assert await status_of(w, card["id"]) == ("pending", 1)


async def test_oversized_frame_closes_only_that_socket(w: WsTarget) -> None:
    """A frame over SIGNOFF_MAX_WS_MESSAGE_BYTES (64 KiB) closes that socket with 1009;
    another user's socket on the same gateway goes on deciding."""
    card = await a_card(w, "bystander")
    other = await w.connect("bystander")
    big = await w.connect("bigmouth")
    await big.send(json.dumps({"type": "message", "text": "x" * (1 << 20), "id": "big"}))
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(big.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    await other.send(
        json.dumps(
            {
                "type": "resolve",
                "id": "ok",
                "card_id": card["id"],
                "decision": "approve",
                "snapshot_hash": card["snapshot_hash"],
            }
        )
    )
    assert (await reply(other, "ok"))["type"] == "resolved"
    await other.close()


async def test_flood_is_rate_limited_then_closed_without_hurting_others(
    w: WsTarget, invariants: Invariants
) -> None:
    """A socket sending `message` frames as fast as it can gets 429 error frames once past
    its burst, then is closed (1008) for ignoring them; only a burst's worth of messages
    reached the inbox. Meanwhile another user's whole approve round trip stays fast."""
    flooder = await w.connect("flooder")
    (thread,) = await start_threads(w.c, w.c.gateways[0].url, ["flooder"], text="saldo")
    acks = 0
    limited = 0
    closed_code: int | None = None

    async def flood() -> None:
        frame = json.dumps({"type": "message", "thread_id": thread, "text": "saldo", "id": "f"})
        try:
            for _ in range(5000):
                await flooder.send(frame)
        except ConnectionClosed:
            pass

    async def listen() -> None:
        nonlocal acks, limited, closed_code
        try:
            while True:
                msg = json.loads(await asyncio.wait_for(flooder.recv(), 30))
                if msg["type"] == "ack":
                    acks += 1
                elif msg["type"] == "error" and msg["status"] == 429:
                    assert msg["error"] == "rate_limited"
                    limited += 1
        except ConnectionClosed as exc:
            closed_code = exc.rcvd.code if exc.rcvd else None

    async def bystander() -> float:
        card = await a_card(w, "calm")
        ws = await w.connect("calm")
        t0 = time.monotonic()
        await ws.send(
            json.dumps(
                {
                    "type": "resolve",
                    "id": "calm",
                    "card_id": card["id"],
                    "decision": "approve",
                    "snapshot_hash": card["snapshot_hash"],
                }
            )
        )
        assert (await reply(ws, "calm"))["type"] == "resolved"
        took = time.monotonic() - t0
        await ws.close()
        return took

    listener = asyncio.create_task(listen())
    flooding = asyncio.create_task(flood())
    took = await bystander()
    await asyncio.wait_for(flooding, 60)
    await asyncio.wait_for(listener, 60)
    assert closed_code == 1008, (closed_code, acks, limited)
    assert limited >= 1
    assert acks <= 40 + 20 * 10, acks  # burst + rate x seconds: never the flood
    assert took < 2.0, f"a bystander's decision took {took:.2f}s during the flood"


async def test_malformed_frames_get_typed_errors_and_the_socket_survives(w: WsTarget) -> None:
    """I9: deeply nested, non-JSON, binary, wrongly typed, unknown and NUL-carrying frames
    each get a typed error frame; the socket keeps working."""
    ws = await w.connect("weird")
    frames: list[str | bytes] = [
        "[" * 30_000 + "]" * 30_000,
        '{"type": "resolve", "id": "d", "edits": ' + '{"a":' * 9_000 + "1" + "}" * 9_000 + "}",
        "{broken",
        b"\x00\xff binary",
        json.dumps({"type": ["message"], "id": "t"}),
        json.dumps({"type": "teleport", "id": "u"}),
        json.dumps({"type": "message", "text": "oi\u0000", "id": "n"}),
        json.dumps({"type": "resume", "thread_id": "not-a-uuid", "after_seq": 10**30, "id": "r"}),
        json.dumps({"type": "resolve", "card_id": "x", "decision": "approve", "id": "v"}),
    ]
    for frame in frames:
        await ws.send(frame)
        msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert msg["type"] == "error" and 400 <= msg["status"] < 500, (str(frame)[:80], msg)
    await ws.send(json.dumps({"type": "message", "text": "saldo", "id": "fine"}))
    assert (await reply(ws, "fine"))["type"] == "ack"
    await ws.close()


async def test_the_owners_odd_frames_are_refused_whole(w: WsTarget) -> None:
    """On the owner's own thread and card: a resume past a bigint was acknowledged, then
    refused, and left the socket following at a position no entry reaches (silent); a
    resolve carrying fields it does not know (``args_snapshot``) approved anyway, where
    HTTP refuses it; a NUL in a reason came back as the driver's own words. Each is now
    one typed 422, with nothing decided and nothing followed."""
    card = await a_card(w, "oddly")
    ws = await w.connect("oddly")
    thread = card["thread_id"]
    await ws.send(json.dumps({"type": "resume", "id": "far", "thread_id": thread,
                              "after_seq": 2**70}))  # fmt: skip
    first = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert (first["type"], first["id"], first["status"]) == ("error", "far", 422), first
    resolve = {"type": "resolve", "card_id": card["id"], "decision": "approve",
               "snapshot_hash": card["snapshot_hash"]}  # fmt: skip
    await ws.send(json.dumps({**resolve, "id": "ext", "args_snapshot": {"amount_cents": 1}}))
    refused = await reply(ws, "ext")
    assert (refused["type"], refused["status"]) == ("error", 422), refused
    assert "args_snapshot" in refused["message"], refused
    await ws.send(json.dumps({**resolve, "id": "nul", "decision": "reject", "reason": "a\u0000b"}))
    refused = await reply(ws, "nul")
    assert (refused["type"], refused["status"]) == ("error", 422), refused
    assert "NUL" in refused["message"] and "UTF8" not in refused["message"], refused
    # Half a surrogate pair: named as such, with the frame's id (was msgspec's "Input data
    # was truncated" and id null).
    await ws.send(json.dumps({**resolve, "id": "sur", "decision": "reject", "reason": "a\ud800"}))
    refused = await reply(ws, "sur")
    assert (refused["type"], refused["status"]) == ("error", 422), refused
    assert "lone surrogate" in refused["message"], refused
    # A member named twice: the decoder would keep the last value ("approve"), a proxy or
    # a log in front of the gateway may read the first ("reject").
    twice = json.dumps({**resolve, "id": "two"})
    await ws.send(
        twice.replace('"decision": "approve"', '"decision": "reject", "decision": "approve"')
    )
    refused = await reply(ws, "two")
    assert (refused["type"], refused["status"]) == ("error", 422), refused
    assert "'decision' appears twice" in refused["message"], refused
    assert await status_of(w, card["id"]) == ("pending", 1)
    # The socket still follows nothing odd: a resume from 0 is acknowledged, and the
    # owner's approval goes through.
    await ws.send(json.dumps({"type": "resume", "id": "zero", "thread_id": thread, "after_seq": 0}))
    assert (await reply(ws, "zero"))["type"] == "ack"
    await ws.send(json.dumps({**resolve, "id": "ok"}))
    assert (await reply(ws, "ok"))["type"] == "resolved"
    await ws.close()


async def events_of(
    ws: Any, thread_id: str, seconds: float, until: str | None = None
) -> list[dict[str, Any]]:
    """The thread's events a socket receives within ``seconds`` (other frames skipped),
    or up to the first whose JSON contains ``until``."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    with contextlib.suppress(TimeoutError):
        while (left := deadline - time.monotonic()) > 0:
            msg = json.loads(await asyncio.wait_for(ws.recv(), left))
            if msg["type"] in ("event", "delta") and msg["thread_id"] == thread_id:
                got.append(msg)
                if until is not None and until in json.dumps(msg, ensure_ascii=False):
                    break
    return got


async def test_reauth_as_another_user_drops_every_subscription(w: WsTarget) -> None:
    """I3: a socket following ra's thread sends `auth` with rb's token: from its `ready`
    on, not one event of ra's thread reaches it (it used to go on streaming them), while
    ra's own socket sees the thread go on. A renewal with ra's own fresh token keeps the
    subscription, with nothing missed."""
    (thread,) = await start_threads(w.c, w.c.gateways[0].url, ["ra"], text="saldo")
    ws = await w.connect("ra")
    await ws.send(json.dumps({"type": "resume", "thread_id": thread, "id": "r"}))
    assert (await reply(ws, "r"))["type"] == "ack"
    await ws.send(json.dumps({"type": "auth", "token": w.c.token("rb"), "id": "as-rb"}))
    ready = await reply(ws, "as-rb")
    assert ready["type"] == "ready" and ready["user"] == "rb" and ready["threads"] == [], ready
    renewed = await w.connect("ra")
    await renewed.send(json.dumps({"type": "resume", "thread_id": thread, "id": "r"}))
    assert (await reply(renewed, "r"))["type"] == "ack"
    await renewed.send(json.dumps({"type": "auth", "token": w.c.token("ra"), "id": "again"}))
    ready = await reply(renewed, "again")
    assert ready["type"] == "ready" and ready["threads"] == [thread], ready

    async with httpx.AsyncClient(base_url=w.c.gateways[0].url, timeout=30) as http:
        r = await http.post(
            f"/v1/threads/{thread}/messages",
            json={"text": "saldo de novo"},
            headers={"Authorization": f"Bearer {w.c.token('ra')}"},
        )
        assert r.status_code == 202, r.text
    seen = await events_of(renewed, thread, 15, until="saldo de novo")
    assert seen and seen[-1]["kind"] == "user", seen
    assert await events_of(ws, thread, 0.5) == []
    # rb cannot get the thread back by asking for it either
    await ws.send(json.dumps({"type": "resume", "thread_id": thread, "id": "steal"}))
    err = await reply(ws, "steal")
    assert err["type"] == "error" and err["status"] == 403, err
    await ws.close()
    await renewed.close()


@pytest.mark.slow  # 12-16 s: the default run leaves it to `pytest -m slow` (CI runs it)
async def test_a_message_is_acked_or_refused_never_half_stored(
    database_url: str, tmp_path: Path, invariants: Invariants
) -> None:
    """I9, overload: a message in a new thread whose enqueue fails (the inbox key is not a
    stream: Redis refuses XADD) or whose thread feed cannot subscribe (Redis unreachable:
    the gateway's 10 s wait for the subscription runs out) gets a typed 503 error frame;
    the socket stays open, and no thread is left without its message. (The timeout used to
    escape the socket's handler: closed with no error frame, the thread row left behind.)"""
    redis_url = services.redis_url()
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    redis = aioredis.from_url(redis_url)
    db = await asyncpg.connect(database_url)
    with (
        Proxy(port) as proxy,
        cluster(database_url, redis_url, tmp_path, gateways=0, workers=0) as c,
    ):
        invariants.watch_cluster(c, redis_url=None)  # no worker: messages stay queued
        gw = c.add_gateway(SIGNOFF_REDIS_URL=proxy.url_for(redis_url))
        target = WsTarget(c, database_url)

        async def threads_of(user: str) -> int:
            return await count(
                db, "SELECT count(*) FROM threads WHERE tenant = $1 AND owner = $2", c.tenant, user
            )

        async def alive(ws: Any) -> None:
            frame = {"type": "resume", "thread_id": str(uuid.UUID(int=0)), "id": "alive"}
            await ws.send(json.dumps(frame))
            assert (await reply(ws, "alive"))["status"] == 404

        ws = await target.connect("half")
        await ws.send(json.dumps({"type": "message", "text": "saldo", "id": "ok"}))
        ack = await reply(ws, "ok")
        assert ack["type"] == "ack", ack
        assert await threads_of("half") == 1

        inbox = Keys(c.prefix).inbox
        await redis.delete(inbox)
        await redis.set(inbox, "not a stream")
        try:
            await ws.send(json.dumps({"type": "message", "text": "saldo", "id": "x"}))
            err = await reply(ws, "x")
            assert err["type"] == "error" and err["status"] == 503, err
            await alive(ws)
            assert await threads_of("half") == 1  # the new thread was discarded
        finally:
            await redis.delete(inbox)

        proxy.refuse()
        proxy.reset()
        await ws.send(json.dumps({"type": "message", "text": "saldo", "id": "y"}))
        err = await reply(ws, "y", timeout=30)
        assert err["type"] == "error" and err["status"] == 503, err
        await alive(ws)
        assert await threads_of("half") == 1
        proxy.heal()
        await ws.close()
        assert "Traceback" not in gw.output(), gw.output()[-3000:]
    await db.close()
    await redis.aclose()


async def test_hostile_frames_never_drop_the_socket(w: WsTarget, profile: Profile) -> None:
    """I9, property-based: frames shaped like the protocol with any values (edits with huge
    numbers, lone surrogates, wrong types), arbitrary text, arbitrary binary and JSON with
    bytes that are not UTF-8, each on a fresh authenticated socket: every frame gets its
    answer or a typed 4xx error frame, the socket still answers afterwards, and the gateway
    logs no traceback."""
    card = await a_card(w, "fuzzy")
    # Messages go to this other thread of fuzzy's (or to new ones), never to the card's:
    # a new message there would supersede the card the edit frames aim at.
    (other,) = await start_threads(w.c, w.c.gateways[0].url, ["fuzzy"], text="saldo")
    gw = w.c.gateways[0]
    before = gw.output().count("Traceback")
    field = edit_value | json_value | nasty_text
    shaped = st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "resume", "resolve", "teleport", ""]) | nasty_text},
        optional={
            "thread_id": st.sampled_from([other]) | field,
            "text": field,
            "after_seq": st.integers() | field,
            "card_id": st.sampled_from([card["id"]]) | field,
            "decision": st.sampled_from(["approve", "reject", "edit"]) | field,
            "snapshot_hash": field,
            "reason": field,
            "edits": st.dictionaries(st.sampled_from(["amount", "description"]), field) | field,
        },
    )
    shaped = shaped.filter(lambda f: f["type"] != "auth")  # a bad token closes, rightly
    frame = (
        shaped.map(json.dumps)  # lone surrogates escaped: a text frame must be UTF-8
        | shaped.map(lambda f: dumps(f).encode("utf-8", "surrogatepass"))
        | st.text(max_size=200)
        | st.binary(max_size=200)
        | not_utf8_json
    )

    @settings(
        max_examples=profile.hypothesis_examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(frames=st.lists(frame, min_size=1, max_size=4))
    @example(frames=[b'{"type":"message","text":"\xff\xfe","id":"1"}'])
    @example(
        frames=[
            dumps(
                {
                    "type": "resolve",
                    "card_id": card["id"],
                    "decision": "edit",
                    "snapshot_hash": "0" * 64,
                    "edits": {"amount": "9" * 400},
                }
            )
        ]
    )
    @example(
        frames=[
            dumps(
                {
                    "type": "resolve",
                    "card_id": card["id"],
                    "decision": "edit",
                    "snapshot_hash": "0" * 64,
                    "edits": {"amount": 1e308},
                }
            )
        ]
    )
    def check(frames: list[str | bytes]) -> None:
        asyncio.run(exchange(frames))

    async def exchange(frames: list[str | bytes]) -> None:
        ws = await w.connect("fuzzy")
        try:
            for f in frames:
                await ws.send(f)
                while True:
                    msg = json.loads(await asyncio.wait_for(ws.recv(), 15))
                    if msg["type"] not in ("event", "delta"):
                        break
                if msg["type"] == "error":
                    assert 400 <= msg["status"] < 500, (f, msg)
                    assert isinstance(msg["error"], str) and isinstance(msg["message"], str)
                else:
                    assert msg["type"] in ("ack", "resolved"), (f, msg)
            await ws.send(json.dumps({"type": "resume", "thread_id": card["thread_id"], "id": "z"}))
            assert (await reply(ws, "z"))["type"] == "ack"
        finally:
            await ws.close()

    await asyncio.to_thread(check)
    assert await status_of(w, card["id"]) == ("pending", 1)
    assert gw.output().count("Traceback") == before, gw.output()[-3000:]
