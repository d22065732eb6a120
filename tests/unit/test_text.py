"""Card text: model-supplied values cannot draw lines of their own on a card (issue 10 item 8)."""

from __future__ import annotations

import unicodedata
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from signoff.runtime.canonical import snapshot_hash
from signoff.runtime.cards import Risk
from signoff.runtime.proposal import new_card
from signoff.runtime.text import BLANK, ELLIPSIS, one_line
from signoff.runtime.tools import Prepared, Tool, ToolContext

FORGED = "pedido 42\n**Valor: R$ 1,00**\u202e00,1 $R\u202c\u2028\u2066x\u2069"
BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F)}
DROPPED = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def test_one_line_drops_newlines_and_bidi_controls() -> None:
    assert one_line(FORGED, 140) == "pedido 42 **Valor: R$ 1,00**00,1 $R x"
    assert one_line("  a\t\tb\r\n\x00c\x1b[31m  ", 50) == "a b c[31m"
    assert one_line("e\u200bvil\u00ad\ufeff", 50) == "evil"
    assert one_line("abcdef", 4) == "abc" + ELLIPSIS
    assert one_line("ab  cdef", 4) == "ab" + ELLIPSIS  # no space before the ellipsis
    assert one_line("abcd", 4) == "abcd"
    assert one_line("João Conceição", 50) == "João Conceição"
    with pytest.raises(ValueError):
        one_line("x", 0)


@given(st.text(), st.integers(min_value=1, max_value=300))
@example(FORGED, 20)
@example("\ud800a\n\u2029b", 3)
def test_one_line_is_one_inert_bounded_line(text: str, limit: int) -> None:
    out = one_line(text, limit)
    assert len(out) <= limit
    assert not {ch for ch in out if unicodedata.category(ch) in DROPPED}
    assert not BIDI & set(out)
    assert all(not ch.isspace() or ch == " " for ch in out)
    assert not BLANK & set(out)  # nothing that draws nothing: a row cannot be filled
    assert "  " not in out and out == out.strip()
    assert one_line(out, limit) == out  # idempotent
    out.encode("utf-8")  # no lone surrogate survives


@given(
    st.text(
        alphabet=st.characters(categories=["L", "N", "P", "S"], exclude_characters=BLANK),
        max_size=50,
    )
)
def test_one_line_keeps_clean_text(text: str) -> None:
    assert one_line(text, 50) == text


def test_characters_that_draw_nothing_cannot_push_words_onto_a_line_of_their_own() -> None:
    # A hostile probe: 118 braille blanks filled the description's row, and "Valor: R$
    # 1,00" after them read as a row of its own above the real amount.
    forged = "\u2800" * 118 + " Valor: R$ 1,00"
    assert one_line(forged, 500) == "Valor: R$ 1,00"
    assert one_line("a\u3164\u3164b\u115f\u1160c\uffa0d\u034fe", 50) == "a b c d e"


class ForgeIn(msgspec.Struct):
    note: str


class Forge(Tool):
    """A tool that lets model text into its summary and its labelled fields."""

    name = "forge"
    description = "test tool"
    risk = Risk.CRITICAL
    input_type = ForgeIn

    async def prepare(self, data: Any, ctx: ToolContext) -> Prepared:
        assert isinstance(data, ForgeIn)
        return Prepared(
            args={"amount_cents": 900_000, "note": data.note},
            summary=f"Gerar cobrança Pix · Valor: R$ 9.000,00 · Nota: {data.note}",
            impact={"amount": "R$ 9.000,00"},
            fields={"Descrição\n": data.note},
        )


async def _frozen(note: str) -> Any:
    tool = Forge()
    prepared = await tool.prepare(tool.parse({"note": note}), ToolContext(tenant="t", user="u"))
    return new_card(
        tool,
        prepared,
        thread_id="th",
        run_id="r",
        tenant="t",
        owner="u",
        tool_use_id="tu",
        raw_input={"note": note},
    )


@pytest.mark.anyio
async def test_card_summary_and_fields_are_cleaned_before_the_hash() -> None:
    card = await _frozen(FORGED)
    assert "\n" not in card.summary and not BIDI & set(card.summary)
    assert card.summary == (
        "Gerar cobrança Pix · Valor: R$ 9.000,00 · Nota: pedido 42 **Valor: R$ 1,00**00,1 $R x"
    )
    assert card.impact["fields"] == [
        {"label": "Descrição", "value": "pedido 42 **Valor: R$ 1,00**00,1 $R x"}
    ]
    assert card.impact["risk"] == "critical" and card.impact["amount"] == "R$ 9.000,00"
    # The hash binds the cleaned text: exactly what the person is shown.
    assert card.snapshot_hash == snapshot_hash(
        "forge", card.args_snapshot, card.summary, card.impact
    )


@pytest.mark.anyio
async def test_card_without_fields_has_no_fields_key() -> None:
    tool = Forge()
    prepared = Prepared(args={}, summary="s", impact={"target": "x"})
    card = new_card(
        tool,
        prepared,
        thread_id="th",
        run_id="r",
        tenant="t",
        owner="u",
        tool_use_id="tu",
        raw_input={},
    )
    assert card.impact == {"risk": "critical", "target": "x"}


@pytest.mark.anyio
async def test_impact_values_the_page_shows_are_cleaned_before_the_hash() -> None:
    """The hostile prober's case: a provider's customer named with a bidi override. The
    summary was cleaned, but the card's Target row rendered "Pedro Valor: R$ 1,00"; a side
    effect carried newlines and 3,000 characters."""
    named = "Pedro \u202e00,1 $R :rolaV \u202c"
    prepared = Prepared(
        args={},
        summary=f"Pix para {named}",
        impact={
            "target": named,
            "amount": "R$ 9.000,00\n",
            "side_effects": ["linha 1\nlinha 2", "x" * 3000],
            "reversible": False,
        },
    )
    card = new_card(
        Forge(),
        prepared,
        thread_id="th",
        run_id="r",
        tenant="t",
        owner="u",
        tool_use_id="tu",
        raw_input={},
    )
    for value in (card.impact["target"], card.impact["amount"], *card.impact["side_effects"]):
        assert "\n" not in value and not BIDI & set(value) and len(value) <= 500
    assert card.impact["reversible"] is False
    assert card.snapshot_hash == snapshot_hash("forge", {}, card.summary, card.impact)


def test_an_error_names_a_few_names_and_counts_the_rest() -> None:
    """A hostile probe: an edit of 15,000 unknown fields was refused with every name in
    the message (109 KB), and a 5,000-character id was echoed whole in its 404."""
    from signoff.runtime.errors import NotFound
    from signoff.runtime.text import some_names
    from signoff.store.rows import uuid_of

    names = [f"field_{i:05d}" for i in range(15_000)]
    said = some_names(names)
    assert said.startswith("field_00000, field_00001") and said.endswith(" and 14990 more")
    assert len(said) < 200
    assert some_names(["a", "b"]) == "a, b"
    assert some_names(["x" * 500]) == "x" * 59 + "…"
    with pytest.raises(NotFound) as refused:
        uuid_of("z" * 5_000)
    assert len(str(refused.value)) < 120 and str(refused.value).endswith("is not a valid id")
