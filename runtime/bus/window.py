"""Per-user quota windows on Redis: sorted sets of recently accepted messages.

``gateway/quotas.py`` records each message it accepts here before enqueueing it
(design note 19); one Lua script on one key adds and reads, so of concurrent adds on
any gateway each sees all the adds before it.
"""

from __future__ import annotations

from typing import Any

from signoff.runtime.bus.client import Client, text

# KEYS[1] a sorted set; ARGV: member, now (ms), window (ms). The key expires a window after
# its last add, so an idle user leaves nothing behind.
_WINDOW_ADD = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


class Window:
    """The ``gateway.quotas.Ledger`` on Redis."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._script: Any = None  # redis-py's AsyncScript (EVALSHA, EVAL on NOSCRIPT), made once

    async def window_add(self, key: str, member: str, now_ms: int, window_ms: int) -> list[str]:
        """Drop the members of sorted set ``key`` older than ``window_ms``, add ``member``
        at ``now_ms`` and return every member left (``member`` among them)."""
        script = self._script
        if script is None:
            script = self._script = self._client.redis.register_script(_WINDOW_ADD)
        members = await self._client.call(
            "EVALSHA", lambda: script(keys=[key], args=[member, now_ms, max(window_ms, 1)])
        )
        return [text(m) for m in members]

    async def window_remove(self, key: str, members: list[str]) -> None:
        """ZREM ``members`` from the sorted set ``key`` (a refused or settled entry)."""
        if members:
            await self._client.call("ZREM", lambda: self._client.redis.zrem(key, *members))
