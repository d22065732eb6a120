"""Two gateways' couriers and a slow Graph API (gateway/channels/whatsapp/courier.py).

A review's finding: a courier's batch held up by slow sends outlived its claims' lease;
another gateway took over the rows still waiting (as it does for a dead gateway's) and
sent them, and then the first sent them too: each message twice. A courier now asks,
before each attempt, whether the claim is still its own (renewing it if so), and leaves
a row another gateway has taken over. Real Postgres rows, a fake Graph API over HTTP."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from signoff.gateway.channels.whatsapp.courier import Courier
from signoff.gateway.channels.whatsapp.graph import GraphSender
from signoff.runtime.config import Settings
from signoff.store.postgres import PostgresStore
from signoff.testing import FakeGraphAPI
from tests.conftest import migrated_database

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def own_database() -> Iterator[str]:
    """A database of this module's own: a courier claims every WhatsApp entry due in its
    database, and the session's holds other tests' (CI's run claimed nine, not three)."""
    yield from migrated_database("so_wa")


@pytest.fixture
async def store(own_database: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.connect(own_database)
    try:
        yield s
    finally:
        await s.close()


async def test_a_row_another_gateway_took_over_is_not_sent_again(store: PostgresStore) -> None:
    tenant, wa_id = f"t-{secrets.token_hex(3)}", f"55119{secrets.randbelow(10**8):08d}"
    thread = await store.create_thread(tenant, wa_id)
    await store.whatsapp.add_contact(tenant, wa_id, thread.id)
    await store.whatsapp.touch_inbound(tenant, wa_id)
    texts = [f"answer {i} {secrets.token_hex(2)}" for i in range(3)]
    for text in texts:
        body = {"role": "assistant", "content": [{"type": "text", "text": text}]}
        await store.append(thread.id, "assistant", body)
    settings = Settings(whatsapp_claim_lease_seconds=0.5)
    with FakeGraphAPI() as graph:

        def sender() -> GraphSender:
            return GraphSender(
                base_url=graph.url, api_version="v21.0", phone_number_id="1", token="t"
            )

        slow = sender()
        post = slow._post

        def slowly(payload: dict[str, Any]) -> Any:
            time.sleep(0.45)  # each send within the lease, the batch of three past it
            return post(payload)

        slow._post = slowly  # type: ignore[method-assign]
        first = Courier(store.whatsapp, slow, settings, "gateway-a")
        other = Courier(store.whatsapp, sender(), settings, "gateway-b")
        batch = asyncio.create_task(first.tick())
        claimed = "SELECT count(*) FROM wa_outbound WHERE thread_id = $1 AND claimed_by = $2"
        while await store.db.fetchval(claimed, thread.id, "gateway-a") < 3:
            await asyncio.sleep(0.01)  # the first gateway's batch holds all three
        taken = 0
        while not taken and not batch.done():  # until a row's claim lapses mid-batch
            taken = await other.tick()  # ... and the other gateway takes it over
            await asyncio.sleep(0.02)
        assert taken >= 1
        assert await batch == 3
    sent = [m["text"]["body"] for m in graph.sent if m.get("type") == "text"]
    assert sorted(sent) == sorted(texts), sent
    rows = await store.db.fetch(
        "SELECT status, claimed_by FROM wa_outbound WHERE thread_id = $1 ORDER BY seq", thread.id
    )
    assert [r["status"] for r in rows] == ["sent"] * 3
    assert "gateway-b" in [r["claimed_by"] for r in rows]


async def test_a_late_finish_does_not_overwrite_the_gateway_that_took_the_row_over(
    store: PostgresStore,
) -> None:
    """A review's finding: a send that outlived the lease (one slow attempt), its row
    taken over and sent by another gateway, then recorded its own outcome over the other
    gateway's ("sent" turned "failed"). A finish counts only while its gateway holds the
    row; an anonymous finish (``claimer`` None) is as before."""
    key = f"reply:{secrets.token_hex(4)}"
    await store.whatsapp.claim_reply(key, "t-late", "5511900000099", "notice", "gateway-a", 30.0)
    await store.db.execute("UPDATE wa_outbound SET claimed_by = 'gateway-b' WHERE key = $1", key)
    await store.whatsapp.finish_outgoing(key, "sent", 1, None, "wamid.b", "gateway-b")
    await store.whatsapp.finish_outgoing(key, "failed", 4, "timed out", None, "gateway-a")
    row = await store.db.fetchrow(
        "SELECT status, wa_message, attempts FROM wa_outbound WHERE key = $1", key
    )
    assert row is not None
    assert dict(row) == {"status": "sent", "wa_message": "wamid.b", "attempts": 1}


async def test_one_slow_attempt_keeps_its_claim_and_is_sent_once(store: PostgresStore) -> None:
    """An attempt answered after the claim's lease (a reply trickled in: the socket
    timeout is per operation) is not taken over by a live gateway's neighbour: its claim
    is renewed while the attempt waits (design note 57). Before, the other gateway
    reclaimed the row after the lease and sent it, and the first's answer came too."""
    tenant, wa_id = f"t-{secrets.token_hex(3)}", f"55119{secrets.randbelow(10**8):08d}"
    thread = await store.create_thread(tenant, wa_id)
    await store.whatsapp.add_contact(tenant, wa_id, thread.id)
    await store.whatsapp.touch_inbound(tenant, wa_id)
    said = f"slow answer {secrets.token_hex(3)}"
    body = {"role": "assistant", "content": [{"type": "text", "text": said}]}
    await store.append(thread.id, "assistant", body)
    settings = Settings(whatsapp_claim_lease_seconds=0.5)
    with FakeGraphAPI() as graph:

        def sender() -> GraphSender:
            return GraphSender(
                base_url=graph.url,
                api_version="v21.0",
                phone_number_id="1",
                token="t",
                hold_every=settings.whatsapp_claim_lease_seconds / 3,
            )

        slow = sender()
        post = slow._post

        def slowly(payload: dict[str, Any]) -> Any:
            time.sleep(2.0)  # one attempt, four leases long
            return post(payload)

        slow._post = slowly  # type: ignore[method-assign]
        first = Courier(store.whatsapp, slow, settings, "gateway-a")
        other = Courier(store.whatsapp, sender(), settings, "gateway-b")
        batch = asyncio.create_task(first.tick())
        claimed = "SELECT count(*) FROM wa_outbound WHERE thread_id = $1 AND claimed_by = $2"
        while await store.db.fetchval(claimed, thread.id, "gateway-a") < 1:
            await asyncio.sleep(0.01)
        taken = 0
        while not batch.done():
            taken += await other.tick()
            await asyncio.sleep(0.05)
        assert taken == 0
        assert await batch == 1
    sent = [m["text"]["body"] for m in graph.sent if m.get("type") == "text"]
    assert sent == [said]
    rows = await store.db.fetch(
        "SELECT status, claimed_by FROM wa_outbound WHERE thread_id = $1", thread.id
    )
    assert [(r["status"], r["claimed_by"]) for r in rows] == [("sent", "gateway-a")]


async def test_a_reply_abandoned_unsent_is_taken_back_by_its_redelivery(
    store: PostgresStore,
) -> None:
    """A review: a gateway that stopped between claiming a direct answer (a "sim" told how
    to decide) and sending it left the row claimed (then closed as failed by the
    reclaim); Meta's redelivery found the reply claimed and sent nothing, so the person
    got no answer at all. An abandoned claim (no attempt made) is taken back; one sent,
    tried, or still live is not."""
    claim = store.whatsapp.claim_reply
    key = f"reply:{secrets.token_hex(4)}"
    assert await claim(key, "t-re", "5511900000098", "notice", "gateway-a", 30.0)
    assert not await claim(key, "t-re", "5511900000098", "notice", "gateway-b", 30.0)  # live
    await store.db.execute(  # gateway-a stopped: past the lease
        "UPDATE wa_outbound SET claimed_at = now() - interval '31 seconds' WHERE key = $1", key
    )
    assert await claim(key, "t-re", "5511900000098", "notice", "gateway-b", 30.0)
    await store.db.execute(  # closed as failed by the reclaim, never tried
        "UPDATE wa_outbound SET status = 'failed', error = 'stopped' WHERE key = $1", key
    )
    assert await claim(key, "t-re", "5511900000098", "notice", "gateway-c", 30.0)
    row = await store.db.fetchrow(
        "SELECT status, claimed_by, error FROM wa_outbound WHERE key = $1", key
    )
    assert row is not None and dict(row) == {
        "status": "claimed", "claimed_by": "gateway-c", "error": None,
    }  # fmt: skip
    await store.whatsapp.finish_outgoing(key, "failed", 4, "Graph said no", None, "gateway-c")
    assert not await claim(key, "t-re", "5511900000098", "notice", "gateway-d", 30.0)  # tried
    await store.db.execute(
        "UPDATE wa_outbound SET status = 'sent', attempts = 1 WHERE key = $1", key
    )
    assert not await claim(key, "t-re", "5511900000098", "notice", "gateway-d", 30.0)
