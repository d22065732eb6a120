"""A message whose enqueue got no answer although Redis stored it (an integrity probe,
F2): the client was told 503 ``unavailable``, no thread named for a new one, and the
message it then sent again ran twice. Now the 503 says the message may be queued and
names its thread (a new thread is kept and followed), and the same message sent again
under its ``idempotency_key`` runs once. Real processes; Redis's reply to the XADD is
held by the TCP proxy past the gateway's socket timeout."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import websockets

from signoff.testing.servers import EmbeddedServer
from tests.cluster import cluster
from tests.faults.conftest import Invariants
from tests.faults.helpers import bearer, count, wait_until
from tests.faults.proxy import Proxy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


async def runs_of(db: asyncpg.Connection, thread_id: str) -> int:
    return await count(db, "SELECT count(*) FROM runs WHERE thread_id = $1", thread_id)


async def settled(db: asyncpg.Connection, thread_id: str) -> None:
    """One pending card on the thread, and the inbox given time to run a second copy."""
    await wait_until(
        lambda: count(
            db,
            "SELECT count(*) FROM cards WHERE thread_id = $1 AND status = 'pending'",
            thread_id,
        ),
        what="the card",
    )
    await asyncio.sleep(2.0)


async def post_until_taken(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> httpx.Response:
    """Sent again while the gateway's Redis client is still stalled (it probes again)."""
    deadline = time.monotonic() + 30
    while True:
        r = await http.post(url, json=body, headers=headers)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        await asyncio.sleep(0.5)


@pytest.mark.slow  # ~11 s: the default run leaves it to `pytest -m slow` (CI runs it)
async def test_a_message_whose_enqueue_got_no_answer_runs_once_when_sent_again(
    database_url: str, valkey: EmbeddedServer, tmp_path: Path, invariants: Invariants
) -> None:
    with (
        Proxy(valkey.port) as proxy,
        cluster(database_url, valkey.url, tmp_path, gateways=0, workers=1) as c,
    ):
        invariants.watch_cluster(c)
        slow = proxy.url_for(valkey.url) + "?socket_timeout=1"
        gw = c.add_gateway(SIGNOFF_REDIS_URL=slow)
        db = await asyncpg.connect(database_url)
        try:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                auth = bearer(c, "mq-http")
                thread = (await http.post("/v1/threads", headers=auth)).json()["thread"]["id"]
                url = f"/v1/threads/{thread}/messages"
                body = {"text": "cobre 12 do João mq-http-1", "idempotency_key": "k-1"}
                proxy.hold_replies_after(b"mq-http-1", seconds=3.0)
                r = await http.post(url, json=body, headers=auth)
                assert r.status_code == 503, r.text
                said = r.json()
                assert said["error"] == "unavailable"
                assert said["detail"] == {"thread_id": thread, "idempotency_key": "k-1"}
                assert "may or may not have been queued" in said["message"]
                assert "127.0.0.1" not in r.text and str(valkey.port) not in r.text
                again = await post_until_taken(http, url, body, auth)
                assert again.status_code == 202, again.text
                await settled(db, thread)
                assert await runs_of(db, thread) == 1
                users = await count(
                    db,
                    "SELECT count(*) FROM messages WHERE thread_id = $1 AND kind = 'user'",
                    thread,
                )
                assert users == 1
                bad = await http.post(url, json={**body, "idempotency_key": "a b"}, headers=auth)
                assert bad.status_code == 422, bad.text

            # Over the WebSocket, for a message that makes its thread.
            ws = await websockets.connect(gw.url.replace("http", "ws") + "/v1/ws")
            try:
                await ws.send(json.dumps({"type": "auth", "token": c.token("mq-ws")}))
                assert json.loads(await ws.recv())["type"] == "ready"
                frame = {"type": "message", "id": "m1", "text": "cobre 13 do João mq-ws-1"}
                frame["idempotency_key"] = "k-2"
                proxy.hold_replies_after(b"mq-ws-1", seconds=3.0)
                await ws.send(json.dumps(frame))
                error = await asyncio.wait_for(_frame(ws, "m1"), 20)
                assert error["type"] == "error" and error["status"] == 503, error
                made = error["detail"]["thread_id"]
                assert await count(db, "SELECT count(*) FROM threads WHERE id = $1", made) == 1
                deadline = time.monotonic() + 30
                n = 1
                while True:
                    n += 1
                    await ws.send(json.dumps({**frame, "id": f"m{n}", "thread_id": made}))
                    answer = await asyncio.wait_for(_frame(ws, f"m{n}"), 20)
                    if answer["type"] == "ack" or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
                assert answer["type"] == "ack" and answer["thread_id"] == made, answer
                await settled(db, made)
                assert await runs_of(db, made) == 1
            finally:
                await ws.close()
            await invariants.check()
        finally:
            await db.close()


async def _frame(ws: Any, frame_id: str) -> dict[str, Any]:
    """The ack or error answering ``frame_id`` (events in between are skipped)."""
    while True:
        frame: dict[str, Any] = json.loads(await ws.recv())
        if frame.get("id") == frame_id and frame["type"] in ("ack", "error"):
            return frame
