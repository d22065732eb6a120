"""Tools: what the model may call, and how a write is frozen into a card.

A tool declares its name, risk, a msgspec input type (its JSON schema becomes
the Claude tool schema), and three steps: ``prepare`` (validate, resolve
entities on the server, write the summary by template), ``revalidate`` (check
the world again just before running) and ``execute`` (run the frozen args with
the provider idempotency key). Read tools only implement ``execute``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import msgspec

from signoff.runtime.canonical import MAX_JSON_INT, inexact_int
from signoff.runtime.cards import Risk
from signoff.runtime.errors import ConfigError, ToolValidationError

if TYPE_CHECKING:
    from signoff.runtime.records import Run


class Prepared(msgspec.Struct, frozen=True):
    """What ``prepare`` returns: the frozen args, the summary line and the impact.

    ``summary`` is one line written by the tool's own template. Free text that came
    from the model (a description, an address) goes in ``fields`` instead, label ->
    value in display order: the card shows each as its own labelled row, never inside
    the summary. The runtime makes every value and the summary one inert line
    (``runtime.text.one_line``) before the card is frozen and hashed.
    """

    args: dict[str, Any]
    summary: str
    impact: dict[str, Any]
    fields: dict[str, str] = msgspec.field(default_factory=dict)


Label = str | dict[str, str]
"""A label: one text, or one per language tag (``{"pt-BR": "Valor", "en": "Amount"}``);
the page picks the person's language, then ``en``, then the first."""


def label_text(label: Label, lang: str = "en") -> str:
    """One text of a label: ``lang``, its base language (``pt`` for ``pt-BR``), then
    ``en``, then the first given; the page's ``I.label`` picks the same way."""
    if isinstance(label, str):
        return label
    for tag in (lang, lang.split("-")[0], "en"):
        if tag in label:
            return label[tag]
    return next(iter(label.values()), "")


class Revalidation(msgspec.Struct, frozen=True):
    """The outcome of ``revalidate``. ``changes`` lists field, approved value, current value.

    ``reason`` is shown to the person on the card and told to the model: one text, or
    one per language (``{"pt-BR": "o cliente não está mais ativo", "en": "the customer
    is no longer active"}``): the page picks the person's language, the model is told
    the ``en`` text (else the first)."""

    ok: bool
    reason: Label = ""
    changes: list[dict[str, Any]] = msgspec.field(default_factory=list)

    @classmethod
    def passed(cls) -> Revalidation:
        return cls(ok=True)

    @classmethod
    def changed(cls, reason: Label, *changes: dict[str, Any]) -> Revalidation:
        return cls(ok=False, reason=reason, changes=list(changes))


ResultFormat = Literal["text", "money_cents", "number", "datetime", "date", "copy"]
"""How the page shows a result value: ``money_cents`` an integer amount in cents of
``currency``, ``datetime``/``date`` an ISO string, ``copy`` a text with a copy button;
numbers, money and dates are formatted in the person's locale (``Intl``)."""


class ResultField(msgspec.Struct, frozen=True, kw_only=True):
    """One labelled row of a result view: ``key`` names the value in the tool's result."""

    key: str
    label: Label
    format: ResultFormat = "text"
    currency: str = "BRL"


