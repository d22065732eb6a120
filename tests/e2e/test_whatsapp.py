"""The WhatsApp channel against real gateway and worker processes and a fake Graph API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
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


@contextlib.contextmanager
def wa_cluster(
    database_url: str, graph: FakeGraphAPI, folder: Path, **extra: str
) -> Iterator[Cluster]:
    """Two gateways with the WhatsApp channel on (Graph API faked), one worker."""
    env: dict[str, str] = {
        "SIGNOFF_WHATSAPP_PHONE_NUMBER_ID": "100",
        "SIGNOFF_WHATSAPP_TOKEN": TOKEN,
        "SIGNOFF_WHATSAPP_APP_SECRET": SECRET,
        "SIGNOFF_WHATSAPP_VERIFY_TOKEN": "verify-me",
        "SIGNOFF_WHATSAPP_BASE_URL": graph.url,
        "SIGNOFF_WHATSAPP_POLL_SECONDS": "0.1",
        **extra,
    }
    with cluster(
        database_url, services.redis_url(), folder, gateways=2, workers=1, cwd=None, **env
    ) as c:
        yield c


@pytest.fixture(scope="module")
def wa(
    database_url: str, graph: FakeGraphAPI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with wa_cluster(database_url, graph, tmp_path_factory.mktemp("wa")) as c:
        yield c


def post(c: Cluster, body: bytes, headers: dict[str, str], gw: int = 0) -> httpx.Response:
    return httpx.post(c.gateways[gw].url + "/v1/whatsapp/webhook", content=body, headers=headers)


def to(wa_id: str) -> Any:
    return lambda m: m.get("to") == wa_id


async def say_on_the_web(wa: Cluster, user: str, text: str, gw: int = 0) -> None:
    """A message in a new web thread of ``user`` (through the HTTP API, not WhatsApp)."""
    async with httpx.AsyncClient(base_url=wa.gateways[gw].url, timeout=30) as http:
        auth = {"Authorization": f"Bearer {wa.token(user)}"}
        thread = (await http.post("/v1/threads", headers=auth)).json()["thread"]["id"]
        r = await http.post(f"/v1/threads/{thread}/messages", json={"text": text}, headers=auth)
        assert r.status_code in (200, 202), r.text


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
    refused = httpx.get(url, params={**q, "hub.verify_token": "verify-m"})
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"  # typed


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


async def test_signed_deliveries_of_odd_shapes_answer_200_or_422_never_500(
    wa: Cluster, graph: FakeGraphAPI, database_url: str
) -> None:
    """Signed by the app secret, yet not what the channel handles: dropped (200) or
    refused (422), never a 500 Meta would redeliver for days. A text with a NUL is
    answered, NUL dropped (it was acknowledged, then failed in the worker: no reply)."""
    deep = (
        b'{"object":"whatsapp_business_account","entry":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    )
    assert post(wa, deep, signed(deep, SECRET)).status_code == 422
    odd = [
        {"object": "whatsapp_business_account", "entry": 5},
        {"object": "whatsapp_business_account", "entry": [{"changes": [{"value": 5}]}]},
        json.loads(delivery({**text_message("5511900000077", "x"), "text": "hello"})),
        json.loads(delivery(button_message("5511900000077", "pa:approve:not-a-uuid"))),
        json.loads(delivery(text_message("demo", "saldo"))),
    ]
    for payload in odd:
        body = json.dumps(payload).encode()
        assert post(wa, body, signed(body, SECRET)).status_code == 200, payload
    me, other = "5511900000078", "5511900000079"
    body = delivery(text_message(me, "sal\u0000do"))
    assert post(wa, body, signed(body, SECRET)).status_code == 200
    # Half a surrogate pair (JSON "\\ud800"): the whole delivery was a 422 (redelivered).
    body = delivery(text_message(other, "sal\ud800do"))
    assert b"\\ud800" in body
    assert post(wa, body, signed(body, SECRET)).status_code == 200
    for number in (me, other):
        await asyncio.to_thread(graph.wait_for, to(number), 30)
    db = await asyncpg.connect(database_url)
    try:
        assert await db.fetchval("SELECT count(*) FROM threads WHERE owner = 'demo'") == 0
        said = {
            number: await db.fetchval(
                "SELECT m.body->'content'->0->>'text' FROM messages m"
                " JOIN threads t ON t.id = m.thread_id WHERE t.owner = $1 AND m.kind = 'user'",
                number,
            )
            for number in (me, other)
        }
        assert said == {me: "saldo", other: "sal\ufffddo"}
    finally:
        await db.close()


def test_an_unsigned_chunked_body_is_not_read_past_the_limit(wa: Cluster) -> None:
    """The 1 MiB limit was checked on Content-Length only: a chunked body was read whole
    before its signature was checked (40 MB unsigned: +59 MB of gateway memory)."""
    from tests.faults.test_hostile_http import _peak_rss

    pid = wa.gateways[0].popen.pid  # type: ignore[union-attr]
    before = _peak_rss(pid)

    def chunks() -> Iterator[bytes]:
        block = b"x" * (1 << 20)
        for _ in range(40):
            yield block

    try:
        r = httpx.post(wa.gateways[0].url + "/v1/whatsapp/webhook", content=chunks(), timeout=30)
        assert r.status_code == 422, r.text
    except httpx.TransportError:
        pass  # the gateway may also stop reading and close the connection
    grown = _peak_rss(pid) - before
    assert grown < 16 << 20, f"the webhook read the body into memory: +{grown >> 20} MiB"


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
        # Meta redelivers it, to the other gateway too: still one refusal kept (dedup).
        other = delivery(button_message(stranger, approve))
        for gw in (1, 0, 1):
            assert post(wa, other, signed(other, SECRET), gw=gw).status_code == 200
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


async def say(c: Cluster, wa_id: str, text: str, gw: int = 0) -> None:
    body = delivery(text_message(wa_id, text))
    assert post(c, body, signed(body, SECRET), gw=gw).status_code == 200


async def resolve_on_web(c: Cluster, card: asyncpg.Record, decision: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(
            f"{c.gateways[1].url}/v1/cards/{card['id']}/resolve",
            json={"decision": decision, "snapshot_hash": card["snapshot_hash"]},
            headers={"Authorization": f"Bearer {c.token(card['owner'])}"},
        )


def interactive_for(card: asyncpg.Record) -> Any:
    bid = f"pa:approve:{card['id']}"
    return lambda m: (
        m.get("type") == "interactive"
        and m["interactive"]["action"]["buttons"][0]["reply"]["id"] == bid
    )


def text_to(wa_id: str, body: str) -> Any:
    return lambda m: m["to"] == wa_id and m.get("text", {}).get("body") == body


def template_to(wa_id: str, body: str) -> Any:
    def match(m: dict[str, Any]) -> bool:
        if m["to"] != wa_id or m.get("type") != "template":
            return False
        params = m["template"]["components"][0]["parameters"]
        return bool(params[0]["text"] == body and m["template"]["name"] == "signoff_notice")

    return match


async def outbound_row(db: asyncpg.Connection, card: asyncpg.Record, status: str) -> asyncpg.Record:
    """The wa_outbound row of the log entry that carried ``card``, once it has ``status``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = await db.fetchrow(
            "SELECT o.* FROM wa_outbound o JOIN messages m"
            " ON m.thread_id = o.thread_id AND m.seq = o.seq"
            " WHERE o.kind = 'card' AND m.body->>'id' = $1",
            str(card["id"]),
        )
        if row is not None and row["status"] == status:
            return row
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {status} outbound row for card {card['id']}")


