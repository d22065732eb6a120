"""The partitioned inbox: N streams spread over a cluster's slots (design note 31).

One stream (:class:`~.inbox.Inbox`) would sit on one shard of a Redis Cluster, so
every message of every gateway would go through one master. Here the inbox is N
streams whose keys carry hash tags spreading them evenly over the slot space
(:meth:`~signoff.runtime.keys.Keys.inbox_partition`); a thread always goes to the
same partition (:meth:`~signoff.runtime.keys.Keys.partition_of`), so its messages
keep their order. Every worker consumes every partition, in the one consumer group
each stream has, and claims dead consumers' entries per partition.

A blocking ``XREADGROUP`` cannot span streams in different slots, so a ``take`` keeps
one blocking read per partition in flight and returns what the first ones bring; the
reads still waiting stay in flight and their entries are handed out by the next
``take`` of that consumer (cancelling one could strand an entry Redis already
delivered, until a claim round). Those reads ask, together, for no more than the room
the consumer gave (``take``'s ``count``). A delivery's id is ``<partition>/<entry id>``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from signoff.runtime.bus.client import Client
from signoff.runtime.bus.inbox import TAKE_COUNT, Inbox
from signoff.runtime.bus.protocol import Delivery, Job
from signoff.runtime.errors import InvalidInput, Unavailable
from signoff.runtime.keys import Keys

log = logging.getLogger("signoff.bus")

Read = asyncio.Task[list[Delivery]]


class PartitionedInbox:
    """The inbox as ``partitions`` streams; same methods as :class:`~.inbox.Inbox`."""

    def __init__(
        self,
        client: Client,
        keys: Keys,
        alive: Callable[[str], Awaitable[bool]],
        *,
        partitions: int,
        claim_idle_ms: int = 30_000,
    ) -> None:
        if partitions < 2:
            raise InvalidInput("a partitioned inbox needs at least 2 partitions")
        self._keys = keys
        self.partitions = [
            Inbox(
                client,
                keys,
                alive,
                claim_idle_ms=claim_idle_ms,
                stream=keys.inbox_partition(index, partitions),
            )
            for index in range(partitions)
        ]
        self._reads: dict[tuple[str, int], Read] = {}
        self._asks: dict[tuple[str, int], int] = {}  # the most each read in flight may bring
        self._turn: dict[str, int] = {}  # where a consumer's next short share starts
        self._closed = False

    async def enqueue(self, job: Job) -> str:
        index = self._keys.partition_of(job.thread_id, len(self.partitions))
        return f"{index}/{await self.partitions[index].enqueue(job)}"

    async def take(self, consumer: str, timeout: float, count: int = TAKE_COUNT) -> list[Delivery]:
        """Claimed entries of dead consumers first, else new ones of any partition.

        ``count`` is the caller's room for what this take returns and what the reads it
        leaves in flight may bring later: a read asks for its share of the room the reads
        already in flight have not asked for, so the two together never exceed it, and a
        caller whose room is full has no read in flight that Redis could hand entries to
        (they would wait, claimed by it, until it had room: design note 58)."""
        claimed: list[Delivery] = []
        room = count - self._asked(consumer)
        for index, part in enumerate(self.partitions):
            if len(claimed) >= room:
                break
            try:
                claimed += self._tagged(index, await part.claim(consumer, room - len(claimed)))
            except Unavailable as exc:  # that partition's master is away: read the others
                log.warning("inbox partition %d: claim round failed: %s", index, exc)
        if claimed:
            return claimed
        self._start_reads(consumer, timeout, room)
        mine = {key: task for key, task in self._reads.items() if key[0] == consumer}
        if not mine:  # no room given (a caller that reads with none would spin)
            await asyncio.sleep(min(max(timeout, 0.0), 0.05))
            return []
        await asyncio.wait(
            mine.values(), timeout=max(timeout, 0.05), return_when=asyncio.FIRST_COMPLETED
        )
        out: list[Delivery] = []
        error: BaseException | None = None
        for key, task in mine.items():
            if not task.done():
                continue
            del self._reads[key]
            self._asks.pop(key, None)
            if task.cancelled():
                continue
            if (failed := task.exception()) is not None:
                error = error or failed
                continue
            out += self._tagged(key[1], task.result())
        if not out and error is not None:
            raise error
        if error is not None:
            log.warning("an inbox partition failed to read: %s", error)
        return out

    def _asked(self, consumer: str) -> int:
        """Entries the reads of ``consumer`` in flight may still bring."""
        return sum(n for key, n in self._asks.items() if key[0] == consumer)

    def _start_reads(self, consumer: str, timeout: float, room: int) -> None:
        """A read on each partition with none in flight, sharing ``room`` out (one each
        while it lasts when it is short, starting one partition further every time, so
        every partition is read in turn)."""
        idle = [i for i in range(len(self.partitions)) if (consumer, i) not in self._reads]
        if room <= 0 or not idle:
            return
        turn = self._turn.get(consumer, 0)
        self._turn[consumer] = turn + 1
        idle = idle[turn % len(idle) :] + idle[: turn % len(idle)]
        base, extra = divmod(room, len(idle))
        for n, index in enumerate(idle):
            ask = base + (1 if n < extra else 0)
            if ask <= 0:
                break
            key = (consumer, index)
            self._asks[key] = ask
            self._reads[key] = asyncio.create_task(
                self.partitions[index].read(consumer, timeout, ask),
                name=f"signoff-inbox-{index}",
            )

    async def stats(self) -> tuple[int, int]:
        """(lag, pending) summed over the partitions (the metrics port's inbox gauges)."""
        lag = pending = 0
        for part in self.partitions:
            part_lag, part_pending = await part.stats()
            lag, pending = lag + part_lag, pending + part_pending
        return lag, pending

    async def ack(self, delivery_id: str) -> None:
        index, entry = self._split(delivery_id)
        await self.partitions[index].ack(entry)

    def release(self, delivery: Delivery) -> None:
        index, entry = self._split(delivery.id)
        self.partitions[index].release(Delivery(entry, delivery.job))

    async def close(self) -> None:
        """Stop the reads in flight (their entries go to a claim round elsewhere)."""
        self._closed = True
        reads = list(self._reads.values())
        self._reads.clear()
        self._asks.clear()
        for task in reads:
            task.cancel()
        if reads:
            await asyncio.wait(reads)
            for task in reads:
                if not task.cancelled():
                    task.exception()  # retrieved: a failed read of a closing bus is no news

    @staticmethod
    def _tagged(index: int, deliveries: list[Delivery]) -> list[Delivery]:
        return [Delivery(f"{index}/{d.id}", d.job) for d in deliveries]

    def _split(self, delivery_id: str) -> tuple[int, str]:
        index, sep, entry = delivery_id.partition("/")
        if (
            not sep
            or not (index.isascii() and index.isdigit())
            or int(index) >= len(self.partitions)
        ):
            raise InvalidInput(f"not a delivery of this inbox: {delivery_id!r}")
        return int(index), entry
