"""Thread hints carry their entries (runtime.hints): a gateway socket gets them straight
from the hint when they follow what it has, skips what it has, and re-reads Postgres on
a gap (real Postgres and the harness's bus)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from signoff.gateway.feed import Feeds
from signoff.gateway.service import GatewayService
from signoff.gateway.ws import Connection
from signoff.runtime.hints import Hint, wire
from signoff.runtime.keys import Keys
from signoff.runtime.records import Entry
from tests.harness import harness
from tests.integration.test_decisions import Scripted

pytestmark = pytest.mark.anyio


class Socket:
    """Collects what the gateway sends (the WebSocket transport itself is tested elsewhere)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))


async def test_entries_from_the_hint_duplicates_skipped_gaps_read_from_postgres(
    database_url: str,
) -> None:
    async with harness(database_url, model=Scripted()) as h:
        thread = await h.store.create_thread(h.tenant, "ana")
        first = await h.store.append(thread.id, "error", {"n": 1})
        feeds = Feeds(h.bus, Keys(h.settings.key_prefix))
        service = GatewayService(store=h.store, bus=h.bus, decisions=h.decisions)
        sock = Socket()
        conn = Connection(sock, service, feeds, h.tokens, 1 << 20)  # type: ignore[arg-type]
        try:
            await conn.follow(thread.id, first.seq)
            assert sock.sent == []
            listener = conn._listeners[thread.id]

            # the next entry, carried by the hint: sent as the hint says (not re-read)
            second = await h.store.append(thread.id, "error", {"n": 2})
            told = Entry(
                thread_id=thread.id,
                seq=second.seq,
                run_id=None,
                kind="error",
                body={"n": 2, "via": "hint"},
                created_at=datetime.now(UTC),
            )
            await listener(Hint(seq=second.seq, entries=[wire(told)]))
            assert [(e["seq"], e["data"]) for e in sock.sent] == [
                (second.seq, {"n": 2, "via": "hint"})
            ]

            # the same hint again (a reordered duplicate): nothing is sent twice
            await listener(Hint(seq=second.seq, entries=[wire(told)]))
            assert len(sock.sent) == 1

            # a gap (the hint for the third entry was lost): read from Postgres, in order
            third = await h.store.append(thread.id, "error", {"n": 3})
            fourth = await h.store.append(thread.id, "error", {"n": 4})
            await listener(Hint(seq=fourth.seq, entries=[wire(fourth)]))
            assert [(e["seq"], e["data"]) for e in sock.sent[1:]] == [
                (third.seq, {"n": 3}),
                (fourth.seq, {"n": 4}),
            ]
            # a hint without entries: re-read, nothing new
            await listener(Hint(seq=-1))
            assert len(sock.sent) == 3

            # a hint that overlaps what the socket has: only the new part, from the hint
            fifth = await h.store.append(thread.id, "error", {"n": 5})
            marked = Entry(
                thread_id=thread.id,
                seq=fifth.seq,
                run_id=None,
                kind="error",
                body={"n": 5, "via": "hint"},
                created_at=fifth.created_at,
            )
            await listener(Hint(seq=fifth.seq, entries=[wire(fourth), wire(marked)]))
            assert [(e["seq"], e["data"]) for e in sock.sent[3:]] == [
                (fifth.seq, {"n": 5, "via": "hint"})
            ]
        finally:
            feeds.remove(thread.id, conn._listeners[thread.id])
            await feeds.close()
