"""The workers' scheduled prune, in real worker processes: an old, finished thread is
deleted by one of two workers, its executed card's audit exported first; a thread with a
pending card is left alone."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from signoff.store.postgres import PostgresStore
from signoff.testing.cluster import cluster
from tests import services
from tests.conftest import drop_database, fresh_database

pytestmark = pytest.mark.timeout(180)


def wait_for(fn: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} timed out")


def a_card(c: httpx.Client) -> tuple[str, dict[str, Any]]:
    thread = c.post("/v1/threads").json()["thread"]["id"]
    c.post(f"/v1/threads/{thread}/messages", json={"text": "cobre 150 do João"})
    card = wait_for(lambda: c.get(f"/v1/threads/{thread}").json()["pending_cards"], "card")[0]
    return thread, card


@pytest.fixture
def own_database() -> Iterator[str]:
    """A database of its own: the rule below applies to every tenant in it."""
    url, name = fresh_database("so_prune")
    yield url
    drop_database(name)


def sql(url: str, query: str, *args: object) -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetchval(query, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


def migrate(url: str) -> None:
    async def go() -> None:
        store = await PostgresStore.connect(url)
        try:
            await store.migrate()
        finally:
            await store.close()

    asyncio.run(go())


def test_workers_prune_on_their_schedule(own_database: str, tmp_path: Path) -> None:
    url = own_database
    migrate(url)
    archive = tmp_path / "audit"
    with cluster(
        url,
        services.redis_url(),
        tmp_path,
        gateways=1,
        workers=2,
        SIGNOFF_RETENTION_DAYS="1",
        SIGNOFF_RETENTION_INTERVAL_SECONDS="0.5",
        SIGNOFF_RETENTION_ARCHIVE_DIR=str(archive),
    ) as c:
        (gw,) = c.gateways
        headers = {"Authorization": f"Bearer {c.token('ana')}"}
        with httpx.Client(base_url=gw.url, headers=headers, timeout=10) as http:
            done, card = a_card(http)
            r = http.post(
                f"/v1/cards/{card['id']}/resolve",
                json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
            )
            assert r.status_code == 200
            wait_for(
                lambda: http.get(f"/v1/cards/{card['id']}").json()["card"]["status"] == "executed",
                "executed",
            )
            kept, _ = a_card(http)  # pending: never pruned, however old
        for table, column in (("threads", "id"), ("messages", "thread_id")):
            sql(
                url,
                f"UPDATE {table} SET created_at = now() - interval '2 days' "
                f"WHERE {column} = ANY($1::uuid[])",
                [done, kept],
            )
        wait_for(
            lambda: sql(url, "SELECT count(*) FROM threads WHERE id = $1::uuid", done) == 0,
            "the scheduled prune",
        )
        assert sql(url, "SELECT count(*) FROM threads WHERE id = $1::uuid", kept) == 1
        lines = [json.loads(x) for f in archive.glob("*.jsonl") for x in f.read_text().splitlines()]
        assert [x["id"] for x in lines] == [card["id"]]
