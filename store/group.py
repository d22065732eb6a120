"""Group commit of card transitions: those that arrive while their statements are all busy
are written together, by one statement (lever ``group-commit``, ``runtime/levers.py``).

A :class:`GroupCommit` serves one kind of transition (today a person's decision: the
worker's ``executing`` and ``executed`` moves were batched the same way and measured, and
it did not pay, ``bench/README.md``). At most ``SLOTS`` of its
statements are in flight per process. A transition that finds a slot free runs its single
statement at once, as it always did: an unloaded process waits for nothing. One that
finds them all busy queues; when a slot frees, everything queued (up to ``MAX_BATCH``
transitions, one per card) goes in one ``card_*_batch`` statement: one transaction, one
commit and one round trip instead of one each, which is what a saturated process and
Postgres spend their time on.

Each caller is still answered only after the commit that carries its transition, with the
row its own statement would have returned, or ``None`` when it changed nothing (the
caller then finds out why, as it always did, e.g. ``Cards.decide``'s diagnosis). A batch
statement locks the cards' threads in id order before any card (the one lock order,
note 16) and writes k log entries, in order, for a thread with k transitions. If it fails
as a whole, each of its transitions is run again on its own: one person's refusal or
error is never another's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from signoff.runtime import levers
from signoff.runtime.metrics import COUNTERS
from signoff.store.connector import Connector, Row

log = logging.getLogger("signoff.store")

SLOTS = 4  # statements of one kind in flight per process before transitions queue
MAX_BATCH = 64  # transitions per batch statement

Args = tuple[Any, ...]  # one transition's values; the card id first


class _Waiting:
    __slots__ = ("args", "future")

    def __init__(self, args: Args, future: asyncio.Future[Row | None]) -> None:
        self.args = args
        self.future = future


class GroupCommit:
    """One kind of transition: ``single`` runs one (its row or None); ``batch`` is the
    statement taking, for each of its parameters, the array of that value of every
    transition it writes, and returning their rows with their position ``ord``."""

    def __init__(
        self,
        db: Connector,
        *,
        single: Callable[[Args], Awaitable[Row | None]],
        batch: str,
        slots: int = SLOTS,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._db = db
        self._single = single
        self._batch = batch
        self._slots = max(slots, 1)
        self._max_batch = max(max_batch, 1)
        self._busy = 0
        self._queue: deque[_Waiting] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self.on = levers.on("group-commit")

    async def run(self, args: Args) -> Row | None:
        """One transition; its row, or None when it changed nothing."""
        if not self.on or (self._busy < self._slots and not self._queue):
            self._busy += 1
            try:
                return await self._single(args)
            finally:
                self._busy -= 1
                self._next()
        future: asyncio.Future[Row | None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(args, future))
        return await future

    def _next(self) -> None:
        """Start a batch of what is queued for each free slot."""
        while self._queue and self._busy < self._slots:
            batch: list[_Waiting] = []
            cards: set[Any] = set()
            later: list[_Waiting] = []
            while self._queue and len(batch) < self._max_batch:
                item = self._queue.popleft()
                if item.future.done():  # its caller gave up
                    continue
                if item.args[0] in cards:  # one transition per card in a statement
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
                await _settle(batch[0], self._single(batch[0].args))
                return
            try:
                found = await self._db.fetch(self._batch, *_arrays([i.args for i in batch]))
            except Exception as exc:  # the statement as a whole: each transition on its own
                log.warning("a batch of %d transitions failed (%s); one by one", len(batch), exc)
                COUNTERS.inc("signoff_group_commit_fallbacks_total")
                await asyncio.gather(*(_settle(item, self._single(item.args)) for item in batch))
                return
            COUNTERS.inc("signoff_group_commit_batches_total")
            COUNTERS.inc("signoff_group_commit_transitions_total", len(batch))
            by_position = {int(row["ord"]): row for row in found}
            for position, item in enumerate(batch, start=1):
                if not item.future.done():
                    item.future.set_result(by_position.get(position))
        finally:
            self._busy -= 1
            self._next()


async def _settle(item: _Waiting, step: Awaitable[Row | None]) -> None:
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


def _arrays(columns: Sequence[Args]) -> list[list[Any]]:
    """The transitions' values as one array per statement parameter."""
    return [list(column) for column in zip(*columns, strict=True)]