async def test_a_button_naming_another_tenants_card_is_ignored_and_the_rest_is_handled(
    wa: Cluster, database_url: str
) -> None:
    """A button naming a card of another tenant is treated as naming no card: 200, the card
    untouched, no refusal recorded on it; and the text message after it in the same
    delivery is handled (the button was a 500 that failed the delivery for good, so Meta's
    redeliveries never handled the message either)."""
    me = "5511900000031"
    await say_on_the_web(wa, me, "cobra R$ 12,00 da Maria por pix", gw=1)
    db = await asyncpg.connect(database_url)
    try:
        theirs = await pending_card(db, me)
        # The same user name's card, in another tenant (the demo's customers are one
        # tenant's: the card is made there, then its thread moved).
        for table in ("threads", "runs", "cards"):
            key = "id" if table == "threads" else "thread_id"
            await db.execute(
                f"UPDATE {table} SET tenant = 'another-tenant' WHERE {key} = $1",
                theirs["thread_id"],
            )
        moved = await db.fetchrow("SELECT * FROM cards WHERE id = $1", theirs["id"])
        assert moved is not None and moved["tenant"] == "another-tenant"
        theirs = moved
        body = delivery(
            button_message(me, f"pa:approve:{theirs['id']}"),
            text_message(me, "cobra R$ 7,00 da Maria por pix"),
        )
        for gw in (0, 1):  # and as Meta redelivers it: nothing twice
            assert post(wa, body, signed(body, SECRET), gw=gw).status_code == 200
        mine = await db.fetchrow(
            "SELECT * FROM cards WHERE owner = $1 AND tenant = $2", me, wa.tenant
        )
        deadline = time.monotonic() + 30
        while mine is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            mine = await db.fetchrow(
                "SELECT * FROM cards WHERE owner = $1 AND tenant = $2", me, wa.tenant
            )
        assert mine is not None and mine["summary"] != theirs["summary"]
        assert (
            await db.fetchval("SELECT status FROM cards WHERE id = $1", theirs["id"]) == "pending"
        )
        assert (
            await db.fetchval("SELECT count(*) FROM card_refusals WHERE card_id = $1", theirs["id"])
            == 0
        )
        assert (
            await db.fetchval("SELECT count(*) FROM card_events WHERE card_id = $1", theirs["id"])
            == 1
        )
    finally:
        await db.close()


