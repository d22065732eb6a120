"""Group commit of decisions: those that arrive while the deciding statements are all busy
are written together, by one statement (lever ``group-commit``, ``runtime/levers.py``).

At most ``SLOTS`` deciding statements of a process are in flight. A decision that finds a
slot free runs ``card_decide_logged`` at once, as it always did: an unloaded gateway
waits for nothing. One that finds them all busy queues; when a slot frees, everything
queued (up to ``MAX_BATCH`` decisions, one per card) goes in one ``card_decide_batch``
statement: one transaction, one commit, one round trip instead of one each, which is
what a saturated gateway and Postgres spend their time on.

Each caller is still answered only after the commit that carries its decision, with the
row its own statement would have returned, or ``None`` when its decision changed
nothing (the caller then diagnoses why, as it always did: ``Cards.decide``). The batch
statement locks the cards' threads in id order before any card (the one lock order,
note 16), and writes k log entries in order for a thread with k decisions. If the batch
statement fails as a whole, each of its decisions is run again on its own: a refusal
or error is never shared with another person's decision.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from signoff.runtime import levers
from signoff.runtime.metrics import COUNTERS
from signoff.store.connector import Connector, Row
from signoff.store.queries import SQL

log = logging.getLogger("signoff.store")

SLOTS = 4  # deciding statements in flight per process before decisions queue
MAX_BATCH = 64  # decisions per batch statement

# One decision: card, status, principal, channel, reason, hash, tenant, tools (comma-joined).
Args = tuple[str, str, str, str, str | None, str, str | None, str | None]


class _Waiting:
    __slots__ = ("args", "future")

    def __init__(self, args: Args, future: asyncio.Future[Row | None]) -> None:
        self.args = args
        self.future = future


class GroupCommit:
    """The deciding statements of one process (one per store)."""

    def __init__(self, db: Connector, *, slots: int = SLOTS, max_batch: int = MAX_BATCH) -> None:
        self._db = db
        self._slots = max(slots, 1)
        self._max_batch = max(max_batch, 1)
        self._busy = 0
        self._queue: deque[_Waiting] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self.on = levers.on("group-commit")

    async def decide(self, args: Args) -> Row | None:
        """Run one decision (``card_decide_logged``'s parameters but the event detail,
        derived from the reason); its row, or None when it changed nothing."""
        if not self.on or (self._busy < self._slots and not self._queue):
            self._busy += 1
            try:
                return await self._one(args)
            finally:
                self._busy -= 1
                self._next()
        future: asyncio.Future[Row | None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(args, future))
        return await future

    async def _one(self, args: Args) -> Row | None:
        card, status, principal, channel, reason, snapshot_hash, tenant, tools = args
        detail = {"reason": reason} if reason else {}
        return await self._db.fetchrow(
            SQL.card_decide_logged,
            card,
            status,
            principal,
            channel,
            reason,
            snapshot_hash,
            tenant,
            detail,
            tools,
        )

    def _next(self) -> None:
        """Start a batch of what is queued for each free slot."""
        while self._queue and self._busy < self._slots:
            batch: list[_Waiting] = []
            cards: set[str] = set()
            later: list[_Waiting] = []
            while self._queue and len(batch) < self._max_batch:
                item = self._queue.popleft()
                if item.future.done():  # its caller gave up
                    continue
                if item.args[0] in cards:  # one decision per card in a statement
                    later.append(item)
                    continue
                cards.add(item.args[0])
                batch.append(item)
            self._queue.extendleft(reversed(later))
            if not batch:
                return
            self._busy += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Waiting]) -> None:
        try:
            if len(batch) == 1:
                await _settle(batch[0], self._one(batch[0].args))
                return
            try:
                found = await self._db.fetch(SQL.card_decide_batch, *_columns(batch))
            except Exception as exc:  # the statement as a whole: each decision on its own
                log.warning("a batch of %d decisions failed (%s); one by one", len(batch), exc)
                COUNTERS.inc("signoff_group_commit_fallbacks_total")
                await asyncio.gather(*(_settle(item, self._one(item.args)) for item in batch))
                return
            COUNTERS.inc("signoff_group_commit_batches_total")
            COUNTERS.inc("signoff_group_commit_decisions_total", len(batch))
            by_position = {int(row["ord"]): row for row in found}
            for position, item in enumerate(batch, start=1):
                if not item.future.done():
                    item.future.set_result(by_position.get(position))
        finally:
            self._busy -= 1
            self._next()


async def _settle(item: _Waiting, step: Any) -> None:
    try:
        row = await step
    except BaseException as exc:
        if not item.future.done():
            item.future.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
        return
    if not item.future.done():
        item.future.set_result(row)


def _columns(batch: Sequence[_Waiting]) -> list[list[Any]]:
    """The batch as the statement's eight arrays (one element per decision)."""
    return [list(column) for column in zip(*(item.args for item in batch), strict=True)]
