"""Result views (issue 17): a tool declares how its result is shown; the gateway adds the
rendering to an executed card's event, and only there."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
import pytest

import signoff
from signoff import ResultField, ResultView, Risk, Tool, ToolContext
from signoff.demo.tools import ALL_TOOLS
from signoff.gateway.views import Views
from signoff.runtime.tools import Registry


class In(msgspec.Struct):
    x: str = ""


class Viewed(Tool):
    name = "viewed"
    description = "d"
    risk = Risk.CRITICAL
    input_type = In
    result_view: ClassVar[ResultView | None] = ResultView(
        title={"pt-BR": "Feito", "en": "Done"},
        fields=(
            ResultField(key="total", label="Total", format="money_cents", currency="USD"),
            ResultField(key="when", label={"en": "When"}, format="datetime"),
            ResultField(key="absent", label="Never shown"),
        ),
    )

    async def execute(self, args: dict[str, Any], operation_id: str, ctx: ToolContext) -> Any:
        return {}


class Plain(Viewed):
    name = "plain"
    result_view = None


def test_a_declared_view_renders_its_fields_in_order_and_skips_missing_ones() -> None:
    view = Viewed().view({"when": "2026-01-01T10:00:00Z", "total": 1234, "secret": "s"})
    assert view == {
        "title": {"pt-BR": "Feito", "en": "Done"},
        "fields": [
            {"label": "Total", "format": "money_cents", "currency": "USD", "value": 1234},
            {
                "label": {"en": "When"},
                "format": "datetime",
                "currency": "BRL",
                "value": "2026-01-01T10:00:00Z",
            },
        ],
    }


def test_the_default_view_shows_plain_values_labelled_by_key() -> None:
    view = Plain().view({"charge_id": "pix-1", "amount": 15000, "nested": {"a": 1}, "_x": 1})
    assert view["title"] == ""
    assert [(f["label"], f["value"]) for f in view["fields"]] == [
        ("Charge id", "pix-1"),
        ("Amount", 15000),
    ]


def test_the_view_is_public_api_and_every_demo_write_declares_one() -> None:
    for name in ("ResultView", "ResultField", "ResultFormat", "Label"):
        assert name in signoff.__all__
    for tool in ALL_TOOLS:
        assert (tool.result_view is not None) is tool.is_write, tool.name


@pytest.mark.parametrize("kind", ["card", "card_update"])
def test_only_an_executed_card_of_a_known_tool_gets_a_view(kind: str) -> None:
    views = Views(Registry([Viewed()]))
    executed = {"tool": "viewed", "status": "executed", "result": {"total": 5}}
    viewed = views.of(kind, executed)
    assert viewed is not None and viewed["view"]["fields"][0]["value"] == 5
    assert executed.get("view") is None  # the log's copy is not touched
    assert views.of(kind, {**executed, "status": "approved"}) is None
    assert views.of(kind, {**executed, "tool": "gone"}) is None  # a rolling update
    assert views.of(kind, {**executed, "result": None}) is None
    assert views.of("assistant", executed) is None
    assert Views(None).of(kind, executed) is None
    raw = msgspec.Raw(msgspec.json.encode(executed))
    assert views.wire(kind, raw) == viewed
    pending = msgspec.Raw(msgspec.json.encode({**executed, "status": "pending"}))
    assert views.wire(kind, pending) is pending
    assert views.wire(kind, msgspec.Raw(b'{"executed"')) is not None  # undecodable: as it is


def test_a_failing_view_leaves_the_event_as_it_is() -> None:
    class Broken(Viewed):
        name = "broken"

        def view(self, result: Any) -> dict[str, Any]:
            raise RuntimeError("app bug")

    views = Views(Registry([Broken()]))
    assert views.of("card_update", {"tool": "broken", "status": "executed", "result": {}}) is None
