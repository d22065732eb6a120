"""The exactly-once check every bench script ends with (split out of ``bench/common.py``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg


async def exactly_once(
    database_url: str, tenant: str | None = None, settle: float = 60.0
) -> dict[str, Any]:
    """Every approved card executed once; nothing executed twice (store + demo provider).

    First waits up to ``settle`` seconds for cards still ``approved`` or ``executing``
    (work in flight) to finish. ``ok`` is False when a card went to ``executing`` more
    than once, when the executed cards and the provider's charges differ, when a
    charge has no executed card, or when an approved card was never executed (lost)
    or stays ``executing`` (outcome unknown, left for an operator by design).
    """
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            busy = await conn.fetchval(
                "SELECT count(*) FROM cards WHERE status IN ('approved', 'executing')"
            )
            if busy == 0:
                break
            await asyncio.sleep(0.5)
        where = "" if tenant is None else "WHERE c.tenant = $1"
        args = () if tenant is None else (tenant,)
        row = await conn.fetchrow(
            f"""
            SELECT
              count(*) FILTER (WHERE c.status = 'executed') AS executed,
              count(*) FILTER (WHERE c.status = 'failed') AS failed,
              count(*) FILTER (WHERE c.status IN ('approved')) AS approved_waiting,
              count(*) FILTER (WHERE c.status = 'executing') AS executing_now,
              count(*) FILTER (WHERE c.status = 'pending') AS pending,
              count(*) AS cards
            FROM cards c {where}""",
            *args,
        )
        executing_events = await conn.fetchval(
            f"SELECT count(*) FROM card_events e JOIN cards c ON c.id = e.card_id {where} "
            f"{'AND' if where else 'WHERE'} e.to_status = 'executing' AND e.from_status = 'approved'",
            *args,
        )
        cards_twice = await conn.fetchval(
            f"""SELECT count(*) FROM (SELECT e.card_id FROM card_events e JOIN cards c
                ON c.id = e.card_id {where} {"AND" if where else "WHERE"}
                e.to_status = 'executing' AND e.from_status = 'approved'
                GROUP BY e.card_id HAVING count(*) > 1) t""",
            *args,
        )
        has_charges = await conn.fetchval("SELECT to_regclass('demo_charges') IS NOT NULL")
        charges = keyed = dup_keys = charged_executing = 0
        if has_charges:
            cw = "" if tenant is None else "WHERE d.tenant = $1"
            charges = await conn.fetchval(f"SELECT count(*) FROM demo_charges d {cw}", *args)
            keyed = await conn.fetchval(
                f"SELECT count(*) FROM demo_charges d JOIN cards c ON "
                f"c.operation_id::text = d.idempotency_key {cw} "
                f"{'AND' if cw else 'WHERE'} c.status = 'executed'",
                *args,
            )
            charged_executing = await conn.fetchval(
                f"SELECT count(*) FROM demo_charges d JOIN cards c ON "
                f"c.operation_id::text = d.idempotency_key {cw} "
                f"{'AND' if cw else 'WHERE'} c.status = 'executing'",
                *args,
            )
            dup_keys = await conn.fetchval(
                f"SELECT count(*) FROM (SELECT idempotency_key FROM demo_charges d {cw} "
                "GROUP BY idempotency_key HAVING count(*) > 1) t",
                *args,
            )
    finally:
        await conn.close()
    assert row is not None  # an aggregate always returns its one row
    executed = int(row["executed"])
    result = {
        "cards": int(row["cards"]),
        "executed": executed,
        "failed": int(row["failed"]),
        "pending": int(row["pending"]),
        "approved_not_executed": int(row["approved_waiting"]),
        "stuck_executing": int(row["executing_now"]),
        "executing_events": int(executing_events),
        "provider_charges": int(charges),
        "charges_matching_executed_cards": int(keyed),
        "double_executions": int(cards_twice) + int(dup_keys),
    }
    # Left `executing` although the provider charged: executed once, but the store never
    # recorded it (finish_execution failed); an operator must reconcile it (I4).
    result["charged_but_executing"] = int(charged_executing)
    result["lost"] = (
        result["approved_not_executed"] + result["stuck_executing"] - int(charged_executing)
    )
    result["ok"] = (
        result["double_executions"] == 0
        and result["lost"] == 0
        and result["stuck_executing"] == 0
        and executed == charges == keyed
        and int(executing_events) == executed + result["failed"]
    )
    return result
