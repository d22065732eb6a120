"""Pure logic: hashing, fingerprints, the state machine, policy, conversation, money."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from signoff.demo import demo_policy
from signoff.demo.money import brl, mask_cpf, parse_amount
from signoff.demo.tools import ALL_TOOLS, CreatePixCharge, GetBalance
from signoff.runtime.canonical import args_fingerprint, canonical_json, request_key, snapshot_hash
from signoff.runtime.cards import MOVES, TERMINAL, Status, can_move, check_move
from signoff.runtime.conversation import build_messages
from signoff.runtime.errors import IllegalTransition, ToolValidationError
from signoff.runtime.policy import Policy, Rule, Verdict
from signoff.runtime.records import Entry
from signoff.runtime.tools import Registry
from signoff.runtime.waits import WaitRegistry


def test_canonical_json_is_order_insensitive_for_keys() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == canonical_json(
        {"a": [1, {"c": 3, "d": 2}], "b": 1}
    )


def test_snapshot_hash_covers_every_part() -> None:
    base = snapshot_hash("t", {"x": 1}, "s", {"amount": 1})
    assert base == snapshot_hash("t", {"x": 1}, "s", {"amount": 1})
    assert base != snapshot_hash("u", {"x": 1}, "s", {"amount": 1})
    assert base != snapshot_hash("t", {"x": 2}, "s", {"amount": 1})
    assert base != snapshot_hash("t", {"x": 1}, "s!", {"amount": 1})
    assert base != snapshot_hash("t", {"x": 1}, "s", {"amount": 2})


def test_fingerprint_set_fields_ignore_order_and_duplicates() -> None:
    a = args_fingerprint({"ids": [3, 1, 2], "n": 1}, ["ids"])
    assert a == args_fingerprint({"n": 1, "ids": [1, 2, 3, 3]}, ["ids"])
    assert args_fingerprint({"ids": [3, 1]}) != args_fingerprint({"ids": [1, 3]})
    assert request_key("r", "t", {"a": 1}) != request_key("r2", "t", {"a": 1})


def test_state_machine() -> None:
    assert can_move(Status.PENDING, Status.APPROVED)
    assert can_move(Status.APPROVED, Status.EXECUTING)
    assert not can_move(Status.PENDING, Status.EXECUTING)
    assert not can_move(Status.REJECTED, Status.APPROVED)
    for terminal in TERMINAL:
        assert terminal not in MOVES
    with pytest.raises(IllegalTransition):
        check_move(Status.EXECUTED, Status.EXECUTING)


def test_policy_defaults_and_deny_is_final() -> None:
    pix, balance = CreatePixCharge(), GetBalance()
    empty = Policy()
    assert empty.evaluate(balance, {}, tenant="t").verdict is Verdict.ALLOW
    assert empty.evaluate(pix, {}, tenant="t").verdict is Verdict.ASK
    p = Policy(
        [
            Rule(Verdict.ALLOW, tool="create_pix_charge"),
            Rule(Verdict.DENY, tool="create_pix_charge", tenant="blocked", reason="no"),
        ]
    )
    assert p.evaluate(pix, {}, tenant="ok").verdict is Verdict.ALLOW
    out = p.evaluate(pix, {}, tenant="blocked")
    assert out.verdict is Verdict.DENY and out.reason == "no"
    role = Policy([Rule(Verdict.DENY, risk=pix.risk, role="intern")])
    assert role.evaluate(pix, {}, tenant="t", role="intern").verdict is Verdict.DENY
    assert role.evaluate(pix, {}, tenant="t", role="owner").verdict is Verdict.ASK


def test_unruled_writes_check() -> None:
    tools = Registry(ALL_TOOLS)
    assert demo_policy().unruled_writes(tools) == []
    assert Policy().unruled_writes(tools) == [
        "cancel_appointment",
        "create_pix_charge",
        "refund_sale",
        "update_email",
    ]


def test_demo_policy_denies_above_limit() -> None:
    pix = CreatePixCharge()
    assert (
        demo_policy().evaluate(pix, {"amount_cents": 2_000_000}, tenant="t").verdict is Verdict.DENY
    )
    assert demo_policy().evaluate(pix, {"amount_cents": 15_000}, tenant="t").verdict is Verdict.ASK


def test_tool_specs_are_self_contained_schemas() -> None:
    spec = CreatePixCharge().spec()
    assert spec["name"] == "create_pix_charge"
    assert "$ref" not in str(spec) and "$defs" not in str(spec)
    assert set(spec["input_schema"]["properties"]) == {"customer", "amount", "description"}
    with pytest.raises(ToolValidationError):
        CreatePixCharge().parse({"customer": "x", "amount": "1", "evil": True})


@pytest.mark.parametrize(
    ("raw", "cents"),
    [
        ("150", 15000),
        ("150,00", 15000),
        ("R$ 1.234,56", 123456),
        ("150.5", 15050),
        (80, 8000),
        (12.34, 1234),
        ("1.000.000", 100000000),
        ("1.000.000,00", 100000000),
        (1_000_000, 100000000),
        (0.1, 10),
        ("0,015", 2),
        # one mark followed by three digits groups thousands: money has no third decimal
        ("1.000", 100000),
        ("2.500", 250000),
        ("1,000.50", 100050),
        ("1.000,50", 100050),
        ("12.345", 1234500),
        ("1.5", 150),
        ("1,50", 150),
        ("1234.567", 123457),
    ],
)
def test_parse_amount(raw: Any, cents: int) -> None:
    assert parse_amount(raw) == cents


@pytest.mark.parametrize("raw", ["", "abc", "-5", "0", True, "1.000.001,00", "0,001", ".", "1,2,3"])
def test_parse_amount_refuses(raw: Any) -> None:
    with pytest.raises(ToolValidationError):
        parse_amount(raw)


@pytest.mark.parametrize("raw", ["1,234", "1,000", "12,345", "999,999", "R$ 1,234", "01,234"])
def test_one_comma_before_three_digits_is_ambiguous_and_refused(raw: str) -> None:
    """A first-hour walkthrough: a Brazilian's "cobre 1,234" was charged as R$ 1.234,00
    (an English thousands comma); in Portuguese it is one real and cents. Refused, saying
    how to write either; "1.234" (reais' own thousands mark), "1,23", "1,234.50" and
    "1,000,000" are not ambiguous."""
    with pytest.raises(ToolValidationError, match="ambiguous"):
        parse_amount(raw)
    assert parse_amount("1.234") == 123400
    assert parse_amount("1,23") == 123
    assert parse_amount("1,234.50") == 123450
    assert parse_amount("1,000,000") == 100000000


@pytest.mark.parametrize("raw", ["-20", "-1,50", " -1.000 "])
def test_a_negative_amount_is_told_it_must_be_positive(raw: str) -> None:
    """It was told "not a number of reais" (the walkthrough), while 0 was told the truth."""
    with pytest.raises(ToolValidationError, match="positive"):
        parse_amount(raw)


@pytest.mark.parametrize("raw", [0.005, "0.005", "0,005", 0.004])
def test_less_than_a_cent_is_refused_whether_written_as_text_or_number(raw: Any) -> None:
    """A probe: 0.005 as a JSON number became R$ 0,01 (the float's binary value is a hair
    over half a cent), as text it was refused."""
    with pytest.raises(ToolValidationError, match="less than R\\$ 0,01"):
        parse_amount(raw)
    assert parse_amount(0.015) == parse_amount("0,015") == 2


@pytest.mark.parametrize(
    "raw",
    [
        "9" * 400,
        "9" * 5000 + ",00",
        1e308,
        -1e308,
        float("inf"),
        float("-inf"),
        float("nan"),
        10**400,
        -(10**400),
        "1.000.000,01",
        1_000_000.01,
    ],
    ids=[
        "400-nines",
        "5000-nines",
        "1e308",
        "-1e308",
        "inf",
        "-inf",
        "nan",
        "10**400",
        "-10**400",
        "over-limit-text",
        "over-limit-float",
    ],
)
def test_parse_amount_refuses_out_of_range_with_the_typed_error(raw: Any) -> None:
    """Issue 10 item 6: 400 nines or 1e308 raised OverflowError (a 500, a crashed handler)."""
    with pytest.raises(ToolValidationError) as refused:
        parse_amount(raw)
    assert len(refused.value.message) < 100  # the model's huge text is not echoed back


def test_money_formatting() -> None:
    assert brl(15000) == "R$ 150,00"
    assert brl(123456789) == "R$ 1.234.567,89"
    assert mask_cpf("123.123.456-78") == "***.123.456-**"
    assert mask_cpf("bad") == "***"


def entry(seq: int, kind: str, content: list[dict[str, Any]]) -> Entry:
    return Entry(
        thread_id="t",
        seq=seq,
        run_id=None,
        kind=kind,
        body={"content": content},
        created_at=datetime.now(UTC),
    )


def test_conversation_merges_and_fills_dangling_tool_uses() -> None:
    use = {"type": "tool_use", "id": "tu1", "name": "x", "input": {}}
    msgs = build_messages(
        [
            entry(1, "user", [{"type": "text", "text": "a"}]),
            entry(2, "assistant", [use]),
            entry(3, "card", []),
            entry(4, "user", [{"type": "text", "text": "never mind"}]),
        ]
    )
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    first = msgs[2]["content"][0]
    assert first["type"] == "tool_result" and first["tool_use_id"] == "tu1" and first["is_error"]
    assert msgs[2]["content"][1]["text"] == "never mind"
    # a trailing assistant turn with open calls is left alone (the run is in flight)
    assert len(build_messages([entry(1, "user", []), entry(2, "assistant", [use])])) == 2


def test_wait_registry_resolves_and_drops() -> None:
    async def main() -> None:
        ready: list[str] = []
        waits = WaitRegistry(ready.append)
        waits.park("r1", ["c1", "c2"])
        assert waits.resolve("c1", "approved")
        assert not waits.resolve("c1")  # already resolved
        assert not waits.resolve("unknown")
        await asyncio.sleep(0)
        assert ready == ["r1"]
        assert waits.parked_cards() == ["c2"]
        waits.drop_run("r1")
        assert not waits.resolve("c2")
        assert len(waits) == 0
        loop = asyncio.get_running_loop()
        waits.park("r2", ["c3"], deadline=loop.time() + 0.05)
        await asyncio.sleep(0.1)
        assert ready == ["r1", "r2"]

    asyncio.run(main())


def test_card_struct_round_trips_to_json() -> None:
    from signoff.runtime.cards import Card

    now = datetime.now(UTC)
    card = Card(
        id="c",
        thread_id="t",
        run_id="r",
        tenant="x",
        owner="o",
        tool="t",
        risk="read",  # type: ignore[arg-type]
        args_snapshot={},
        summary="s",
        impact={},
        snapshot_hash="h",
        request_key="k",
        operation_id="op",
        status=Status.PENDING,
        expires_at=now,
        created_at=now,
    )
    assert msgspec.json.decode(msgspec.json.encode(card.public()))["status"] == "pending"


def test_dangling_result_tells_what_became_of_the_call() -> None:
    from signoff.runtime.conversation import DANGLING, EXECUTING, dangling_result
    from signoff.runtime.records import ToolUseOutcome

    assert dangling_result(None) == (DANGLING, True)
    for status in ("pending", "superseded", "expired"):
        assert dangling_result(ToolUseOutcome(status)) == (DANGLING, True)
    # The person decided these: never "before this was decided" (integrity probe F3).
    reason = {"en": "a new message arrived first", "pt-BR": "chegou uma mensagem"}
    text, is_error = dangling_result(ToolUseOutcome("invalidated", {"reason": reason}))
    assert is_error and text == (
        "Not completed: the user approved this, but it did not run (a new message arrived "
        "first). Nothing was executed."
    )
    text, _ = dangling_result(ToolUseOutcome("approved"))
    assert "the user approved this" in text and "before this was decided" not in text
    text, _ = dangling_result(ToolUseOutcome("rejected", None, "wrong amount"))
    assert (
        text
        == "Not completed: the user rejected this (reason: wrong amount). Nothing was executed."
    )
    assert dangling_result(ToolUseOutcome("executing")) == (EXECUTING, True)
    text, is_error = dangling_result(ToolUseOutcome("executed", {"id": "pix-1"}))
    assert not is_error and '"pix-1"' in text
    text, is_error = dangling_result(ToolUseOutcome("failed", None, "card declined"))
    assert is_error and "card declined" in text


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("redis://127.0.0.1", "redis://127.0.0.1:6379/0"),
        ("redis://LocalHost:6379", "redis://localhost:6379/0"),
        ("redis://h:6379?db=3", "redis://h:6379/3"),
        ("redis+cluster://a:7001,b:7000", "redis+cluster://b:7000,a:7001"),
        ("redis://:one@h:6379/0", "redis://user:two@h:6379/0"),
        ("redis://", "redis://localhost:6379"),  # redis-py's default host
        ("unix:///tmp/r.sock", "unix://:pw@/tmp/r.sock?db=0"),
    ],
)
def test_two_spellings_of_one_bus_are_one_bus(one: str, other: str) -> None:
    from signoff.runtime.presence import bus_identity

    assert bus_identity(one, "so:") == bus_identity(other, "so:")


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("redis://h?db=1", "redis://h?db=2"),
        ("redis://h:6379/0", "redis://h:6380/0"),
        ("redis://h/0", "rediss://h/0"),
        (None, None),  # two processes each on its own in-process bus ...
    ],
)
def test_two_buses_are_told_apart(one: str | None, other: str | None) -> None:
    from signoff.runtime.presence import bus_identity

    if one is None:  # ... are told apart by their process id
        assert bus_identity(None, "so:").startswith("in-process ")
        return
    assert bus_identity(one, "so:") != bus_identity(other, "so:")


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hun#ter2@db.internal:6379/0",
        "redis://:hun/ter2@db.internal:6379/0",
        "redis://hun#ter2@db.internal",
        "redis://:hun?ter2@db.internal:6379/0",
        "unix://:hunter2@/tmp/r.sock?db=1&password=hunter2",
        "unix://:hun/ter2@/tmp/r.sock?db=1",
    ],
)
def test_a_bus_identity_never_carries_a_password(url: str) -> None:
    """A review's finding: a password with an unescaped ``#``, ``?`` or ``/`` split the
    URL elsewhere, and a piece of it (or all of it) was stored and logged as the bus."""
    from signoff.runtime.presence import bus_identity

    said = bus_identity(url, "so:")
    assert "hun" not in said and "ter2" not in said, said


@pytest.mark.parametrize("name", ["DeadlockDetectedError", "SerializationError"])
def test_a_provider_call_rolled_back_for_a_passing_reason_is_asked_again(name: str) -> None:
    """The integrity probe's lead: a refund that met a deadlock was recorded `failed` for
    good (true, nothing written, but the approval was lost to a passing fault). The demo
    provider says it did not answer (ConnectionError): asked again with the same key."""
    import asyncio

    import asyncpg

    from signoff.demo.provider import answered

    @answered
    async def refund() -> None:
        raise getattr(asyncpg.exceptions, name)("rolled back")

    async def call() -> None:
        await refund()

    with pytest.raises(ConnectionError, match="did not answer"):
        asyncio.run(call())


def test_the_owners_audit_leaves_out_what_operators_alone_read() -> None:
    """A tool's exception text and a flag's reason may name internal hosts: the owner's
    `GET /v1/cards/{id}/events` leaves them out (a review); the rest stays."""
    from signoff.gateway.service import _for_owner

    flagged = {
        "to_status": "executing",
        "detail": {
            "needs_reconciliation": True,
            "reason": "no answer: ConnectionError('10.0.0.7:5432')",
        },
    }
    assert _for_owner(flagged)["detail"] == {"needs_reconciliation": True}
    broken = {"to_status": "invalidated", "detail": {"reason": {"en": "r"}, "error": "KeyError"}}
    assert _for_owner(broken)["detail"] == {"reason": {"en": "r"}}
    plain = {"to_status": "approved", "detail": {"reason": "ok", "edits": {"amount": 1}}}
    assert _for_owner(plain) is plain


def test_a_cards_date_is_written_as_the_demos_portuguese_cards_write_dates() -> None:
    from signoff.demo.money import br_datetime

    assert br_datetime("2026-12-08 14:00") == "08/12/2026 14:00"
    assert br_datetime("2026-12-08") == "08/12/2026"
    assert br_datetime("amanhã às 9h") == "amanhã às 9h"  # not a date it knows: as given
