"""Small async helpers shared by the fault tests."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import httpx

from tests.cluster import Cluster
from tests.faults.invariants import inbox_state

T = TypeVar("T")


async def wait_until(
    fn: Callable[[], Awaitable[T]], timeout: float = 30.0, every: float = 0.1, what: str = ""
) -> T:
    """Poll ``fn`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not met within {timeout:.0f}s: {what or fn}")
        await asyncio.sleep(every)


def bearer(c: Cluster, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {c.token(user)}"}


async def start_threads(
    c: Cluster, gw_url: str, users: list[str], text: str = "cobre 12 do João"
) -> list[str]:
    """One thread per user, each with one message posted; returns the thread ids."""
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=gw_url, limits=limits, timeout=30) as http:
        sem = asyncio.Semaphore(16)

        async def one(user: str) -> str:
            async with sem:
                r = await http.post("/v1/threads", headers=bearer(c, user))
                assert r.status_code == 201, r.text
                thread: str = r.json()["thread"]["id"]
                r = await http.post(
                    f"/v1/threads/{thread}/messages", json={"text": text}, headers=bearer(c, user)
                )
                assert r.status_code == 202, r.text
                return thread

        return list(await asyncio.gather(*(one(u) for u in users)))


async def pending(db: asyncpg.Connection, tenant: str, n: int) -> list[asyncpg.Record]:
    """The tenant's pending cards once there are exactly ``n`` (else an empty list)."""
    rows = await db.fetch(
        "SELECT id::text, owner, snapshot_hash, run_id::text, operation_id::text FROM cards "
        "WHERE tenant = $1 AND status = 'pending' ORDER BY created_at",
        tenant,
    )
    return rows if len(rows) == n else []


async def approve(
    c: Cluster, gw_url: str, cards: list[asyncpg.Record], decision: str = "approve"
) -> list[int]:
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=gw_url, limits=limits, timeout=30) as http:
        sem = asyncio.Semaphore(16)

        async def one(card: asyncpg.Record) -> int:
            async with sem:
                r = await http.post(
                    f"/v1/cards/{card['id']}/resolve",
                    json={"decision": decision, "snapshot_hash": card["snapshot_hash"]},
                    headers=bearer(c, card["owner"]),
                )
                return r.status_code

        return list(await asyncio.gather(*(one(card) for card in cards)))


async def count(db: asyncpg.Connection, sql: str, *args: Any) -> int:
    return int(await db.fetchval(sql, *args))


async def runs_done(db: asyncpg.Connection, tenant: str, n: int) -> bool:
    done = await count(
        db, "SELECT count(*) FROM runs WHERE tenant = $1 AND status = 'done'", tenant
    )
    return done >= n


async def runs_settled(db: asyncpg.Connection, tenant: str) -> bool:
    """No run of the tenant is `running` (each is parked, done, failed or superseded)."""
    running = await count(
        db, "SELECT count(*) FROM runs WHERE tenant = $1 AND status = 'running'", tenant
    )
    return running == 0


async def inbox_drained(c: Cluster) -> bool:
    """Every entry of the cluster's inbox was handled and acked (acked entries are deleted)."""
    return (await inbox_state(c.redis_url, c.prefix)).drained


async def quiescent(db: asyncpg.Connection, c: Cluster) -> bool:
    """Nothing left to do: the inbox drained, no run `running`, no card `approved` or
    `executing`. What a late duplicate would need is gone, so counts taken now are final."""
    if not await inbox_drained(c) or not await runs_settled(db, c.tenant):
        return False
    busy = await count(
        db,
        "SELECT count(*) FROM cards WHERE tenant = $1 AND status IN ('approved', 'executing')",
        c.tenant,
    )
    return busy == 0


def cluster_pids(root_pid: int) -> list[int]:
    """A server's process and its direct children (Postgres: the postmaster and backends)."""
    pids = [root_pid]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == root_pid:
            pids.append(int(entry))
    return pids


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


async def blast(
    url: str, path: str, body: bytes, headers: dict[str, str], n: int, conns: int
) -> list[tuple[int, bytes]]:
    """POST ``body`` to ``path`` ``n`` times over ``conns`` keep-alive connections.

    A bare HTTP/1.1 client (asyncio streams): httpx costs more CPU per request than
    the gateway does, and on 2 cores the client would be what the test measures.
    Returns (status, response body) per request.
    """
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + "\r\n"
    ).encode()
    request = head + body
    out: list[tuple[int, bytes]] = []
    share = [n // conns + (1 if i < n % conns else 0) for i in range(conns)]

    async def one_conn(k: int) -> None:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            for _ in range(k):
                writer.write(request)
                status_line = await reader.readline()
                status = int(status_line.split()[1])
                length = 0
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b""):
                        break
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                out.append((status, await reader.readexactly(length)))
        finally:
            writer.close()

    await asyncio.gather(*(one_conn(k) for k in share if k))
    return out
