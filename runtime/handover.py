"""Handing a run to the workers that serve its tool (design note 21).

An approved card of the run names a tool this worker does not serve (another version of
the app proposed it): the card is not invalidated; the run goes to a live worker that
serves the tool (released: the next adopter takes it, or hands it on). With none alive,
it stays with this worker and is looked at again later, the wait doubling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from signoff.runtime import presence
from signoff.runtime.backoff import doubling
from signoff.runtime.errors import SignoffError, UnknownTool
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.store import Store

log = logging.getLogger("signoff.worker")

# With no live worker serving the tool, the run is looked at again after these many
# seconds (doubling up to the maximum): a worker that serves it may start.
RETRY_SECONDS = 5.0
RETRY_MAX_SECONDS = 60.0


async def hand_over(
    store: Store,
    worker_id: str,
    app: str,
    run_id: str,
    exc: UnknownTool,
    attempt: int,
    later: Callable[[str, int, float], None],
) -> None:
    """Release ``run_id`` to the workers of ``app`` serving ``exc.tool``, or ``later``
    look again."""
    try:
        handed = await store.hand_over_run(run_id, worker_id, exc.tool, presence.LIVE_SECONDS, app)
    except SignoffError as err:
        log.warning("run %s: could not hand it over (%s)", run_id, err)
        handed = False
    if handed:
        COUNTERS.inc("signoff_runs_handed_over_total")
        log.warning("%s: run %s handed to the workers that serve it", exc.message, run_id)
        return
    delay = doubling(RETRY_SECONDS, attempt, RETRY_MAX_SECONDS)
    log.error(
        "%s, and no live worker serves it: the card stays approved; run %s is looked "
        "at again in %.0fs",
        exc.message,
        run_id,
        delay,
    )
    later(run_id, attempt + 1, delay)
