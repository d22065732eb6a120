"""The WhatsApp channel against real gateway and worker processes and a fake Graph API."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from signoff.testing import FakeGraphAPI, button_message, delivery, signed, text_message
from tests import services
from tests.cluster import Cluster, cluster

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

SECRET = "wa-app-secret"
TOKEN = "wa-token"


@pytest.fixture(scope="module")
def graph() -> Iterator[FakeGraphAPI]:
    with FakeGraphAPI(token=TOKEN) as g:
        yield g


@pytest.fixture(scope="module")
def wa(
    database_url: str, graph: FakeGraphAPI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    env: dict[str, str] = {
        "SIGNOFF_WHATSAPP_PHONE_NUMBER_ID": "100",
        "SIGNOFF_WHATSAPP_TOKEN": TOKEN,
        "SIGNOFF_WHATSAPP_APP_SECRET": SECRET,
        "SIGNOFF_WHATSAPP_VERIFY_TOKEN": "verify-me",
        "SIGNOFF_WHATSAPP_BASE_URL": graph.url,
        "SIGNOFF_WHATSAPP_POLL_SECONDS": "0.1",
    }
    with cluster(
        database_url,
        services.redis_url(),
        tmp_path_factory.mktemp("wa"),
        gateways=2,
        workers=1,
        cwd=None,
        **env,
    ) as c:
        yield c


def post(c: Cluster, body: bytes, headers: dict[str, str], gw: int = 0) -> httpx.Response:
    return httpx.post(c.gateways[gw].url + "/v1/whatsapp/webhook", content=body, headers=headers)


def to(wa_id: str) -> Any:
    return lambda m: m.get("to") == wa_id


async def pending_card(db: asyncpg.Connection, wa_id: str, timeout: float = 30) -> asyncpg.Record:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = await db.fetchrow(
            "SELECT * FROM cards WHERE owner = $1 AND status = 'pending' ORDER BY created_at DESC",
            wa_id,
        )
        if row is not None:
            return row
        await asyncio.sleep(0.1)
    raise AssertionError("no pending card")


async def card_status(db: asyncpg.Connection, card_id: Any, want: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await db.fetchval("SELECT status FROM cards WHERE id = $1", card_id) == want:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"card never {want}")


def test_verification_handshake(wa: Cluster) -> None:
    url = wa.gateways[0].url + "/v1/whatsapp/webhook"
    q = {"hub.mode": "subscribe", "hub.verify_token": "verify-me", "hub.challenge": "42abc"}
    r = httpx.get(url, params=q)
    assert (r.status_code, r.text) == (200, "42abc")
    assert httpx.get(url, params={**q, "hub.verify_token": "verify-m"}).status_code == 403


@pytest.mark.parametrize("case", ["wrong_secret", "missing", "sha1", "reserialized", "truncated"])
async def test_bad_signature_is_401_and_stores_nothing(
    wa: Cluster, database_url: str, case: str
) -> None:
    msg = text_message(f"55119{len(case):02d}{ord(case[0])}", "cobra 10 da Maria")
    body = delivery(msg)
    good = signed(body, SECRET)
    headers = {
        "wrong_secret": signed(body, "nope"),
        "missing": {"Content-Type": "application/json"},
        "sha1": {"X-Hub-Signature-256": "sha1=" + good["X-Hub-Signature-256"][7:47]},
        "reserialized": good,
        "truncated": {"X-Hub-Signature-256": good["X-Hub-Signature-256"][:-1]},
    }[case]
    sent = (
        json.dumps(json.loads(body), separators=(",", ":")).encode()
        if case == "reserialized"
        else body
    )
    assert post(wa, sent, headers).status_code == 401
    db = await asyncpg.connect(database_url)
    try:
        assert (
            await db.fetchval("SELECT count(*) FROM deliveries WHERE message_id = $1", msg["id"])
            == 0
        )
        assert await db.fetchval("SELECT count(*) FROM threads WHERE owner = $1", msg["from"]) == 0
    finally:
        await db.close()
    assert post(wa, body, good).status_code == 200  # the same body, signed: accepted


async def test_charge_end_to_end_then_duplicates_and_strangers(
    wa: Cluster, graph: FakeGraphAPI, database_url: str
) -> None:
    me, stranger = "5511900000002", "5511900000099"
    body = delivery(text_message(me, "cobra R$ 25,00 da Maria por pix"))
    assert post(wa, body, signed(body, SECRET)).status_code == 200
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        sent = await asyncio.to_thread(
            graph.wait_for, lambda m: m["to"] == me and m["type"] == "interactive"
        )
        assert sent["interactive"]["body"]["text"] == card["summary"]
        buttons = sent["interactive"]["action"]["buttons"]
        approve = buttons[0]["reply"]["id"]
        assert approve == f"pa:approve:{card['id']}" and all(
            len(b["reply"]["title"]) <= 20 for b in buttons
        )

        # Another number presses the button: refused, kept, the card unchanged.
        other = delivery(button_message(stranger, approve))
        assert post(wa, other, signed(other, SECRET), gw=1).status_code == 200
        assert await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"]) == "pending"
        refused = await db.fetch(
            "SELECT actor, reason FROM card_refusals WHERE card_id = $1", card["id"]
        )
        assert [(r["actor"], r["reason"]) for r in refused] == [(stranger, "not_owner")]

        # The owner's button, delivered 50 times at once to two gateways: one decision.
        click = delivery(button_message(me, approve))
        headers = signed(click, SECRET)
        async with httpx.AsyncClient(timeout=60) as client:
            answers = await asyncio.gather(*(
                client.post(wa.gateways[i % 2].url + "/v1/whatsapp/webhook", content=click, headers=headers)
                for i in range(50)
            ))  # fmt: skip
        assert [a.status_code for a in answers] == [200] * 50
        await card_status(db, card["id"], "executed")
        decisions = await db.fetchval(
            "SELECT count(*) FROM card_events WHERE card_id = $1 AND to_status = 'approved'",
            card["id"],
        )
        assert decisions == 1
        assert (
            await db.fetchval("SELECT channel FROM cards WHERE id = $1", card["id"]) == "whatsapp"
        )
        charges = await db.fetchval(
            "SELECT count(*) FROM demo_charges WHERE idempotency_key = $1",
            str(card["operation_id"]),
        )
        assert charges == 1
        done = await asyncio.to_thread(
            graph.wait_for,
            lambda m: (
                m["to"] == me and m["type"] == "text" and m["text"]["body"].startswith("Feito:")
            ),
        )
        assert card["summary"] in done["text"]["body"]
        await asyncio.sleep(1.0)  # every gateway's courier has looked again: still one each
        assert len(graph.matching(lambda m: m["to"] == me and m["type"] == "interactive")) == 1
        assert (
            len(
                graph.matching(
                    lambda m: (
                        m["to"] == me and m.get("text", {}).get("body", "").startswith("Feito:")
                    )
                )
            )
            == 1
        )

        # A late button on the decided card is answered with the notice, nothing acts.
        late = delivery(button_message(me, approve))
        assert post(wa, late, signed(late, SECRET)).status_code == 200
        notice = await asyncio.to_thread(
            graph.wait_for,
            lambda m: m["to"] == me and "já foi" in m.get("text", {}).get("body", ""),
        )
        assert "no WhatsApp" in notice["text"]["body"]
        assert (
            await db.fetchval(
                "SELECT count(*) FROM demo_charges WHERE idempotency_key = $1",
                str(card["operation_id"]),
            )
            == 1
        )
    finally:
        await db.close()
