"""Every Redis key and channel name, in one place (DESIGN.md §5)."""

from __future__ import annotations

import binascii
import functools
from dataclasses import dataclass

# A Redis Cluster's slots; a key's slot is CRC16/XMODEM of its hash tag (or of the whole
# key) modulo this. Computed here so that naming keys loads no Redis client.
REDIS_CLUSTER_HASH_SLOTS = 16384


def key_slot(key: bytes) -> int:
    """The cluster slot of ``key`` (the part inside its first non-empty ``{...}``, if any)."""
    start = key.find(b"{")
    if start > -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) % REDIS_CLUSTER_HASH_SLOTS


@dataclass(frozen=True)
class Keys:
    prefix: str = "so:"

    def wait(self, card_id: str) -> str:
        """Wait token: the holder (worker id) of a parked card's run; PX = time left on the
        card + grace."""
        return f"{self.prefix}wait:{card_id}"

    def worker(self, worker_id: str) -> str:
        """Heartbeat key, PX = 3 intervals."""
        return f"{self.prefix}worker:{worker_id}"

    def worker_channel(self, worker_id: str) -> str:
        """Pub/sub channel a worker listens on (decisions, interjections)."""
        return f"{self.prefix}w:{worker_id}"

    def thread_channel(self, thread_id: str) -> str:
        """Pub/sub channel of a thread's events, for gateways holding sockets."""
        return f"{self.prefix}t:{thread_id}"

    def user_channel(self, tenant: str, user: str) -> str:
        """Pub/sub channel of a person's thread list (a thread was created), for gateways
        whose sockets watch that list (gateway/watch.py)."""
        return f"{self.prefix}u:{len(tenant)}:{tenant}:{user}"

    def accepted_turns(self, tenant: str, user: str) -> str:
        """Sorted set of a user's accepted messages no worker has started yet: member the
        run id the message will get, score the acceptance time (ms). gateway/quotas.py."""
        return f"{self.prefix}quota:turns:{len(tenant)}:{tenant}:{user}"

    @property
    def owner(self) -> str:
        """Which app (on which database) uses this prefix on this Redis: its processes
        renew it, PX = a few beats (runtime/prefix_owner.py). Two apps on one prefix
        would take each other's inbox messages."""
        return f"{self.prefix}owner"

    @property
    def inbox(self) -> str:
        """Stream of user messages to run (consumer group ``workers``)."""
        return f"{self.prefix}inbox"

    def inbox_partition(self, index: int, partitions: int) -> str:
        """Stream ``index`` of a ``partitions``-way inbox; with one partition, :attr:`inbox`.

        Each partition key carries a hash tag chosen so that its slot falls in the
        ``index``-th of ``partitions`` equal slot ranges: on a cluster whose masters hold
        contiguous, even slot ranges (what ``redis-cli --cluster create`` makes) the
        partitions spread evenly over the masters (design note 31)."""
        if partitions <= 1:
            return self.inbox
        return f"{self.prefix}inbox:{{{_spread_tag(index, partitions)}}}"

    def partition_of(self, thread_id: str, partitions: int) -> int:
        """The inbox partition of a thread: always the same one, so its messages keep
        their order."""
        if partitions <= 1:
            return 0
        return key_slot(thread_id.encode()) % partitions

    @property
    def inbox_group(self) -> str:
        """Consumer group of the inbox stream (one group: every worker competes for jobs)."""
        return "workers"


@functools.cache
def _spread_tag(index: int, partitions: int) -> str:
    """The first tag ``p<index>.<n>`` whose slot lies in the ``index``-th slot range."""
    low = index * REDIS_CLUSTER_HASH_SLOTS // partitions
    high = (index + 1) * REDIS_CLUSTER_HASH_SLOTS // partitions
    n = 0
    while True:
        tag = f"p{index}.{n}"
        if low <= key_slot(tag.encode()) < high:
            return tag
        n += 1
