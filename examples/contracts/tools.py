"""The contract review's one write tool: flag a clause for the legal team.

Flagging writes to the legal team's register, so it is a card: the model proposes it,
the reviewer approves, rejects or edits the risk level and the note before it runs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from signoff import Prepared, Risk, Tool, ToolContext, ToolValidationError

Level = Literal["low", "medium", "high"]


class Register:
    """The legal team's register of flagged clauses (in memory; keyed by the idempotency
    key signoff hands ``execute``, so a repeated execution adds nothing)."""

    def __init__(self) -> None:
        self.flags: dict[str, dict[str, Any]] = {}

    def add(self, key: str, flag: dict[str, Any]) -> dict[str, Any]:
        return self.flags.setdefault(key, flag)


class FlagInput(msgspec.Struct, forbid_unknown_fields=True):
    clause: Annotated[str, msgspec.Meta(description="The clause id, e.g. C3.")]
    level: Annotated[Level, msgspec.Meta(description="How risky the clause is.")]
    note: Annotated[str, msgspec.Meta(max_length=300, description="Why, in one sentence.")]


class FlagClause(Tool):
    name = "flag_clause"
    description = "Flag a risky clause of the contract for the legal team."
    risk = Risk.REVERSIBLE
    input_type = FlagInput
    editable = frozenset({"level", "note"})

    async def prepare(self, data: Any, ctx: ToolContext) -> Prepared:
        assert isinstance(data, FlagInput)
        clause = data.clause.strip().upper()
        if not clause.startswith("C") or not clause[1:].isdigit():
            raise ToolValidationError(f"{data.clause!r} is not a clause id like C3")
        return Prepared(
            args={"clause": clause, "level": data.level, "note": data.note},
            summary=f"Flag clause {clause} as {data.level} risk for the legal team",
            impact={"clause": clause, "level": data.level, "reversible": True},
            fields={"Note": data.note},
        )

    async def execute(
        self, args: dict[str, Any], operation_id: str, ctx: ToolContext
    ) -> dict[str, Any]:
        register = ctx.services
        if not isinstance(register, Register):
            raise ToolValidationError("the register is not connected")
        flag = register.add(operation_id, {**args, "by": ctx.user})
        return {"flagged": flag["clause"], "level": flag["level"]}
