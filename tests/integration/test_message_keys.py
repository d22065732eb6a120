"""A message's ``idempotency_key`` (gateway/service.py, design note 52): the same key and
text on the same thread is one message, run once however often it is sent; another text
under the same key is another message (a client reusing keys, its per-socket frame ids
say, must not have a new message dropped as a repeat). Through the HTTP API of a gateway
and a worker on real Postgres; the inbox delivers each send."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.harness import harness
from tests.integration.test_decisions import Scripted, pix

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
