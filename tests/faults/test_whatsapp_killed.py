"""A gateway killed while it handles a WhatsApp message: the message is not lost.

A hostile probe: a delivery was marked seen by its first statement, before it was
handled, so a gateway killed in between (an OOM kill, a SIGKILL at deploy) left it seen,
and every redelivery from Meta was answered 200 and dropped: the person's approval never
applied (the card stayed pending), their message never reached the thread. A delivery is
now claimed for a lease and marked handled once its effect committed (design note 64):
a redelivery after the lease handles it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from signoff.testing import FakeGraphAPI, button_message, delivery, signed, text_message
from tests.cluster import Cluster
from tests.e2e.test_whatsapp import SECRET, TOKEN, card_status, pending_card, post, wa_cluster
from tests.faults.conftest import Invariants

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

LEASE = 2.0


@pytest.fixture(scope="module")
def graph() -> Iterator[FakeGraphAPI]:
    with FakeGraphAPI(token=TOKEN) as g:
        yield g


@pytest.fixture
def wa(database_url: str, graph: FakeGraphAPI, tmp_path: Path) -> Iterator[Cluster]:
    with wa_cluster(
        database_url,
        graph,
        tmp_path,
        SIGNOFF_WHATSAPP_DELIVERY_LEASE_SECONDS=str(LEASE),
    ) as c:
        yield c


async def killed_while_handling(
    wa: Cluster, db: asyncpg.Connection, number: str, body: bytes, message_id: str
) -> None:
    """Gateway 0 claims the delivery and is held (the number's contact row locked here),
    then killed; the delivery is sent again to gateway 1 until it is answered 200."""
    lock = await asyncpg.connect(wa.database_url)
    tx = lock.transaction()
    await tx.start()
    await lock.execute("SELECT 1 FROM wa_contacts WHERE wa_id = $1 FOR UPDATE", number)
    first = threading.Thread(
        target=lambda: _quietly(lambda: post(wa, body, signed(body, SECRET), gw=0)), daemon=True
    )
    first.start()
    deadline = time.monotonic() + 20
    claimed = "SELECT 1 FROM deliveries WHERE channel = 'whatsapp' AND message_id = $1"
    while await db.fetchval(claimed, message_id) is None:
        assert time.monotonic() < deadline, "gateway 0 never claimed the delivery"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # held on the contact row, past its claim
    wa.gateways[0].signal(signal.SIGKILL)
    wa.gateways[0].wait(10)
    await tx.rollback()
    await lock.close()
    # Meta sends it again until it is answered 200.
    deadline = time.monotonic() + 30
    while True:
        r = post(wa, body, signed(body, SECRET), gw=1)
        if r.status_code == 200:
            break
        assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
        assert time.monotonic() < deadline, "never taken again"
        await asyncio.sleep(0.5)


def _quietly(call: object) -> None:
    try:
        call()  # type: ignore[operator]
    except httpx.HTTPError:
        pass  # its gateway was killed


async def test_an_approval_whose_gateway_was_killed_applies_on_redelivery(
    wa: Cluster, database_url: str, invariants: Invariants
) -> None:
    invariants.watch(database_url, wa.tenant)
    me = "5511900000301"
    first = delivery(text_message(me, "cobra R$ 25,00 da Maria por pix"))
    assert post(wa, first, signed(first, SECRET), gw=1).status_code == 200
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        press = button_message(me, f"pa:approve:{card['id']}")
        await killed_while_handling(wa, db, me, delivery(press), press["id"])
        await card_status(db, card["id"], "executed")  # it stayed pending
        approvals = await db.fetchval(
            "SELECT count(*) FROM card_events WHERE card_id = $1 AND to_status = 'approved'",
            card["id"],
        )
        assert approvals == 1
        body = delivery(press)  # later redeliveries: handled, dropped
        assert post(wa, body, signed(body, SECRET), gw=1).status_code == 200
    finally:
        await db.close()
    await invariants.check()


async def test_a_message_whose_gateway_was_killed_reaches_its_thread_on_redelivery(
    wa: Cluster, database_url: str, invariants: Invariants
) -> None:
    invariants.watch(database_url, wa.tenant)
    me = "5511900000302"
    first = delivery(text_message(me, "oi"))
    assert post(wa, first, signed(first, SECRET), gw=1).status_code == 200
    db = await asyncpg.connect(database_url)
    try:
        text = "cobra R$ 31,00 do Pedro por pix"
        message = text_message(me, text)
        await killed_while_handling(wa, db, me, delivery(message), message["id"])
        deadline = time.monotonic() + 30
        query = (
            "SELECT count(*) FROM messages m JOIN wa_contacts c ON c.thread_id = m.thread_id "
            "WHERE c.wa_id = $1 AND m.kind = 'user' AND strpos(m.body::text, $2) > 0"
        )
        while await db.fetchval(query, me, text) != 1:  # it never reached the thread
            assert time.monotonic() < deadline, "the message never reached its thread"
            await asyncio.sleep(0.1)
        again = delivery(message)
        assert post(wa, again, signed(again, SECRET), gw=1).status_code == 200
        await asyncio.sleep(1.0)
        assert await db.fetchval(query, me, text) == 1  # once
    finally:
        await db.close()
    await invariants.check()
