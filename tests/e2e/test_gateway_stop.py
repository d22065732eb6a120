"""A graceful gateway stop: two gateway processes behind a balancer, 200 open WebSockets,
SIGTERM one gateway while the threads they follow keep writing. Every client is told 1012
("reconnect elsewhere"), reconnects to the same URL (the balancer sends it to the other
gateway), resumes after the last seq it applied, and loses or repeats no event."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from tests import services
from tests.cluster import Cluster, cluster
from tests.e2e.balancer import Balancer
from tests.e2e.test_operate import samples
from tests.faults.helpers import runs_settled

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

USERS = 20
SOCKETS_PER_USER = 10  # 200 sockets
ROUNDS = 6  # messages per thread, spread over the stop


class Client:
    """One socket following one thread, checking each event's seq is the next one."""

    def __init__(self, url: str, token: str, thread_id: str) -> None:
        self.url = url
        self.token = token
        self.thread_id = thread_id
        self.seqs: list[int] = []
        self.closes: list[int] = []
        self.errors: list[str] = []
        self.ready = asyncio.Event()
        self.stop = False
        self.phase = "new"

    @property
    def last(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    async def run(self) -> None:
        while not self.stop:
            self.phase = "connecting"
            try:
                ws = await websockets.connect(self.url, open_timeout=10)
            except Exception as exc:  # between two gateways: try again
                self.errors.append(f"connect: {exc!r}")
                await asyncio.sleep(0.1)
                continue
            try:
                await ws.send(json.dumps({"type": "auth", "token": self.token}))
                resume = {"type": "resume", "id": "r", "thread_id": self.thread_id}
                await ws.send(json.dumps({**resume, "after_seq": self.last}))
                self.phase = "sent"
                async for raw in ws:
                    frame = json.loads(raw)
                    if frame["type"] == "ready":
                        self.phase = "ready"
                    if frame["type"] == "ack" and frame.get("id") == "r":
                        self.phase = "acked"
                        self.ready.set()
                    elif frame["type"] == "event" and frame["thread_id"] == self.thread_id:
                        if frame["seq"] != self.last + 1:
                            self.errors.append(f"seq {frame['seq']} after {self.last}")
                        self.seqs.append(frame["seq"])
                    elif frame["type"] == "error":
                        self.errors.append(f"error frame {frame}")
            except ConnectionClosed:
                pass
            code = ws.close_code if ws.close_code is not None else -1
            if self.stop:
                return
            self.closes.append(code)
            if code != 1012:  # only "reconnect elsewhere" is expected here
                self.errors.append(f"closed with {code}")
                return


@pytest.mark.slow  # 12-16 s: the default run leaves it to `pytest -m slow` (CI runs it)
async def test_sigterm_moves_200_sockets_to_the_other_gateway_losing_no_event(
    database_url: str, tmp_path: Path
) -> None:
    with cluster(
        database_url,
        services.redis_url(),
        tmp_path,
        gateways=2,
        workers=1,
        SIGNOFF_DRAIN_SECONDS="3",  # time for the test to see /readyz fail on a busy machine
        SIGNOFF_QUOTA_TURNS_IN_FLIGHT="0",
        SIGNOFF_QUOTA_THREADS_PER_MINUTE="0",
        SIGNOFF_POOL_SIZE="4",  # the machine's Postgres is shared
    ) as c:
        gw0, gw1 = c.gateways
        with Balancer([gw0.port, gw1.port]) as lb:
            await scenario(c, lb)


async def scenario(c: Cluster, lb: Balancer) -> None:
    gw0, gw1 = c.gateways
    users = [f"u{i}" for i in range(USERS)]
    async with httpx.AsyncClient(base_url=gw1.url, timeout=30) as http:

        def auth(user: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {c.token(user)}"}

        threads = {}
        for user in users:
            r = await http.post("/v1/threads", headers=auth(user))
            threads[user] = r.json()["thread"]["id"]
        ws_url = lb.url.replace("http", "ws") + "/v1/ws"
        clients = [
            Client(ws_url, c.token(user), threads[user])
            for user in users
            for _ in range(SOCKETS_PER_USER)
        ]
        tasks = [asyncio.create_task(cl.run()) for cl in clients]
        await asyncio.wait_for(asyncio.gather(*(cl.ready.wait() for cl in clients)), 60)
        on_gw0 = lb.counts[gw0.port]
        assert on_gw0 > 0 and lb.counts[gw1.port] > 0, lb.counts

        async def say(user: str, n: int) -> None:
            r = await http.post(
                f"/v1/threads/{threads[user]}/messages",
                json={"text": f"saldo {n}"},
                headers=auth(user),
            )
            assert r.status_code in (200, 201, 202), r.text

        draining_seen = False
        for n in range(ROUNDS):
            await asyncio.gather(*(say(user, n) for user in users))
            if n == 1:
                # A request in flight on the stopping gateway: headers and half its body now,
                # the rest once the gateway no longer accepts connections.
                reader, writer = await asyncio.open_connection("127.0.0.1", gw0.port)
                body = json.dumps({"text": "saldo in flight"}).encode()
                writer.write(
                    f"POST /v1/threads/{threads[users[0]]}/messages HTTP/1.1\r\n"
                    f"Host: x\r\nAuthorization: Bearer {c.token(users[0])}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body[:5]
                )
                await writer.drain()
                await asyncio.sleep(0.2)
                gw0.signal(signal.SIGTERM)
                async with httpx.AsyncClient(base_url=gw0.url, timeout=5) as probe:
                    r = await probe.get("/readyz")  # fails at once, before sockets close
                    draining_seen = r.status_code == 503 and r.json()["error"] == "draining"
                await until_refused(gw0.port)
                writer.write(body[5:])
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
                assert head.startswith(b"HTTP/1.1 202"), head  # finished, then closed
                writer.close()
            await asyncio.sleep(0.4)
        assert draining_seen
        assert await asyncio.to_thread(gw0.wait, 60) == 0  # drained and exited cleanly

        # Wait until every run is over and every client has each thread's whole log.
        async def last_seq(user: str) -> int:
            r = await http.get(f"/v1/threads/{threads[user]}", headers=auth(user))
            state: dict[str, Any] = r.json()
            return int(state["last_seq"])

        deadline = time.monotonic() + 90
        db = await asyncpg.connect(c.database_url)
        while True:
            lasts = {user: await last_seq(user) for user in users}
            settled = await runs_settled(db, c.tenant)
            caught_up = all(
                cl.last == lasts[u] for cl, u in zip(clients, owners(users), strict=True)
            )
            if settled and caught_up:
                break
            if time.monotonic() > deadline:
                await db.close()
                behind = [
                    (u, cl.last, lasts[u], cl.closes, cl.phase, cl.errors[-3:])
                    for cl, u in zip(clients, owners(users), strict=True)
                    if cl.last != lasts[u]
                ]
                raise AssertionError(f"settled={settled}; {len(behind)} behind: {behind[:8]}")
            await asyncio.sleep(0.5)
        await db.close()
        # Every socket is on the gateway left.
        assert samples(c.scrape(gw1))[("signoff_websockets", ())] == len(clients)
        for cl in clients:
            cl.stop = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    errors = [e for cl in clients for e in cl.errors]  # each reconnected at its first try
    assert errors == [], errors[:10]
    for cl, user in zip(clients, owners(users), strict=True):
        # Every event of the thread exactly once, in order: nothing lost, nothing repeated.
        assert cl.seqs == list(range(1, lasts[user] + 1)), (user, cl.seqs[-5:], lasts[user])
    moved = [cl for cl in clients if cl.closes]
    assert len(moved) == on_gw0, (len(moved), on_gw0)
    assert all(cl.closes == [1012] for cl in moved)
    assert lb.counts[gw1.port] == len(clients) - on_gw0 + len(moved)  # all came to gw1
    assert sum(lasts.values()) > USERS * ROUNDS  # the threads did write during the stop
    assert "stopping: /readyz fails now" in gw0.output()


def owners(users: list[str]) -> list[str]:
    return [user for user in users for _ in range(SOCKETS_PER_USER)]


async def until_refused(port: int, timeout: float = 20) -> None:
    """Wait until nothing accepts connections on ``port`` any more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        writer.close()
        await asyncio.sleep(0.05)
    raise AssertionError(f"port {port} still accepts connections")
