"""Result views: an executed card's event carries how its result is shown.

A tool declares a ``result_view`` (``runtime.tools.ResultView``); the gateway adds its
rendering as ``view`` to a ``card``/``card_update`` event of an executed card, on the
way out (WebSocket and HTTP event lists), so the page shows "Cobrança Pix criada ·
R$ 150,00 · código copia-e-cola" instead of the provider's raw output. Nothing is
stored: the log keeps the card as it was; a tool this gateway does not know (a rolling
update) sends the event as it is and the page falls back to the raw rows.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from signoff.runtime.tools import Registry

log = logging.getLogger("signoff.views")

_CARD_KINDS = frozenset({"card", "card_update"})
_EXECUTED = b'"executed"'
_decode = msgspec.json.Decoder(dict[str, Any]).decode


class Views:
    def __init__(self, tools: Registry | None) -> None:
        self.tools = tools

    def of(self, kind: str, data: Any) -> dict[str, Any] | None:
        """The card data with its ``view`` added, or None when nothing is to be added."""
        if self.tools is None or kind not in _CARD_KINDS or not isinstance(data, dict):
            return None
        if data.get("status") != "executed" or not isinstance(data.get("result"), dict):
            return None
        tool = self.tools.get(str(data.get("tool")))
        if tool is None:
            return None
        try:
            view = tool.view(data["result"])
        except Exception as exc:  # an app's view must not stop the event
            log.warning("result view of %s failed: %s", data.get("tool"), exc)
            return None
        return {**data, "view": view}

    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        """An event dict (``service.event_of``) with the view added to its data."""
        data = self.of(str(event.get("kind")), event.get("data"))
        return event if data is None else {**event, "data": data}

    def wire(self, kind: str, data: msgspec.Raw) -> msgspec.Raw | dict[str, Any]:
        """A hint entry's pre-encoded data, decoded and viewed only for an executed card."""
        if kind not in _CARD_KINDS or _EXECUTED not in bytes(data):
            return data
        try:
            viewed = self.of(kind, _decode(bytes(data)))
        except msgspec.DecodeError:
            return data
        return data if viewed is None else viewed
