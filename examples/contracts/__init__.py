"""Contract review as a durable workflow, written only against the public API.

``extract`` (plain step: the clauses) -> ``risk`` (an agent step: the model flags risky
clauses with ``flag_clause``, each flag a card the reviewer decides; the run waits for
them) -> ``sign_off`` (a person signs off, with a 3-day timeout after which the run goes
on as not approved) -> ``summary`` (plain step). Serve it with::

    signoff dev --app examples.contracts:app

then ``POST /v1/workflows/contract_review/runs`` with ``{"input": {"title": ..., "text":
...}}``; the chat page shows the open gate as a form. No API key needed: an offline model
stands in for Claude (``App(offline_model=...)``).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

import msgspec

from examples.contracts.model import ContractModel
from examples.contracts.tools import FlagClause, Register
from signoff import (
    App,
    Policy,
    Registry,
    Rule,
    Verdict,
    Workflow,
    WorkflowContext,
    agent_step,
    await_human,
)

__all__ = ["Contract", "SignOff", "app", "review"]

CLAUSE = re.compile(r"^\s*(C\d+)[:.]\s*(.+)$", re.M)


class Contract(msgspec.Struct, forbid_unknown_fields=True):
    title: str
    text: str  # one clause a line: "C1: ..."


class SignOff(msgspec.Struct):
    approved: Annotated[bool, msgspec.Meta(title="Approve the contract")]
    note: Annotated[str, msgspec.Meta(title="Note for the legal team")] = ""


async def extract(ctx: WorkflowContext) -> dict[str, Any]:
    contract: Contract = ctx.input
    clauses = [{"id": c, "text": t.strip()} for c, t in CLAUSE.findall(contract.text)]
    return {
        "title": contract.title,
        "clauses": clauses,
        "clause_list": "\n".join(f"{c['id']}: {c['text']}" for c in clauses),
    }


async def summary(ctx: WorkflowContext) -> dict[str, Any]:
    s = ctx.state
    flagged = [a for a in s["risk"]["actions"] if a["status"] == "executed"]
    verdict = "approved" if s["approved"] else "not approved"
    note = f" ({s['note']})" if s.get("note") else ""
    return {
        "summary": f"{s['title']}: {len(s['clauses'])} clauses, {len(flagged)} flagged; "
        f"{verdict}{note}."
    }


review = Workflow(
    "contract_review",
    input=Contract,
    steps=[
        extract,
        agent_step(
            "risk",
            prompt="Assess the risks of the contract {title!r}. Flag each risky clause "
            "with flag_clause.\n{clause_list}",
            tools=["flag_clause"],
        ),
        await_human(
            "Sign off the contract",
            schema=SignOff,
            timeout=timedelta(days=3),
            timeout_response={"approved": False, "note": "no sign-off within 3 days"},
            name="sign_off",
        ),
        summary,
    ],
)


def app() -> App:
    return App(
        name="contracts",
        tools=Registry([FlagClause()]),
        policy=Policy([Rule(Verdict.ASK, tool="flag_clause")]),
        services=Register(),
        workflows=[review],
        offline_model=ContractModel(),
        # Not a chat app: a review starts from the API, and its gates show up here.
        hint={
            "en": "a review started with POST /v1/workflows/contract_review/runs; its clauses "
            "and sign-off come here as forms",
            "pt-BR": "uma revisão iniciada com POST /v1/workflows/contract_review/runs; suas "
            "cláusulas e a assinatura chegam aqui como formulários",
        },
    )
