"""Freeze a prepared tool call into the card that will be proposed (pure)."""

from __future__ import annotations

from typing import Any

from runtime.canonical import request_key, snapshot_hash
from runtime.tools import Prepared, Tool
from store.postgres import NewCard


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
) -> NewCard:
    """The card for one prepared call: its hash binds tool, frozen args, summary and impact
    (I2); its request key makes a repeated proposal in the same run find it again (I5)."""
    impact = {"risk": str(tool.risk), **prepared.impact}
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
        summary=prepared.summary,
        impact=impact,
        snapshot_hash=snapshot_hash(tool.name, prepared.args, prepared.summary, impact),
        request_key=request_key(run_id, tool.name, prepared.args, tool.set_fields),
        editable=sorted(tool.editable),
        ttl_seconds=tool.ttl.total_seconds(),
    )
