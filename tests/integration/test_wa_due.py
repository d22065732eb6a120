"""The WhatsApp courier's work list (migration 0012, design note 37): the appends of a
thread bound to a number list it in ``wa_due``; the claim reads only those threads and
takes a thread off the list once the contact's cursor has passed what was listed. Nothing
appended is lost to a claim running at the same moment, and nothing is claimed twice."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from importlib import resources

import asyncpg
import pytest

from signoff.store.postgres import PostgresStore
from signoff.store.threads import append_in
from tests.conftest import drop_database, fresh_database

pytestmark = pytest.mark.anyio

TENANT = "wa-due"
WINDOW = 86400.0


@pytest.fixture
def own_database() -> Iterator[str]:
    """A database of its own, migrated: a claim takes every due entry of the database.
    Direct to Postgres: one test replays the migrations itself on a fresh one."""
    url, name = fresh_database("so_wadue")
    yield url
    drop_database(name)


@pytest.fixture
async def store(own_database: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.connect(own_database)
    try:
        await s.migrate()
        yield s
    finally:
        await s.close()


async def test_two_first_messages_binding_one_number_list_only_the_winner(
    store: PostgresStore, own_database: str
) -> None:
    """Two gateways take a number's first message at once, each with a new thread: one
    binds (its thread flagged, its appends listed); the other's thread stays unbound
    and unlisted, and is deleted as the webhook deletes it."""
    one = await store.threads.create_thread(TENANT, "wa:5511900000009")
    two = await store.threads.create_thread(TENANT, "wa:5511900000009")
    bound = await asyncio.gather(
        store.whatsapp.add_contact(TENANT, "5511900000009", one.id),
        store.whatsapp.add_contact(TENANT, "5511900000009", two.id),
    )
    winner = one.id if bound[0] == one.id else two.id
    loser = two.id if winner == one.id else one.id
    assert sorted(b for b in bound if b is not None) == [winner]
    assert await store.delete_empty_thread(loser)
    entry = await store.threads.append(winner, "assistant", {"text": "hello"})
    assert await due(own_database) == {winner: entry.seq}
    claimed = await store.whatsapp.claim_outgoing("gateway-a", WINDOW)
    assert [(c.thread_id, c.seq) for c in claimed] == [(winner, entry.seq)]


async def due(url: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        return {str(r["thread_id"]): r["seq"] for r in await conn.fetch("SELECT * FROM wa_due")}
    finally:
        await conn.close()


async def bound_thread(store: PostgresStore, wa_id: str) -> str:
    thread = await store.threads.create_thread(TENANT, f"wa:{wa_id}")
    assert await store.whatsapp.add_contact(TENANT, wa_id, thread.id) == thread.id
    return thread.id


async def test_appends_of_a_bound_thread_are_listed_and_claimed_once(
    store: PostgresStore, own_database: str
) -> None:
    before = await store.threads.create_thread(TENANT, "wa:5511900000001")
    await store.threads.append(before.id, "assistant", {"text": "before the number"})
    assert await store.whatsapp.add_contact(TENANT, "5511900000001", before.id) == before.id
    web = await store.threads.create_thread(TENANT, "web-user")
    await store.threads.append(web.id, "assistant", {"text": "not WhatsApp"})
    assert await due(own_database) == {}  # neither an append before binding nor a web thread

    first = await store.threads.append(before.id, "assistant", {"text": "hello"})
    second = await store.threads.append(before.id, "user", {"text": "hi"})
    assert await due(own_database) == {before.id: second.seq}

    claimed = await store.whatsapp.claim_outgoing("gateway-a", WINDOW)
    assert [(c.thread_id, c.seq, c.kind) for c in claimed] == [(before.id, first.seq, "assistant")]
    assert await due(own_database) == {}  # the cursor passed the user entry too
    assert await store.whatsapp.claim_outgoing("gateway-b", WINDOW) == []


async def test_a_claim_of_a_long_log_leaves_the_thread_listed_until_it_is_through(
    store: PostgresStore, own_database: str
) -> None:
    thread = await bound_thread(store, "5511900000002")
    seqs = [
        (await store.threads.append(thread, "assistant", {"text": f"m{i}"})).seq for i in range(5)
    ]
    got = await store.whatsapp.claim_outgoing("gateway-a", WINDOW, limit=3)
    assert [c.seq for c in got] == seqs[:3]
    assert await due(own_database) == {thread: seqs[-1]}
    got = await store.whatsapp.claim_outgoing("gateway-a", WINDOW, limit=3)
    assert [c.seq for c in got] == seqs[3:]
    assert await due(own_database) == {}


async def test_an_append_racing_a_claim_is_claimed_by_the_next_poll(
    store: PostgresStore, own_database: str
) -> None:
    """The append holds the thread's `wa_due` row (its seq raised, uncommitted) while a
    claim takes what it can see and comes to delete that row: the claim waits, re-reads
    the row, finds a seq past its cursor and leaves it. The next poll sends the entry."""
    thread = await bound_thread(store, "5511900000003")
    seen = await store.threads.append(thread, "assistant", {"text": "seen"})
    writer = await asyncpg.connect(own_database)
    await writer.set_type_codec(
        "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
    )
    try:
        tx = writer.transaction()
        await tx.start()
        racing = await append_in(writer, thread, "assistant", {"text": "racing"}, None)
        claim = asyncio.ensure_future(store.whatsapp.claim_outgoing("gateway-a", WINDOW))
        await asyncio.sleep(0.5)
        assert not claim.done()  # waiting for the row the append holds
        await tx.commit()
        first = await asyncio.wait_for(claim, 10)
    finally:
        await writer.close()
    assert [c.seq for c in first] == [seen.seq]
    assert await due(own_database) == {thread: racing.seq}
    second = await store.whatsapp.claim_outgoing("gateway-b", WINDOW)
    assert [c.seq for c in second] == [racing.seq]
    assert await due(own_database) == {}


async def test_two_gateways_claiming_at_once_take_each_entry_once(
    store: PostgresStore, own_database: str
) -> None:
    threads = [await bound_thread(store, f"55119000001{i:02d}") for i in range(10)]
    for t in threads:
        for i in range(3):
            await store.threads.append(t, "assistant", {"text": f"m{i}"})
    taken: list[tuple[str, int]] = []
    for _ in range(5):
        a, b = await asyncio.gather(
            store.whatsapp.claim_outgoing("gateway-a", WINDOW, limit=7),
            store.whatsapp.claim_outgoing("gateway-b", WINDOW, limit=7),
        )
        taken += [(c.thread_id, c.seq) for c in a + b]
    assert sorted(taken) == sorted(set(taken))
    assert len(taken) == 30
    assert await due(own_database) == {}


async def test_the_migration_lists_the_contacts_with_entries_not_yet_claimed(
    own_database: str,
) -> None:
    """A database upgraded with entries waiting: 0012 flags every bound thread and lists
    those whose cursor is behind their log, so the first poll after the upgrade sends them."""
    files = sorted(
        (
            f
            for f in resources.files("signoff.store.migrations").iterdir()
            if f.name.endswith(".sql")
        ),
        key=lambda f: f.name,
    )
    conn = await asyncpg.connect(own_database)
    try:
        for f in files:
            if f.name.startswith("0012"):
                break
            await conn.execute(f.read_text())
        await conn.execute(
            """
            INSERT INTO threads (id, tenant, owner, last_seq) VALUES
                ('00000000-0000-0000-0000-00000000000a', 'wa-due', 'a', 3),
                ('00000000-0000-0000-0000-00000000000b', 'wa-due', 'b', 2);
            INSERT INTO wa_contacts (tenant, wa_id, thread_id, sent_seq) VALUES
                ('wa-due', 'a', '00000000-0000-0000-0000-00000000000a', 1),
                ('wa-due', 'b', '00000000-0000-0000-0000-00000000000b', 2);
            """
        )
        await conn.execute(next(f for f in files if f.name.startswith("0012")).read_text())
        flagged = await conn.fetchval("SELECT count(*) FROM threads WHERE wa")
        listed = await conn.fetch("SELECT thread_id::text, seq FROM wa_due")
    finally:
        await conn.close()
    assert flagged == 2
    assert [(r["thread_id"], r["seq"]) for r in listed] == [
        ("00000000-0000-0000-0000-00000000000a", 3)
    ]
