"""An offline demo model: rule-based, clearly labelled, no API key needed.

It understands a few payments-desk requests in Portuguese and English
("cobre 150 do João", "refund sale V001", "saldo") and turns them into the
same ``tool_use`` blocks Claude would send, so ``signoff dev`` shows the whole
card flow on a fresh machine. With ``ANTHROPIC_API_KEY`` set, Claude is used.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from signoff import Message, ModelReply, TextSink, ToolSpec

LABEL = "[offline demo model] "
_ids = itertools.count(1)

NAMES = re.compile(r"\b(?i:d[oae]s?|para|for|to|from|cliente):?\s+([A-ZÀ-Ý][\wÀ-ÿ]+)")
AMOUNT = re.compile(r"(?:R\$\s*)?(\d{1,3}(?:\.\d{3})+(?:,\d{1,2})?|\d+(?:[.,]\d{1,2})?)")


def _use(name: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_offline_{next(_ids):06d}",
        "name": name,
        "input": data,
    }


def _intent(part: str) -> dict[str, Any] | None:
    low = part.lower()
    if re.search(r"saldo|balance", low):
        return _use("get_balance", {})
    sale = re.search(r"\b(v\d{3})\b", low)
    if sale and re.search(r"estorn|reembols|refund|devolv", low):
        return _use("refund_sale", {"sale_id": sale.group(1).upper()})
    appt = re.search(r"\b(a\d{3})\b", low)
    if appt and re.search(r"cancel", low):
        return _use("cancel_appointment", {"appointment_id": appt.group(1).upper()})
    email = re.search(r"[^@\s]+@[^@\s]+\.\w+", part)
    name = NAMES.search(part)
    if email and name:
        return _use("update_email", {"customer": name.group(1), "email": email.group(0)})
    if re.search(r"cobr|pix|charge", low):
        amount = AMOUNT.search(part)
        if name and amount:
            return _use("create_pix_charge", {"customer": name.group(1), "amount": amount.group(1)})
    if re.search(r"busc|find|procur|cliente", low) and name:
        return _use("find_customer", {"query": name.group(1)})
    return None


def _describe(result: dict[str, Any]) -> str:
    text = str(result.get("content", ""))
    if not result.get("is_error"):
        try:
            data = json.loads(text)
        except ValueError:
            return text
        if isinstance(data, dict) and data.get("status") == "executed":
            return f"Feito. {data.get('card', '')} Resultado: {json.dumps(data.get('result'), ensure_ascii=False)}"
        return f"Resultado: {text}"
    return text


class OfflineDemoModel:
    name = "offline-demo"

    async def respond(
        self,
        *,
        system: str,
        messages: list[Message],
        tools: list[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        last = messages[-1] if messages else {"content": []}
        blocks = last.get("content", [])
        results = [b for b in blocks if b.get("type") == "tool_result"]
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        if results and not texts:
            reply = LABEL + " ".join(_describe(r) for r in results)
            return await self._text(reply, on_text)
        request = " ".join(texts)
        parts = re.split(
            r"\s+(?:e|and|depois|then)\s+(?=\S*\s*(?:cobr|estorn|reembols|refund|cancel|saldo|balance|alter|mude|change|busc|find))",
            request,
        )
        uses = [u for u in (_intent(p) for p in parts) if u is not None]
        if not uses:
            return await self._text(
                LABEL + "Posso consultar o saldo, buscar clientes, gerar cobranças Pix, estornar "
                'vendas, cancelar consultas e alterar e-mails. Ex.: "cobre 150 do João".',
                on_text,
            )
        intro = LABEL + "Vou preparar isso; confirme no cartão."
        if on_text is not None:
            await on_text(intro)
        return ModelReply(content=[{"type": "text", "text": intro}, *uses], stop_reason="tool_use")

    @staticmethod
    async def _text(text: str, on_text: TextSink | None) -> ModelReply:
        if on_text is not None:
            await on_text(text)
        return ModelReply(content=[{"type": "text", "text": text}], stop_reason="end_turn")
