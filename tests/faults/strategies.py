"""Hypothesis strategies shared by the hostile-input tests (HTTP bodies, WebSocket frames,
edit values): ordinary JSON, and the values a parser, a database or a number conversion
chokes on."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=50)
)
json_value = st.recursive(
    json_leaf,
    lambda kids: (
        st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=10), kids, max_size=5)
    ),
    max_leaves=25,
)
# Text with the characters a database or a parser chokes on (NUL, surrogates, digits that
# are not 0-9), mixed into ordinary text.
nasty_text = st.text(max_size=40) | st.builds(
    lambda a, b, c: a + b + c,
    st.text(max_size=10),
    st.sampled_from(["\x00", "\ud800", "\udfff", "²", "٣", "\u202e", "\ufeff", "\U0001f4b8"]),
    st.text(max_size=10),
)
# Byte sequences that are not UTF-8 (a stray continuation byte, a truncated sequence, an
# encoded surrogate, an overlong form, a 5-byte form).
not_utf8 = st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80"])
# JSON whose string values hold such bytes (msgspec raised UnicodeDecodeError on them).
not_utf8_json = st.builds(
    lambda key, bad, text: b'{"' + key + b'":"' + text.encode() + bad + b'"}',
    st.sampled_from([b"type", b"decision", b"snapshot_hash", b"reason", b"text"]),
    not_utf8,
    st.text(alphabet=st.characters(codec="ascii", exclude_characters='"\\'), max_size=10),
)
# Values a person may type into an edit form, and what a hostile client may send instead:
# huge digit strings, floats at the edge of range, exponents, non-ASCII digits, any JSON.
edit_value = (
    json_value
    | st.integers(min_value=1, max_value=600).map(lambda n: "9" * n)
    | st.floats(allow_nan=False).map(repr)
    | st.floats(allow_nan=False, allow_infinity=False, min_value=1e300)
    | st.sampled_from(["1e308", "1e309", "-1e308", "1e-400", "9" * 400 + ".5", "٣", "²", "1_000"])
    | nasty_text
)


def dumps(value: Any) -> str:
    """JSON text as a client would send it (non-ASCII as is, lone surrogates escaped)."""
    return json.dumps(value, ensure_ascii=False)
