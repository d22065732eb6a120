"""Back-pressure: a gateway works on at most ``SIGNOFF_MAX_IN_FLIGHT`` things at once.

The things counted are API requests (``/v1/...`` over HTTP, from the moment the whole
request has arrived, so a slow client holds no slot) and the WebSocket frames that write
(``message``, ``resolve``). Past the limit the next one is refused at once with a typed
503 ``overloaded`` and ``Retry-After: 1`` (a WebSocket frame gets the same as an ``error``
frame; the socket stays open), before it touches Postgres, and the refusal is counted in
``signoff_overload_refusals_total{reason="in_flight"}``; ``signoff_gateway_in_flight``
shows how close a gateway is.

Why this measure: under overload a gateway's latency collapses because its requests queue
for the Postgres pool (``SIGNOFF_POOL_SIZE`` connections, each request holding one for a
few milliseconds); queued past ``SIGNOFF_DB_TIMEOUT_SECONDS`` they fail anyway, after
having made everyone else wait. Bounding the work in flight bounds that queue, so the
requests admitted keep their latency and the rest learn at once to retry elsewhere or
later (design note 27).
"""

from __future__ import annotations

from signoff.runtime.errors import Overloaded
from signoff.runtime.metrics import OVERLOAD


class Admission:
    """Counts work in flight against a limit (0: no limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self._refused = OVERLOAD.labels("in_flight")

    def enter(self) -> None:
        """Take a slot, or raise :class:`Overloaded` (counted)."""
        if self.limit and self.in_flight >= self.limit:
            self._refused.inc()
            raise Overloaded(
                f"this gateway is at its limit of {self.limit} requests in flight; retry",
                retry_after=1,
            )
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1

    def __enter__(self) -> Admission:
        self.enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()