async def test_messages_to_another_number_of_the_meta_app_are_not_acted_on(
    wa: Cluster, graph: FakeGraphAPI, database_url: str
) -> None:
    """One Meta app's webhook gets every number's messages, signed with the same secret
    (a hostile probe: a button sent to another number, 999, approved a card of this
    channel's number, 100). Acknowledged, and nothing done; the same delivery's change
    for this number is handled."""
    me = "5511900000041"  # its own number: the module shares one cluster
    await say_on_the_web(wa, me, "cobra R$ 13,00 da Maria por pix", gw=0)
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        elsewhere = json.loads(
            delivery(
                button_message(me, f"pa:approve:{card['id']}", "wamid.other-1"),
                text_message(me, "cobra R$ 99,00 do João", "wamid.other-2"),
                phone_number_id="999",
            )
        )
        ours = json.loads(delivery(text_message(me, "saldo", "wamid.ours-1")))
        elsewhere["entry"].append(ours["entry"][0])
        body = json.dumps(elsewhere).encode()
        assert post(wa, body, signed(body, SECRET)).status_code == 200
        await asyncio.to_thread(graph.wait_for, to(me), 30)  # the "saldo" is answered
        await asyncio.sleep(1.0)  # room for anything else to happen
        assert await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"]) == "pending"
        assert (
            await db.fetchval("SELECT count(*) FROM card_events WHERE card_id = $1", card["id"])
            == 1
        )
        said = await db.fetch(
            "SELECT m.body->'content'->0->>'text' AS text FROM messages m"
            " JOIN threads t ON t.id = m.thread_id WHERE t.owner = $1 AND m.kind = 'user'",
            me,
        )
        texts = [row["text"] for row in said]
        assert "saldo" in texts and not any("99" in (t or "") for t in texts), texts
    finally:
        await db.close()


