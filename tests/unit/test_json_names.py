"""A payload naming an object member twice is refused (I9), whatever its size."""

from __future__ import annotations

import json

import msgspec
import pytest

from signoff.gateway.frames import decode_frame
from signoff.gateway.service import ResolveIn, one_value_per_name, parse
from signoff.runtime.cards import Risk
from signoff.runtime.errors import InvalidInput, ToolValidationError
from signoff.runtime.tools import Tool


def test_a_repeated_name_is_refused_and_named() -> None:
    with pytest.raises(InvalidInput, match="'decision' appears twice"):
        parse(b'{"decision": "reject", "decision": "approve", "snapshot_hash": "x"}', ResolveIn)
    # an escape spells the same name: still the same member
    with pytest.raises(InvalidInput, match="appears twice"):
        one_value_per_name(b'{"a": 1, "\\u0061": 2}')
    # the same name in two objects, or nested, is no repeat
    one_value_per_name(b'[{"a": 1}, {"a": 2}, {"b": {"a": 3}}]')


@pytest.mark.timeout(10)
def test_a_huge_object_with_one_repeat_is_refused_in_linear_time() -> None:
    """An unauthenticated first frame (64 KiB) or a 256 KiB body of distinct keys with one
    repeat at the end: the check was quadratic (0.44 s of a blocked event loop per 64 KiB
    frame, ~7 s per 256 KiB body). 40,000 keys would take minutes that way; the test's
    timeout stops it long before."""
    names = {f"k{i}": 0 for i in range(40_000)}
    body = json.dumps({"decision": "approve", "snapshot_hash": "x", "edits": names})
    repeated = body[:-2] + ', "k39999": 1}}'
    with pytest.raises(InvalidInput, match="'k39999' appears twice"):
        parse(repeated.encode(), ResolveIn)
    frame = json.dumps({"type": "auth", "token": "t", "edits": names})[:-2] + ', "k0": 1}}'
    with pytest.raises(InvalidInput, match="'k0' appears twice"):
        decode_frame(frame)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("frame", "body", "said"),
    [
        (b'{"type": "\xff"}', b'{"decision": "\xff"}', "not UTF-8"),
        (
            '{"type": "x", "edits": {"a": ' + DEEP + "}}",
            '{"decision": "edit", "snapshot_hash": "h", "edits": {"a": ' + DEEP + "}}",
            "nested too deeply",
        ),
    ],
    ids=["bad-utf8", "deep"],
)
def test_a_bad_frame_is_said_as_the_http_api_says_it(
    frame: bytes | str, body: bytes | str, said: str
) -> None:
    """A hostile probe: a WebSocket frame that is not UTF-8, or nested too deeply, was
    answered with Python's own words (a codec's, the recursion limit's), where the HTTP
    API says "not UTF-8" and "nested too deeply"."""
    with pytest.raises(InvalidInput) as refused:
        decode_frame(frame)
    assert str(refused.value) == f"invalid frame: {said}"
    with pytest.raises(InvalidInput) as over_http:
        parse(body if isinstance(body, bytes) else body.encode(), ResolveIn)
    assert str(over_http.value) == f"invalid payload: {said}"


def test_an_integer_beyond_2_53_is_refused_anywhere_in_a_payload() -> None:
    """I-JSON's range: a double holds these exactly, so every reader sees the number sent."""
    one_value_per_name(b'{"a": [9007199254740991, -9007199254740991, 1.5e300]}')
    for big in (b"9007199254740992", b"-9007199254740992", b"1" + b"0" * 400):
        with pytest.raises(InvalidInput, match="out of range"):
            one_value_per_name(b'{"edits": {"amount": %s}}' % big)
    with pytest.raises(InvalidInput, match="out of range"):
        parse(b'{"decision": "approve", "snapshot_hash": "x", "edits": {"n": 1e2, "m": '
              b'123456789012345678901234567890}}', ResolveIn)  # fmt: skip
    with pytest.raises(InvalidInput, match="out of range"):
        decode_frame(
            '{"type": "resolve", "id": "c1", "card_id": "x", "decision": "edit", '
            '"snapshot_hash": "h", "edits": {"amount_cents": 99999999999999999999}}'
        )


class CountIn(msgspec.Struct):
    qty: int
    tags: list[int] = msgspec.field(default_factory=list)


class Count(Tool):
    name = "count"
    description = "test tool"
    risk = Risk.REVERSIBLE
    input_type = CountIn


def test_a_tool_input_bound_holds_for_digits_given_as_a_string() -> None:
    """A code review: the gateway's bound was on JSON numbers, but a tool's input is read
    leniently (a string of digits becomes an int), so an edit {"qty": "1000...0"} froze
    10**40 into a card. The tool's parse refuses it, as the gateway refuses the number."""
    tool = Count()
    assert tool.parse({"qty": str(2**53 - 1), "tags": [-(2**53 - 1)]}) == CountIn(
        qty=2**53 - 1, tags=[-(2**53 - 1)]
    )
    for bad in ({"qty": "1" + "0" * 40}, {"qty": "9007199254740993"}, {"qty": 1, "tags": [2**60]}):
        with pytest.raises(ToolValidationError, match="out of range"):
            tool.parse(bad)