class ResultView(msgspec.Struct, frozen=True, kw_only=True):
    """How a person is shown what an executed tool returned, instead of its raw output:
    a title ("Cobrança Pix criada") and labelled, formatted fields. Declared by a tool as
    ``result_view``; sent to the chat page with the card's executed update."""

    title: Label = ""
    fields: tuple[ResultField, ...] = ()

    def render(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """The view of one result: the title and each declared field present in it."""
        return {
            "title": self.title,
            "fields": [
                {
                    "label": f.label,
                    "format": f.format,
                    "currency": f.currency,
                    "value": result[f.key],
                }
                for f in self.fields
                if result.get(f.key) is not None
            ],
        }

    @staticmethod
    def default(result: Mapping[str, Any]) -> dict[str, Any]:
        """A tool that declares no view: each plain value of the result as a text row,
        labelled by its key ("charge_id" -> "Charge id"); nested values are left out."""
        return {
            "title": "",
            "fields": [
                {
                    "label": key.replace("_", " ").capitalize(),
                    "format": "text",
                    "currency": "",
                    "value": value,
                }
                for key, value in result.items()
                if isinstance(value, str | int | float | bool) and not key.startswith("_")
            ],
        }


class ToolContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who is asking, for which thread. Tools resolve entities with it."""

    tenant: str
    user: str
    role: str = "user"
    thread_id: str = ""
    run_id: str = ""
    services: Any = None  # the app's own handles (e.g. a DB pool); opaque to signoff

    @classmethod
    def of(cls, run: Run, services: Any = None) -> ToolContext:
        """The context of a call made in ``run``."""
        return cls(
            tenant=run.tenant,
            user=run.owner,
            role=run.role,
            thread_id=run.thread_id,
            run_id=run.id,
            services=services,
        )


class Tool:
    """Base class of every tool. Subclasses set the class attributes and override the steps."""

    name: ClassVar[str]
    description: ClassVar[str]
    risk: ClassVar[Risk]
    input_type: ClassVar[type[msgspec.Struct]]
    editable: ClassVar[frozenset[str]] = frozenset()
    set_fields: ClassVar[frozenset[str]] = frozenset()
    ttl: ClassVar[timedelta] = timedelta(minutes=10)
    result_view: ClassVar[ResultView | None] = None

    @property
    def is_write(self) -> bool:
        return self.risk is not Risk.READ

    def spec(self) -> dict[str, Any]:
        """The tool as Claude sees it: name, description, JSON schema of the input."""
        schema = msgspec.json.schema(self.input_type)
        return {"name": self.name, "description": self.description, "input_schema": _inline(schema)}

    def view(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """What the page shows of an executed card's result (``result_view``, or the
        default: the result's plain values as rows)."""
        if self.result_view is None:
            return ResultView.default(result)
        return self.result_view.render(result)

    def parse(self, raw: Mapping[str, Any]) -> msgspec.Struct:
        """Turn the model's (or an editor's) raw input into the typed input, or raise."""
        try:
            value = msgspec.convert(dict(raw), self.input_type, strict=False)
        except msgspec.ValidationError as exc:
            raise ToolValidationError(f"invalid input for {self.name}: {exc}") from exc
        # A string of digits becomes an int here (strict=False): the bound the gateway
        # keeps on JSON numbers holds for what is frozen into a card too.
        if (big := inexact_int(msgspec.to_builtins(value))) is not None:
            shown = str(big)
            raise ToolValidationError(
                f"invalid input for {self.name}: the integer {shown[:24]}"
                f"{'...' if len(shown) > 24 else ''} is out of range "
                f"(integers lie within -{MAX_JSON_INT} and {MAX_JSON_INT})"
            )
        return value

    async def prepare(self, data: Any, ctx: ToolContext) -> Prepared:
        raise NotImplementedError

    async def revalidate(self, args: dict[str, Any], ctx: ToolContext) -> Revalidation:
        return Revalidation.passed()

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        raise NotImplementedError


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """Resolve msgspec's ``$ref``/``$defs`` into one self-contained object schema."""
    defs: dict[str, Any] = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.removeprefix("#/$defs/")])
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out: dict[str, Any] = walk(schema)
    out.pop("title", None)
    return out


class Registry:
    """The tools of an app, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._specs: list[dict[str, Any]] | None = None
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ConfigError(f"tool {tool.name!r} registered twice")
        self._tools[tool.name] = tool
        self._specs = None

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def specs(self) -> list[dict[str, Any]]:
        """What the model is offered. There is, by construction, no approval tool here (I1).

        Built once per registry (schema generation showed up at ~6% of a worker's CPU).
        """
        if self._specs is None:
            self._specs = [t.spec() for t in self._tools.values()]
        return self._specs