async def test_a_button_that_cannot_be_taken_now_is_redelivered_and_the_rest_is_handled(
    wa: Cluster, database_url: str
) -> None:
    """A button on a card of a tool this version does not serve (a rolling deploy) is not
    taken now: forgotten (Meta's redelivery tries it again) and answered 409; the text
    message after it in the same delivery is handled, and once, redelivery or not (the
    button failed the delivery with a 500 and stopped it there)."""
    me = "5511900000032"
    await say(wa, me, "cobra R$ 9,00 da Maria por pix")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        await db.execute("UPDATE cards SET tool = 'a_retired_tool' WHERE id = $1", card["id"])
        body = delivery(
            button_message(me, f"pa:approve:{card['id']}"),
            text_message(me, "cobra R$ 3,00 da Maria por pix"),
        )
        r = post(wa, body, signed(body, SECRET))
        assert r.status_code == 409 and r.json()["error"] == "unknown_tool", r.text
        deadline = time.monotonic() + 30  # the text after it was taken: its run supersedes
        while await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"]) != (
            "superseded"
        ):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        # Meta's redelivery, to the other gateway: the button is tried again (the card is
        # superseded now: answered with the notice, 200); the text is not handled twice.
        assert post(wa, body, signed(body, SECRET), gw=1).status_code == 200
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            users = await db.fetchval(
                "SELECT count(*) FROM messages m JOIN threads t ON t.id = m.thread_id "
                "WHERE t.owner = $1 AND m.kind = 'user' AND m.body::text LIKE '%3,00%'",
                me,
            )
            if users:
                break
            await asyncio.sleep(0.1)
        assert users == 1  # handled, and once
        assert (
            await db.fetchval(
                "SELECT count(*) FROM card_events WHERE card_id = $1 AND to_status = 'approved'",
                card["id"],
            )
            == 0
        )
    finally:
        await db.close()


async def test_policy_off_sim_is_a_normal_message(wa: Cluster, database_url: str) -> None:
    me = "5511900000010"
    await say(wa, me, "cancela a consulta A001")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        assert card["risk"] == "reversible"
        await say(wa, me, "sim")
        deadline = time.monotonic() + 30
        while not await db.fetchval(
            "SELECT count(*) FROM messages WHERE thread_id = $1 AND kind = 'user'"
            " AND body::text LIKE '%\"sim\"%'",
            card["thread_id"],
        ):
            assert time.monotonic() < deadline, "'sim' never reached the agent"
            await asyncio.sleep(0.1)
        # An ordinary message: the agent got it and the card it outdated was superseded.
        assert (
            await db.fetchval("SELECT status FROM cards WHERE id = $1", card["id"]) == "superseded"
        )
        assert not await db.fetchval(
            "SELECT count(*) FROM card_events WHERE card_id = $1 AND to_status = 'approved'",
            card["id"],
        )
    finally:
        await db.close()


async def test_web_decision_is_told_on_whatsapp_with_template_text(
    wa: Cluster, graph: FakeGraphAPI, database_url: str
) -> None:
    me = "5511900000011"
    await say(wa, me, "cobra R$ 31,00 da Maria por pix")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        await asyncio.to_thread(graph.wait_for, interactive_for(card))
        assert (await resolve_on_web(wa, card, "approve")).status_code == 200
        await card_status(db, card["id"], "executed")
        summary = card["summary"]
        await asyncio.to_thread(graph.wait_for, text_to(me, f"Aprovado pela API: {summary}"))
        await asyncio.to_thread(graph.wait_for, text_to(me, f"Feito: {summary}"))
    finally:
        await db.close()


async def test_outside_the_window_cards_and_notices_go_as_templates(
    wa: Cluster, graph: FakeGraphAPI, database_url: str
) -> None:
    me = "5511900000012"
    await say(wa, me, "qual o meu saldo?")
    db = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + 30
        while (thread := await db.fetchval("SELECT thread_id FROM wa_contacts WHERE wa_id = $1", me)) is None:  # fmt: skip
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        # The number last wrote two days ago; the person goes on on the web.
        await db.execute(
            "UPDATE wa_contacts SET last_inbound_at = now() - interval '2 days' WHERE wa_id = $1",
            me,
        )
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(
                f"{wa.gateways[0].url}/v1/threads/{thread}/messages",
                json={"text": "cobra R$ 32,00 da Maria por pix"},
                headers={"Authorization": f"Bearer {wa.token(me)}"},
            )
        assert r.status_code == 202, r.text
        card = await pending_card(db, me)
        summary = card["summary"]
        await asyncio.to_thread(graph.wait_for, template_to(me, summary))
        await outbound_row(db, card, "sent")
        assert graph.matching(interactive_for(card)) == []
        # Still decidable on the web; its notices go as templates too.
        assert (await resolve_on_web(wa, card, "approve")).status_code == 200
        await card_status(db, card["id"], "executed")
        await asyncio.to_thread(graph.wait_for, template_to(me, f"Aprovado pela API: {summary}"))
        await asyncio.to_thread(graph.wait_for, template_to(me, f"Feito: {summary}"))
        said = lambda m: m["to"] == me and summary in m.get("text", {}).get("body", "")  # noqa: E731
        assert graph.matching(said) == []  # nothing about this card went as free text
    finally:
        await db.close()


