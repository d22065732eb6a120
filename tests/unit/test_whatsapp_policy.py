"""The WhatsApp channel's pure parts: signature, button ids, the text-confirmation policy."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from signoff.gateway.channels.whatsapp import inbound, policy, signature
from signoff.runtime.cards import Card, Decision, Risk, Status
from signoff.runtime.errors import BadSignature
from signoff.testing import button_message, delivery, signed, text_message

SECRET = "app-secret"


def test_a_valid_signature_is_accepted() -> None:
    body = delivery(text_message("5511", "oi"))
    signature.verify(body, signed(body, SECRET)["X-Hub-Signature-256"], SECRET)


@pytest.mark.parametrize("case", ["wrong_secret", "missing", "sha1", "reserialized", "truncated"])
def test_bad_signatures_are_refused(case: str) -> None:
    body = delivery(text_message("5511", "oi"))
    good = signed(body, SECRET)["X-Hub-Signature-256"]
    header: str | None = {
        "wrong_secret": signed(body, "other")["X-Hub-Signature-256"],
        "missing": None,
        "sha1": "sha1=" + good.removeprefix("sha256=")[:40],
        "reserialized": good,
        "truncated": good[:-2],
    }[case]
    sent = json.dumps(json.loads(body), indent=1).encode() if case == "reserialized" else body
    with pytest.raises(BadSignature):
        signature.verify(sent, header, SECRET)


def test_verify_token_is_an_exact_match() -> None:
    assert signature.verify_token_matches("tok", "tok")
    assert not signature.verify_token_matches("tok ", "tok")
    assert not signature.verify_token_matches(None, "tok")
    assert not signature.verify_token_matches("", "")


CARD = "0b5e6a4e-8a8e-4a4c-9d7e-3b1f7c9a2d10"


def test_inbound_messages_and_button_ids() -> None:
    body = json.loads(
        delivery(
            text_message("551100001", "oi", "m1"), button_message("551100002", f"pa:approve:{CARD}")
        )
    )
    got = inbound.messages(body, "100")
    assert [(m.message_id, m.wa_id, m.text, m.button_id) for m in got] == [
        ("m1", "551100001", "oi", None),
        (got[1].message_id, "551100002", None, f"pa:approve:{CARD}"),
    ]
    assert inbound.parse_button(f"pa:approve:{CARD}") == (Decision.APPROVE, CARD)
    assert inbound.parse_button(f"pa:reject:{CARD.upper()}") == (Decision.REJECT, CARD)
    assert inbound.parse_button(f"pa:edit:{CARD}") is None
    assert inbound.parse_button(f"xx:approve:{CARD}") is None
    for bad in ("c", "not-a-uuid", "\x00", "a" * 10_000, ""):  # was a 500 at the store
        assert inbound.parse_button(f"pa:approve:{bad}") is None
    statuses = {"object": "whatsapp_business_account", "entry": [{"changes": [{"value": {
        "statuses": [{"id": "s", "status": "read"}]}}]}]}  # fmt: skip
    assert inbound.messages(statuses, "100") == []


@pytest.mark.parametrize(
    ("stamp", "sent"),
    [("1764000000", 1764000000), (1764000000, None), ("-5", None), ("1e9", None),
     ("9" * 40, None), (None, None), ("", None), ("١٢٣", None)],
)  # fmt: skip
def test_a_messages_timestamp_is_read_only_as_unix_seconds(stamp: object, sent: object) -> None:
    """When the person wrote (a text "ok" approves only a card shown before then); a
    timestamp of another shape is none, never an error."""
    msg: dict[str, object] = {
        "id": "m",
        "from": "551100001",
        "type": "text",
        "text": {"body": "sim"},
    }
    if stamp is not None:
        msg["timestamp"] = stamp
    [got] = inbound.messages(one(msg), "100")
    assert got.sent == sent


def waba(entry: object) -> dict[str, object]:
    return {"object": "whatsapp_business_account", "entry": entry}


def one(msg: object, to: object = "100") -> dict[str, object]:
    value = {"metadata": {"phone_number_id": to}, "messages": [msg]}
    return waba([{"changes": [{"value": value}]}])


@pytest.mark.parametrize(
    "payload",
    [
        waba(5),
        waba(["x"]),
        waba([{"changes": "abc"}]),
        waba([{"changes": [{"value": 5}]}]),
        waba([{"changes": [{"value": {"messages": "m"}}]}]),
        one({"id": "m", "from": "551100001", "type": "text", "text": "hello"}),
        one({"id": "m", "from": "551100001", "type": "interactive", "interactive": "x"}),
        one({"id": "m", "from": "551100001", "type": "interactive",
             "interactive": {"button_reply": "x"}}),
        one({"id": "m", "from": "demo", "type": "text", "text": {"body": "oi"}}),
        one({"id": "m", "from": "55\x0011", "type": "text", "text": {"body": "oi"}}),
        one({"id": "m", "from": "\x1b]0;PWNED\x07", "type": "text", "text": {"body": "oi"}}),
        one({"id": "wamid.\x00", "from": "551100001", "type": "text", "text": {"body": "oi"}}),
        one({"id": "m" * 300, "from": "551100001", "type": "text", "text": {"body": "oi"}}),
        one({"id": "m", "from": "551100001", "type": "text", "text": {"body": "\x00 \x00"}}),
    ],
)  # fmt: skip
def test_a_delivery_of_another_shape_is_dropped_not_raised(payload: object) -> None:
    """Each of these answered 500 (Meta redelivers such a delivery for days), or took a
    sender that is no phone number as a user."""
    assert inbound.messages(payload, "100") == []


def test_messages_to_another_number_of_the_app_are_dropped() -> None:
    """Meta signs every number's deliveries with the one app secret: a message written to
    another number (or naming none) is not this channel's to act on."""
    msg = {"id": "m", "from": "551100001", "type": "text", "text": {"body": "oi"}}
    assert [m.text for m in inbound.messages(one(msg), "100")] == ["oi"]
    for to in ("999", None, 100, "", {"x": 1}):
        assert inbound.messages(one(msg, to), "100") == [], to
    assert inbound.messages(waba([{"changes": [{"value": {"messages": [msg]}}]}]), "100") == []
    mixed = json.loads(delivery(text_message("551100001", "a", "m1"), phone_number_id="999"))
    mixed["entry"].append(json.loads(delivery(text_message("551100002", "b", "m2")))["entry"][0])
    assert [m.message_id for m in inbound.messages(mixed, "100")] == ["m2"]


