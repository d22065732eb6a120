"""An offline stand-in for Claude in the risk analysis: it flags the clauses whose text
carries a known risk (unlimited liability, automatic renewal, unilateral changes, ...).

One reply proposes every flag at once (parallel tool use: one card each); once the
results are in, it answers with what was flagged.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from signoff import Message, ModelReply, TextSink, ToolSpec

RISKS: list[tuple[str, str, str]] = [
    (r"unlimited liability", "high", "liability is not capped"),
    (r"automatic(ally)? renew|renews? automatically", "medium", "renews automatically"),
    (r"at (its|their) sole discretion", "medium", "one party may change terms alone"),
    (r"exclusive", "low", "exclusivity limits other suppliers"),
]
CLAUSE = re.compile(r"^\s*(C\d+)[:.]\s*(.+)$", re.M)
PORTUGUESE = re.compile(r"[ãõçáéíóúâê]|\b(?:o que|voc[eê]|ol[aá]|oi|qual|como)\b", re.I)
ABOUT_EN = (
    "I review contracts: a review is started with POST /v1/workflows/contract_review/runs, "
    "and its risky clauses and sign-off come to this chat as cards and forms. Nothing was "
    "analysed from this message."
)
ABOUT_PT = (
    "Eu reviso contratos: uma revisão começa com POST /v1/workflows/contract_review/runs, "
    "e as cláusulas de risco e a assinatura chegam a este chat como cartões e formulários. "
    "Nada foi analisado a partir desta mensagem."
)
_ids = itertools.count(1)


def risky(text: str) -> list[dict[str, Any]]:
    """The flags the model proposes for a prompt listing clauses as ``C1: text`` lines."""
    out = []
    for clause, body in CLAUSE.findall(text):
        for pattern, level, why in RISKS:
            if re.search(pattern, body, re.I):
                out.append({"clause": clause, "level": level, "note": f"{clause} {why}"})
                break
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


class ContractModel:
    name = "offline-contracts"

    async def respond(
        self,
        *,
        system: str,
        messages: list[Message],
        tools: list[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        last = messages[-1]
        if (
            last["role"] == "user"
            and isinstance(last["content"], list)
            and any(b.get("type") == "tool_result" for b in last["content"])
        ):
            done = []
            for block in last["content"]:
                try:
                    data = json.loads(str(block.get("content", "")))
                except ValueError:
                    data = {}
                if isinstance(data, dict) and data.get("status") == "executed":
                    done.append(str(data.get("card", "")))
            text = f"Risk analysis done: {len(done)} clause(s) flagged."
            return ModelReply(content=[{"type": "text", "text": text}], stop_reason="end_turn")
        prompt = _text(last["content"])
        if not CLAUSE.search(prompt):
            # A chat message, not a review's prompt: nothing was analysed (a newcomer
            # probe: "olá, o que você faz?" was told "Risk analysis done").
            text = ABOUT_PT if PORTUGUESE.search(prompt) else ABOUT_EN
            return ModelReply(content=[{"type": "text", "text": text}], stop_reason="end_turn")
        flags = risky(prompt)
        if not flags:
            text = "Risk analysis done: no risky clause found."
            return ModelReply(content=[{"type": "text", "text": text}], stop_reason="end_turn")
        uses = [
            {
                "type": "tool_use",
                "id": f"toolu_contract_{next(_ids):06d}",
                "name": "flag_clause",
                "input": flag,
            }
            for flag in flags
        ]
        return ModelReply(content=uses, stop_reason="tool_use")
