"""Freeze a prepared tool call into the card that will be proposed (pure)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from signoff.runtime.canonical import request_key, snapshot_hash
from signoff.runtime.records import NewCard
from signoff.runtime.text import one_line
from signoff.runtime.tools import Prepared, Tool

SUMMARY_LIMIT = 500
LABEL_LIMIT = 60
VALUE_LIMIT = 500


def card_fields(fields: dict[str, str]) -> list[dict[str, str]]:
    """A tool's labelled values as the card keeps them (``impact["fields"]``): in order,
    each label and value one inert line, so model text cannot draw lines of its own."""
    return [
        {"label": one_line(str(label), LABEL_LIMIT), "value": one_line(str(value), VALUE_LIMIT)}
        for label, value in fields.items()
    ]


def shown_impact(impact: dict[str, Any]) -> dict[str, Any]:
    """The impact with the values the page shows as text (``target``, ``amount``, each of
    ``side_effects``) made one inert line, as the summary is: they may hold a provider's
    data (a customer's name with a bidi override rendered "Pedro Valor: R$ 1,00" beside
    the cleaned summary). Other keys are kept as the tool gave them."""
    out = dict(impact)
    for key in ("target", "amount"):
        if isinstance(out.get(key), str):
            out[key] = one_line(out[key], VALUE_LIMIT)
    effects = out.get("side_effects")
    if isinstance(effects, list | tuple):
        out["side_effects"] = [
            one_line(e, VALUE_LIMIT) if isinstance(e, str) else e for e in effects[:20]
        ]
    return out


def new_card(
    tool: Tool,
    prepared: Prepared,
    *,
    thread_id: str,
    run_id: str,
    tenant: str,
    owner: str,
    tool_use_id: str,
    raw_input: dict[str, Any],
    ttl: timedelta | None = None,
) -> NewCard:
    """The card for one prepared call: its hash binds tool, frozen args, summary and impact
    (I2); its request key makes a repeated proposal in the same run find it again (I5).

    The summary and the labelled fields are cleaned here, before hashing: the hash binds
    the text the person is shown. A code-written summary never needs a newline or a bidi
    control, so cleaning it is only a safety net; model text belongs in ``fields``.

    ``ttl``: how long the card waits for a decision (the policy's, see
    ``Outcome.card_ttl``); by default the tool's own."""
    summary = one_line(prepared.summary, SUMMARY_LIMIT)
    impact = {"risk": str(tool.risk), **shown_impact(prepared.impact)}
    if prepared.fields:
        impact["fields"] = card_fields(prepared.fields)
    return NewCard(
        thread_id=thread_id,
        run_id=run_id,
        tenant=tenant,
        owner=owner,
        tool=tool.name,
        tool_use_id=tool_use_id,
        risk=str(tool.risk),
        input=raw_input,
        args_snapshot=prepared.args,
        summary=summary,
        impact=impact,
        snapshot_hash=snapshot_hash(tool.name, prepared.args, summary, impact),
        request_key=request_key(run_id, tool.name, prepared.args, tool.set_fields),
        editable=sorted(tool.editable),
        ttl_seconds=(tool.ttl if ttl is None else ttl).total_seconds(),
    )
