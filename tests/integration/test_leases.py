"""One lease per worker (migration 0002): renewal is one row; adoption takes the runs of
lapsed workers exactly once (real Postgres)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import pytest

from signoff.store.postgres import PostgresStore
from tests.conftest import end_runs

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _end_runs(database_url: str) -> Iterator[None]:
    yield
    end_runs(database_url, "lease-t")


async def start_runs(store: PostgresStore, worker: str, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        thread = await store.create_thread("lease-t", "ana")
        run, _, _, _ = await store.start_run(
            thread.id,
            owner="ana",
            role="user",
            holder=worker,
            lease_seconds=30,
            content=[{"type": "text", "text": "hi"}],
            actor="ana",
            channel="test",
        )
        ids.append(run.id)
    return ids


async def holders(store: PostgresStore, run_ids: list[str]) -> dict[str, str | None]:
    return {r: (await store.get_run(r)).holder for r in run_ids}


async def test_renewing_touches_one_row_not_the_runs(store: PostgresStore) -> None:
    a = "wa-" + secrets.token_hex(3)
    runs = await start_runs(store, a, 5)

    async def versions() -> list[str]:
        async with store.pool.connection() as c:
            rows = await c.fetch("SELECT xmin::text FROM runs WHERE id = ANY($1::uuid[])", runs)
        return sorted(r[0] for r in rows)

    before = await versions()
    await store.renew_leases(a, 30)
    await store.renew_leases(a, 30)
    assert await versions() == before  # no run row rewritten
    other = "wb-" + secrets.token_hex(3)
    taken = await store.adopt_runs(other, 30, 1000)
    assert not set(runs) & {r.id for r in taken}  # a's lease is alive: nothing to take
    assert set((await holders(store, runs)).values()) == {a}


async def test_lapsed_worker_runs_are_adopted_once_by_racing_adopters(
    store: PostgresStore,
) -> None:
    dead = "wd-" + secrets.token_hex(3)
    runs = await start_runs(store, dead, 30)
    await store.renew_leases(dead, -1)  # its lease lapsed a second ago
    b, c = "wb-" + secrets.token_hex(3), "wc-" + secrets.token_hex(3)
    took_b, took_c = await asyncio.gather(
        store.adopt_runs(b, 30, 1000), store.adopt_runs(c, 30, 1000)
    )
    mine = set(runs)
    got_b = {r.id for r in took_b} & mine
    got_c = {r.id for r in took_c} & mine
    assert not got_b & got_c  # never two holders
    assert got_b | got_c == mine  # and none left behind
    now = await holders(store, runs)
    assert all(now[r] == (b if r in got_b else c) for r in runs)
    # the dead worker's row holds nothing now: it can be forgotten; a live one is kept
    assert await store.forget_workers(0) >= 1
    async with store.pool.connection() as conn:
        left = await conn.fetch("SELECT id FROM workers WHERE id = ANY($1::text[])", [dead, b, c])
    assert {r["id"] for r in left} == {b, c}


async def test_a_graceful_release_hands_every_run_back_at_once(store: PostgresStore) -> None:
    a = "wa-" + secrets.token_hex(3)
    runs = await start_runs(store, a, 4)
    await store.release_runs(a)
    assert set((await holders(store, runs)).values()) == {None}
    b = "wb-" + secrets.token_hex(3)
    taken = {r.id for r in await store.adopt_runs(b, 30, 1000)}
    assert set(runs) <= taken
    # a restarted worker with a stable id takes back what is still its own
    again = await start_runs(store, b, 2)
    await store.renew_leases(b, -1)
    own = {r.id for r in await store.adopt_runs(b, 30, 1000, own=True)}
    assert set(again) <= own


async def test_a_worker_whose_runs_were_adopted_cannot_write_them(store: PostgresStore) -> None:
    """The fence: a worker that stalled past its lease finds its writes refused once another
    worker adopted the run, so the run never gets two replies."""
    from signoff.runtime.errors import RunInactive

    a, b = "wa-" + secrets.token_hex(3), "wb-" + secrets.token_hex(3)
    (run_id,) = await start_runs(store, a, 1)
    run = await store.get_run(run_id)
    await store.renew_leases(a, -1)  # a stalls past its lease
    assert run_id in {r.id for r in await store.adopt_runs(b, 30, 1000)}
    before = (await store.get_thread(run.thread_id)).last_seq
    reply = ("assistant", {"content": [{"type": "text", "text": "late"}]})
    with pytest.raises(RunInactive):
        await store.run_step(run_id, run.thread_id, [reply], "done", {}, holder=a)
    with pytest.raises(RunInactive):
        await store.append(run.thread_id, *reply, run_id, holder=a)
    with pytest.raises(RunInactive):
        await store.set_run(run_id, "waiting", {}, holder=a)
    assert (await store.get_thread(run.thread_id)).last_seq == before  # nothing written
    written, done = await store.run_step(run_id, run.thread_id, [reply], "done", {}, holder=b)
    assert [e.seq for e in written] == [before + 1] and done.status == "done"
