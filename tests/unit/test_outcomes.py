"""What the model is told about a card's outcome (runtime/outcomes.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from signoff.runtime import outcomes
from signoff.runtime.cards import Card, Risk, Status


def card(status: Status, result: dict[str, Any] | None) -> Card:
    now = datetime.now(UTC)
    return Card(
        id="c1", thread_id="t", run_id="r", tenant="demo", owner="u", tool="x",
        risk=Risk.CRITICAL, args_snapshot={}, summary="s", impact={}, snapshot_hash="h",
        request_key="k", operation_id="o", status=status, expires_at=now, created_at=now,
        result=result,
    )  # fmt: skip


def test_a_card_an_operator_settled_as_not_done_says_so() -> None:
    """The integrity probe: a card reconciled `failed` was told as "Execution failed:
    unknown error" (a reconcile's result has no `error`)."""
    told = outcomes.card_outcome(
        "tu", card(Status.FAILED, {"reconciled_by": "ops:ana", "note": "no charge at the PSP"})
    )
    text = str(told["content"])
    assert "an operator (ops:ana) settled it as not done: no charge at the PSP" in text
    assert "unknown error" not in text


def test_a_failure_says_its_error() -> None:
    told = outcomes.card_outcome("tu", card(Status.FAILED, {"error": "card declined"}))
    assert "Execution failed: card declined." in str(told["content"]) and told["is_error"]


def test_a_reason_per_language_picks_the_asked_one_then_english_then_the_first() -> None:
    from signoff import label_text

    both = {"pt-BR": "o saldo mudou", "en": "the balance changed"}
    assert label_text(both) == "the balance changed"
    assert label_text(both, "pt-BR") == "o saldo mudou"
    assert label_text({"pt": "mudou"}, "pt-BR") == "mudou"  # the base language
    assert label_text({"es": "cambió", "fr": "changé"}) == "cambió"  # the first
    assert label_text("plain") == "plain" and label_text({}) == ""


def test_a_failure_is_shown_in_a_refusal_s_words_or_by_its_kind() -> None:
    """A hostile probe and its review: a tool's exception text (a driver's words: hosts,
    ports, statements) reached the person and the model; a signoff error raised inside
    a tool carries such words in its message too. Only a ToolRefused's are kept."""
    from signoff import ToolRefused
    from signoff.runtime.errors import Unavailable

    assert outcomes.failed_result(ToolRefused("the Pix key is blocked")) == {
        "error": "the Pix key is blocked"
    }
    leaky = Unavailable("connection to 10.1.2.3:5432 refused")
    assert outcomes.failed_result(leaky) == {"error": "the tool failed (unavailable)"}
    assert outcomes.failed_result(RuntimeError("at 10.1.2.3")) == {
        "error": "the tool failed (RuntimeError)"
    }