async def test_send_retries_on_5xx_and_429_then_sends_once(
    wa: Cluster, graph: FakeGraphAPI, database_url: str
) -> None:
    me = "5511900000013"
    card_to_me = lambda m: m["to"] == me and m.get("type") == "interactive"  # noqa: E731
    graph.fail_next(2, 503, match=card_to_me)
    graph.fail_next(1, 429, match=card_to_me)
    await say(wa, me, "cobra R$ 33,00 da Maria por pix")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        await asyncio.to_thread(graph.wait_for, interactive_for(card))
        row = await outbound_row(db, card, "sent")
        assert (row["attempts"], row["error"]) == (4, None)
        await asyncio.sleep(1.0)
        assert len(graph.matching(card_to_me)) == 1
        assert graph.attempts(card_to_me) == 4
    finally:
        await db.close()


async def test_send_failing_every_time_is_recorded_and_the_card_stays_decidable(
    wa: Cluster, graph: FakeGraphAPI, database_url: str
) -> None:
    me = "5511900000014"
    card_to_me = lambda m: m["to"] == me and m.get("type") == "interactive"  # noqa: E731
    graph.fail_next(4, 503, match=card_to_me)  # SIGNOFF_WHATSAPP_SEND_ATTEMPTS: 4
    await say(wa, me, "cobra R$ 34,00 da Maria por pix")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        row = await outbound_row(db, card, "failed")
        assert row["attempts"] == 4 and row["error"].startswith("HTTP 503")
        assert graph.matching(card_to_me) == []
        assert (await resolve_on_web(wa, card, "approve")).status_code == 200
        await card_status(db, card["id"], "executed")
    finally:
        await db.close()


async def test_a_claim_left_by_a_dead_gateway_is_sent_after_the_lease(
    wa: Cluster, graph: FakeGraphAPI, database_url: str
) -> None:
    me = "5511900000015"
    await say(wa, me, "cobra R$ 35,00 da Maria por pix")
    db = await asyncpg.connect(database_url)
    try:
        card = await pending_card(db, me)
        await asyncio.to_thread(graph.wait_for, interactive_for(card))
        row = await outbound_row(db, card, "sent")
        # What a gateway killed between claim and send leaves behind: a claim, never sent.
        dead = (
            "UPDATE wa_outbound SET status = 'claimed', claimed_by = 'gateway-dead',"
            " claimed_at = now() - make_interval(secs => $2), attempts = 0,"
            " wa_message = NULL, sent_at = NULL WHERE key = $1"
        )
        await db.execute(dead, row["key"], 0.0)
        await asyncio.sleep(1.5)  # within the lease (30 s): nobody touches it
        assert len(graph.matching(interactive_for(card))) == 1
        assert (
            await db.fetchval("SELECT claimed_by FROM wa_outbound WHERE key = $1", row["key"])
            == "gateway-dead"
        )
        await db.execute(dead, row["key"], 31.0)  # the lease has run out
        taken = await outbound_row(db, card, "sent")
        assert taken["claimed_by"] != "gateway-dead" and taken["attempts"] == 1
        await asyncio.to_thread(
            graph.wait_for, lambda m: len(graph.matching(interactive_for(card))) == 2
        )
        await asyncio.sleep(1.0)  # taken over once, by one gateway
        assert len(graph.matching(interactive_for(card))) == 2
    finally:
        await db.close()
