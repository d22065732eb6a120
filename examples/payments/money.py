"""Money and document formatting for the demo (pure)."""

from __future__ import annotations

import re

from runtime.errors import ToolValidationError


def parse_amount(value: str | int | float) -> int:
    """Reais as the model wrote them -> cents. "150" -> 15000, "1.234,56" -> 123456."""
    if isinstance(value, bool):
        raise ToolValidationError("amount must be a number of reais")
    if isinstance(value, int | float):
        cents = round(float(value) * 100)
    else:
        text = value.strip().replace("R$", "").replace(" ", "")
        if not re.fullmatch(r"[0-9.,]+", text or "x"):
            raise ToolValidationError(f"amount {value!r} is not a number of reais")
        if "," in text:
            text = text.replace(".", "").replace(",", ".")
        elif text.count(".") > 1:
            text = text.replace(".", "")
        try:
            cents = round(float(text) * 100)
        except ValueError as exc:
            raise ToolValidationError(f"amount {value!r} is not a number of reais") from exc
    if cents <= 0:
        raise ToolValidationError("amount must be positive")
    if cents > 100_000_000:
        raise ToolValidationError("amount is above the R$ 1.000.000,00 limit")
    return cents


def brl(cents: int) -> str:
    """15000 -> "R$ 150,00"."""
    reais, cent = divmod(abs(cents), 100)
    grouped = f"{reais:,}".replace(",", ".")
    sign = "-" if cents < 0 else ""
    return f"{sign}R$ {grouped},{cent:02d}"


def mask_cpf(cpf: str) -> str:
    """ "123.123.456-78" -> "***.123.456-**"."""
    digits = re.sub(r"\D", "", cpf)
    if len(digits) != 11:
        return "***"
    return f"***.{digits[3:6]}.{digits[6:9]}-**"