def test_text_with_nul_or_a_lone_surrogate_is_cleaned_not_lost() -> None:
    msg = {"id": "m", "from": "551100001", "type": "text", "text": {"body": " sal\x00do\ud800 "}}
    (item,) = inbound.messages(one(msg), "100")
    assert item.text == "saldo?"


def card(risk: Risk = Risk.REVERSIBLE, status: Status = Status.PENDING) -> Card:
    now = datetime.now(UTC)
    return Card(
        id="c1", thread_id="t", run_id="r", tenant="demo", owner="5511", tool="x",
        risk=risk, args_snapshot={}, summary="s", impact={}, snapshot_hash="h",
        request_key="k", operation_id="o", status=status, expires_at=now, created_at=now,
    )  # fmt: skip


@pytest.mark.parametrize("text", ["sim", "Sim!", "SIM.", "confirmo", "Pode", "ok", "yes"])
def test_a_bare_yes_is_a_yes(text: str) -> None:
    assert policy.is_yes(text)


@pytest.mark.parametrize("text", ["sim, mas muda pra 200", "sim sim", "não", "simm", "ok?? muda"])
def test_anything_else_is_a_message(text: str) -> None:
    assert not policy.is_yes(text)


def test_text_confirmation_stays_under_the_risk_limit() -> None:
    assert policy.allowed(card(Risk.REVERSIBLE), "reversible")
    assert not policy.allowed(card(Risk.CRITICAL), "reversible")
    assert policy.allowed(card(Risk.CRITICAL), "critical")
    assert not policy.allowed(card(Risk.REVERSIBLE), "read")
    assert policy.normalize("Confirmação!") == "confirmacao"


def test_a_reaction_or_a_template_button_is_a_nudge_on_the_message_it_touches() -> None:
    react = {"id": "m1", "from": "551100001", "type": "reaction",
             "reaction": {"message_id": "wamid.card", "emoji": "👍"}}  # fmt: skip
    (item,) = inbound.messages(one(react), "100")
    assert (item.nudge, item.quoted, item.text, item.button_id) == (
        "reaction", "wamid.card", None, None,
    )  # fmt: skip
    pressed = {"id": "m2", "from": "551100001", "type": "button",
               "context": {"id": "wamid.tpl"}, "button": {"text": "Sim", "payload": "x"}}  # fmt: skip
    (item,) = inbound.messages(one(pressed), "100")
    assert (item.nudge, item.quoted, item.text) == ("template", "wamid.tpl", None)
    # Taken back (no emoji), quoting nothing, or an unreadable id: nothing to answer.
    for msg in (
        {**react, "reaction": {"message_id": "wamid.card", "emoji": ""}},
        {**react, "reaction": {"message_id": 7, "emoji": "👍"}},
        {**pressed, "context": {}},
        {**pressed, "context": {"id": "x" * 300}},
    ):
        assert inbound.messages(one(msg), "100") == []
