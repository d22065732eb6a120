"""Text that goes on a card: one line, no control or format characters, a bounded length.

Pure, no I/O. A card's summary is written by code, but tools put values into it
that came from the model or from a provider (a charge description, an e-mail, a
customer name). Shown verbatim, a newline or a bidi override in such a value can
draw a line that looks like the card's own ("Valor: R$ 1,00" under a charge of
R$ 9.000,00). :func:`one_line` makes any such value inert before the card is
frozen, so the hash binds the cleaned text, which is exactly what the person sees.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# Cc: C0/C1 controls (newlines, tabs, ESC); Cf: format characters (bidi embeddings,
# overrides and isolates U+202A-202E, U+2066-2069, marks U+200E/200F, zero-width
# characters, soft hyphen, BOM); Cs: lone surrogates (no valid UTF-8 encodes them);
# Zl/Zp: the line and paragraph separators U+2028/U+2029.
_DROPPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Characters that draw nothing yet are neither whitespace nor format characters: the
# braille blank, the Hangul fillers, the combining grapheme joiner, the Khmer inherent
# vowels. A run of them filled a card's row, so that the words after it ("Valor: R$
# 1,00") stood at the start of a line of their own (a hostile probe); they count as
# spaces, and a run of them collapses to one.
BLANK = frozenset("\u2800\u3164\u115f\u1160\uffa0\u034f\u17b4\u17b5")

ELLIPSIS = "…"


def some_names(names: list[str], shown: int = 10, chars: int = 60) -> str:
    """Names for an error message, at most ``shown`` of them, each cut at ``chars``, and
    how many more (a hostile probe: an edit of 15,000 unknown fields was answered with
    every name, 109 KB)."""
    listed = ", ".join(n if len(n) <= chars else n[: chars - 1] + ELLIPSIS for n in names[:shown])
    more = len(names) - shown
    return listed + (f" and {more} more" if more > 0 else "")


def one_line(text: str, limit: int) -> str:
    """``text`` as one inert line of at most ``limit`` characters.

    Whitespace of any kind (newlines included) and characters that draw nothing
    (``BLANK``) become a space, other control and
    format characters are removed, runs of spaces collapse to one, the ends are
    trimmed, and a longer result is cut and ends with an ellipsis. Idempotent:
    ``one_line(one_line(t, n), n) == one_line(t, n)``.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    kept = "".join(
        " " if ch.isspace() or ch in BLANK else ch
        for ch in text
        if ch.isspace() or unicodedata.category(ch) not in _DROPPED
    )
    line = " ".join(kept.split())
    if len(line) <= limit:
        return line
    return line[: limit - 1].rstrip() + ELLIPSIS


def terminal_safe(text: str) -> str:
    """``text`` for a terminal: every control and format character but the newline
    removed (an operator's terminal obeys escapes, carriage returns and bidi overrides
    found in a value a person typed, e.g. a rejection's reason), the rest untouched."""
    return "".join(ch for ch in text if ch == "\n" or unicodedata.category(ch) not in _DROPPED)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(value: Any) -> Any:
    """``value`` with every string in it (keys too) fit for Postgres text and UTF-8: NUL
    characters removed, lone surrogates (half a pair, from a JSON ``"\\ud800"``) made
    U+FFFD. What a model or a tool returns is stored; one such character failed the
    whole write with the driver's words (a hostile probe)."""
    if isinstance(value, str):
        if value.isascii():
            return value.replace("\x00", "") if "\x00" in value else value
        return _LONE_SURROGATE.sub("\ufffd", value.replace("\x00", ""))
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value
