"""Money and document formatting for the demo (pure)."""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from signoff import ToolValidationError

MAX_CENTS = 100_000_000  # R$ 1.000.000,00
_MAX_REAIS = Decimal(MAX_CENTS) / 100


_POSITIVE = {"en": "amount must be positive", "pt-BR": "o valor deve ser maior que zero"}


def _not_a_number(value: str) -> dict[str, str]:
    return {
        "en": f"amount {_shown(value)} is not a number of reais",
        "pt-BR": f"o valor {_shown(value)} não é um número de reais (ex.: 150 ou 150,00)",
    }


def parse_amount(value: str | int | float) -> int:
    """Reais as the model wrote them -> cents. "150" -> 15000, "1.234,56" -> 123456.

    Anything that is not a positive, finite amount up to the limit is refused with a
    ``ToolValidationError`` (never an ``OverflowError``): 400 nines, ``1e308``, NaN.
    """
    if isinstance(value, bool):
        raise ToolValidationError(
            {"en": "amount must be a number of reais", "pt-BR": "o valor deve ser em reais"}
        )
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolValidationError(
                {"en": "amount must be a finite number of reais", "pt-BR": "valor inválido"}
            )
        # As written: a float's shortest repr, so 0.005 is what "0.005" is (Decimal(0.005)
        # is 0.00500000000000000010408..., which rounded up to a cent the text refuses).
        reais = Decimal(value if isinstance(value, int) else repr(value))
    else:
        text = value.strip().replace("R$", "").replace(" ", "")
        if re.fullmatch(r"-[0-9.,]*[0-9][0-9.,]*", text):  # "-20": a number, below zero
            raise ToolValidationError(_POSITIVE)
        if not re.fullmatch(r"[0-9.,]+", text or "x"):
            raise ToolValidationError(_not_a_number(value))
        if _AMBIGUOUS.fullmatch(text):
            raise ToolValidationError(_ambiguous(value))
        text = _decimal_point(text)
        try:
            reais = Decimal(text)
        except InvalidOperation as exc:
            raise ToolValidationError(_not_a_number(value)) from exc
    # Compared before any arithmetic: a Decimal comparison is exact and cannot overflow.
    if reais <= 0:
        raise ToolValidationError(_POSITIVE)
    if reais > _MAX_REAIS:
        raise ToolValidationError(
            {
                # Not named as a limit: a chat charge is refused far below it, by the
                # policy's R$ 10.000,00, and two limits quoted for one edit confused people.
                "en": "amount is too large",
                "pt-BR": "o valor é grande demais",
            }
        )
    cents = int((reais * 100).to_integral_value(rounding=ROUND_HALF_EVEN))
    if cents <= 0:
        raise ToolValidationError(
            {"en": "amount is less than R$ 0,01", "pt-BR": "o valor é menor que R$ 0,01"}
        )
    return cents


# "1,234": a thousand and more in English, one real and cents in Portuguese (a first-hour
# walkthrough had a Brazilian's "1,234" charged as R$ 1.234,00). Money is not guessed:
# refused, saying how to write either. ("1.234" is a thousand in reais' own notation;
# "1,234.56" and "1,234,567" say which mark is which.)
_AMBIGUOUS = re.compile(r"0*[1-9][0-9]{0,2},[0-9]{3}")


def _ambiguous(value: str) -> dict[str, str]:
    return {
        "en": f"amount {_shown(value)} is ambiguous: write 1234 (or 1.234) for a thousand and "
        "more, or 1,23 for one real and cents",
        "pt-BR": f"o valor {_shown(value)} é ambíguo: escreva 1234 (ou 1.234) para milhares, "
        "ou 1,23 para reais e centavos",
    }


def _decimal_point(text: str) -> str:
    """Digits with their separators -> a plain decimal ("1.234,56" and "1,234.56" ->
    "1234.56"). With both marks, the last one is the decimal point; one mark used twice
    groups thousands; one mark once followed by exactly three digits groups thousands
    too ("1.000" and "1,000" are a thousand reais: money has no third decimal), unless
    nothing but a zero precedes it ("0,015")."""
    if "," in text and "." in text:
        point = "," if text.rindex(",") > text.rindex(".") else "."
        return text.replace("." if point == "," else ",", "").replace(",", ".")
    for mark in (",", "."):
        if text.count(mark) > 1:
            whole, *groups = text.split(mark)
            if not 1 <= len(whole) <= 3 or any(len(g) != 3 for g in groups):
                return "x"  # "1,2,3": not a grouping of thousands, not a number
            return text.replace(mark, "")
        if mark in text:
            whole, _, part = text.partition(mark)
            if len(part) == 3 and whole.lstrip("0") and len(whole) <= 3:
                return whole + part
            return text.replace(mark, ".")
    return text


def _shown(value: str) -> str:
    """The model's text in an error message, cut short (it goes back to the model)."""
    return repr(value if len(value) <= 40 else value[:40] + "…")


def brl(cents: int) -> str:
    """15000 -> "R$ 150,00"."""
    reais, cent = divmod(abs(cents), 100)
    grouped = f"{reais:,}".replace(",", ".")
    sign = "-" if cents < 0 else ""
    return f"{sign}R$ {grouped},{cent:02d}"


def br_datetime(text: str) -> str:
    """ "2026-12-08 14:00" -> "08/12/2026 14:00", as the demo's Portuguese cards write dates
    (an ISO date on a card read as a machine's, a first-hour walkthrough); else as given."""
    found = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})([ T]\d{2}:\d{2})?", text.strip())
    if found is None:
        return text
    year, month, day, time = found.groups()
    return f"{day}/{month}/{year}{(' ' + time[1:]) if time else ''}"


def mask_cpf(cpf: str) -> str:
    """ "123.123.456-78" -> "***.123.456-**"."""
    digits = re.sub(r"\D", "", cpf)
    if len(digits) != 11:
        return "***"
    return f"***.{digits[3:6]}.{digits[6:9]}-**"
