"""Wait tokens and heartbeats: short-lived keys that say who holds what.

A wait token (``Keys.wait``) names the holder of a parked card's run: the worker
whose process has a future waiting on that card. A decision is signalled to the
holder its own statement names first; the token is the fallback (design note 18:
writing or deleting one never fails a step). A heartbeat (``Keys.worker``) says a
worker is alive, so the inbox leaves its entries to it. Both expire by their own
TTL; neither is ever the truth about a card (the database's clock decides, I7).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from signoff.runtime.bus.client import Client, text
from signoff.runtime.keys import Keys

CLEAR_BATCH = 1000  # wait tokens deleted per pipelined round trip


class WaitTokens:
    def __init__(self, client: Client, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    async def set_wait(self, card_id: str, holder: str, ttl_ms: int) -> None:
        await self._client.set_px(self._keys.wait(card_id), holder, ttl_ms)

    async def clear_wait(self, card_id: str) -> None:
        await self._client.delete(self._keys.wait(card_id))

    async def clear_waits(self, card_ids: Iterable[str]) -> None:
        """Pipelined single-key DELs, ``CLEAR_BATCH`` per round trip; stops at the first
        batch that fails after retries (the tokens left expire by their TTL)."""
        ids = iter(card_ids)
        while batch := [self._keys.wait(card_id) for card_id in islice(ids, CLEAR_BATCH)]:

            async def delete(keys: list[str] = batch) -> None:
                async with self._client.redis.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.delete(key)
                    await pipe.execute()

            await self._client.call("DEL", delete)

    async def wait_holder(self, card_id: str) -> str | None:
        holder = await self._client.get(self._keys.wait(card_id))
        return None if holder is None else text(holder)

    async def heartbeat(self, worker_id: str, ttl_ms: int) -> None:
        key = self._keys.worker(worker_id)
        await self._client.call("SET", lambda: self._client.redis.set(key, "1", px=max(ttl_ms, 1)))

    async def alive(self, worker_id: str) -> bool:
        """Whether the worker's heartbeat key is still there."""
        key = self._keys.worker(worker_id)
        return bool(await self._client.call("EXISTS", lambda: self._client.redis.exists(key)))

    async def claim_owner(self, owner: str, ttl_ms: int) -> str:
        """The prefix's owner (``Keys.owner``) after claiming it for ``owner``: set when
        free (or ours, then its expiry renewed), else whoever holds it."""
        key, ttl = self._keys.owner, max(ttl_ms, 1)

        async def claim() -> str:
            redis = self._client.redis
            for _ in range(3):  # a key expiring between SET NX and GET: try again
                if await redis.set(key, owner, px=ttl, nx=True):
                    return owner
                held = await redis.get(key)
                if held is None:
                    continue
                if text(held) == owner:
                    await redis.pexpire(key, ttl)
                return text(held)
            return owner

        return await self._client.call("SET", claim)
