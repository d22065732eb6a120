"""What operators look up (``signoff cards``): cards by filter, ids by unique prefix."""

from __future__ import annotations

import re

from signoff.runtime.cards import Card
from signoff.runtime.errors import InvalidInput, NotFound
from signoff.store import rows
from signoff.store.connector import Connector
from signoff.store.queries import SQL

_HEX = re.compile(r"[0-9a-f]{1,32}")


class AmbiguousId(InvalidInput):
    """An id prefix that matches more than one row."""

    code = "ambiguous_id"


def _uuid(hex32: str) -> str:
    return f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"


def prefix_range(prefix: str) -> tuple[str, str]:
    """The lowest and highest uuid starting with ``prefix`` (dashes ignored)."""
    digits = prefix.strip().lower().replace("-", "")
    if not _HEX.fullmatch(digits):
        raise NotFound(f"{prefix!r} is not an id or an id prefix (hex digits)")
    pad = 32 - len(digits)
    return _uuid(digits + "0" * pad), _uuid(digits + "f" * pad)


class Operator:
    def __init__(self, db: Connector) -> None:
        self._db = db

    async def find_cards(
        self,
        *,
        status: str | None = None,
        thread_id: str | None = None,
        tool: str | None = None,
        older_than: float | None = None,
        newer_than: float | None = None,
        limit: int = 50,
        flagged: bool = False,
    ) -> list[Card]:
        """``flagged``: only cards flagged for reconciliation."""
        found = await self._db.fetch(
            SQL.cards_find, status, thread_id, tool, older_than, newer_than, limit, flagged
        )
        return [rows.card(r) for r in found]

    async def card_id(self, prefix: str) -> str:
        """The one card whose id starts with ``prefix``: ``NotFound`` for none,
        :class:`AmbiguousId` for several."""
        return await self._one(SQL.card_ids_between, prefix, "card")

    async def thread_id(self, prefix: str) -> str:
        return await self._one(SQL.thread_ids_between, prefix, "thread")

    async def run_id(self, prefix: str) -> str:
        """The one workflow run or agent run whose id starts with ``prefix``."""
        return await self._one(SQL.run_ids_between, prefix, "run")

    async def _one(self, query: str, prefix: str, what: str) -> str:
        lo, hi = prefix_range(prefix)
        ids = [r["id"] for r in await self._db.fetch(query, lo, hi, 6)]
        if not ids:
            raise NotFound(f"no {what} id starts with {prefix!r}")
        if len(ids) > 1:
            shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
            raise AmbiguousId(
                f"{what} id prefix {prefix!r} is ambiguous: it matches {shown}; give more digits"
            )
        return str(ids[0])
