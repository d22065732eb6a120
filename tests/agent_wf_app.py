"""An app with an agent step, for the agent-step tests (in-process and as real processes).

``approvals``: ``prepare`` (plain step) -> ``agent`` (an agent step offered only ``pay``)
-> ``after`` (plain step). Its offline model proposes three payments in one reply (three
cards) and, once the results are in, ends its turn naming what was executed. ``pay``
records each execution in Postgres (``agent_wf_pays``: one row per idempotency key, a
count of executions), so tests in any process can check that each card ran once.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, ClassVar

import asyncpg
import msgspec

from signoff import (
    App,
    Message,
    ModelReply,
    Policy,
    Prepared,
    Registry,
    Risk,
    Rule,
    TextSink,
    Tool,
    ToolContext,
    ToolSpec,
    ToolValidationError,
    Verdict,
    Workflow,
    WorkflowContext,
    agent_step,
)

TABLE = (
    "CREATE TABLE IF NOT EXISTS agent_wf_pays (operation_id text PRIMARY KEY, "
    "payee text NOT NULL, amount int NOT NULL, executions int NOT NULL DEFAULT 1)"
)
PAYEES = ("ana", "bruno", "carla")


class PayIn(msgspec.Struct, forbid_unknown_fields=True):
    payee: str
    amount: int


class Pay(Tool):
    name = "pay"
    description = "Pay someone an amount."
    risk = Risk.CRITICAL
    input_type = PayIn
    editable = frozenset({"amount"})

    async def prepare(self, data: Any, ctx: ToolContext) -> Prepared:
        assert isinstance(data, PayIn)
        if data.amount > 1000:  # a refusal per language, as a person's edit may meet
            raise ToolValidationError(
                {"pt-BR": "valor acima do limite de 1000", "en": "amount above the 1000 limit"}
            )
        return Prepared(
            args={"payee": data.payee, "amount": data.amount},
            summary=f"Pay {data.amount} to {data.payee}",
            impact={"amount": data.amount, "target": data.payee},
        )

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        pool: asyncpg.Pool = ctx.services
        await pool.execute(
            "INSERT INTO agent_wf_pays (operation_id, payee, amount) VALUES ($1, $2, $3) "
            "ON CONFLICT (operation_id) DO UPDATE SET executions = agent_wf_pays.executions + 1",
            operation_id,
            args["payee"],
            args["amount"],
        )
        return {"paid": args["payee"], "amount": args["amount"]}


class Lookup(Tool):
    """A read the agent step is NOT offered (its ``tools`` name only ``pay``)."""

    name = "lookup"
    description = "Look a payee up."
    risk = Risk.READ
    input_type = PayIn

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        return {"found": True}


class PayModel:
    """Proposes one payment per name in the prompt's "pay: a=1, b=2" list, in one reply."""

    name = "offline-pay"
    offered: ClassVar[list[list[str]]] = []  # the tool names offered in each call (tests)

    async def respond(
        self,
        *,
        system: str,
        messages: list[Message],
        tools: list[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        PayModel.offered.append([t["name"] for t in tools])
        last = messages[-1]
        content = last["content"]
        if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
            paid = []
            for block in content:
                try:
                    data = json.loads(str(block.get("content", "")))
                except ValueError:
                    continue
                if isinstance(data, dict) and data.get("status") == "executed":
                    paid.append(f"{data['result']['paid']}={data['result']['amount']}")
            text = "paid: " + (", ".join(sorted(paid)) or "nothing")
            return ModelReply(content=[{"type": "text", "text": text}], stop_reason="end_turn")
        text = content if isinstance(content, str) else content[0].get("text", "")
        uses = [
            {
                "type": "tool_use",
                "id": f"toolu_pay_{i}",
                "name": "pay",
                "input": {"payee": payee, "amount": int(amount)},
            }
            for i, (payee, amount) in enumerate(re.findall(r"(\w+)=(\d+)", text))
        ]
        return ModelReply(content=uses, stop_reason="tool_use")


async def prepare(ctx: WorkflowContext) -> dict[str, Any]:
    return {"payments": ", ".join(f"{p}={10 * (i + 1)}" for i, p in enumerate(PAYEES))}


async def after(ctx: WorkflowContext) -> dict[str, Any]:
    return {"after_saw": ctx.state["agent"]["reply"]}


approvals = Workflow(
    "approvals",
    steps=[
        prepare,
        agent_step("agent", prompt="pay: {payments}", tools=["pay"]),
        after,
    ],
)


def build() -> App:
    pools: list[asyncpg.Pool] = []

    async def setup(database_url: str) -> asyncpg.Pool:
        # (as every app behind PgBouncer < 1.21: SIGNOFF_DB_STATEMENT_CACHE_SIZE=0)
        cache = int(os.environ.get("SIGNOFF_DB_STATEMENT_CACHE_SIZE", "100"))
        pool = await asyncpg.create_pool(
            database_url, min_size=1, max_size=4, statement_cache_size=cache
        )
        await pool.execute(TABLE)
        pools.append(pool)
        return pool

    async def teardown() -> None:
        while pools:
            await pools.pop().close()

    return App(
        name="agent-wf",
        tools=Registry([Pay(), Lookup()]),
        policy=Policy([Rule(Verdict.ASK, tool="pay")]),
        workflows=[approvals],
        setup=setup,
        teardown=teardown,
        offline_model=PayModel(),
    )
