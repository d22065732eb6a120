"""Retention (`signoff prune`, runtime/retention.py): what is deleted, what never is, the
audit exported first, and every race: two prunes, a prune and a new message, a prune
killed between batches."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from signoff.runtime import retention
from signoff.runtime.cards import Decision, Status
from signoff.runtime.errors import NotFound, SignoffError, Unavailable
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.records import PruneCounts
from signoff.store.postgres import PostgresStore
from tests import pgbouncer
from tests.harness import Harness, harness
from tests.integration.test_decisions import Scripted, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def age(h: Harness, thread_ids: list[str], days: float = 10) -> None:
    """Make threads (and their log) look ``days`` old."""
    await h.store.pool.execute(
        "UPDATE threads SET created_at = created_at - make_interval(days => $2::int) "
        "WHERE id = ANY($1::uuid[])",
        thread_ids,
        int(days),
    )
    await h.store.pool.execute(
        "UPDATE messages SET created_at = created_at - make_interval(days => $2::int) "
        "WHERE thread_id = ANY($1::uuid[])",
        thread_ids,
        int(days),
    )


async def executed_thread(h: Harness, user: str = "alice") -> tuple[str, str]:
    """A finished thread whose card was approved and executed; (thread, card)."""
    thread = await h.thread(user)
    await h.say(thread, "cobre", user)
    (card,) = await h.store.pending_cards(thread)
    done = await h.approve(card)
    assert done.status is Status.EXECUTED
    return thread, card.id


async def pending_thread(h: Harness, user: str = "bob") -> tuple[str, str]:
    thread = await h.thread(user)
    await h.say(thread, "cobre", user)
    (card,) = await h.store.pending_cards(thread)
    return thread, card.id


async def rows_of(store: PostgresStore, thread_ids: list[str]) -> dict[str, int]:
    out = {}
    for table in ("threads", "messages", "runs", "cards"):
        column = "id" if table == "threads" else "thread_id"
        n = await store.pool.fetchval(
            f"SELECT count(*) FROM {table} WHERE {column} = ANY($1::uuid[])", thread_ids
        )
        assert isinstance(n, int)
        out[table] = n
    return out


def policy_for(tenant: str, days: float = 1) -> retention.Policy:
    return retention.Policy.parse(0, [f"{tenant}={days}"])


async def prune(
    h: Harness, folder: Path, *, batch: int = 200, dry_run: bool = False
) -> PruneCounts:
    archive = retention.JsonlArchive(folder)
    done = await retention.prune(
        h.store.retention,
        policy_for(h.tenant),
        archive=archive,
        batch=batch,
        dry_run=dry_run,
        only=h.tenant,
    )
    return done.rules.get(h.tenant, PruneCounts())


def audit_lines(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for f in sorted(folder.glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]


def archive_modes(folder: Path) -> list[int]:
    return [os.stat(f).st_mode & 0o777 for f in sorted(folder.glob("*.jsonl"))]


async def test_old_quiet_threads_go_with_their_rows_and_the_audit_is_exported_first(
    database_url: str, tmp_path: Path
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        old_done, old_card = await executed_thread(h)
        old_pending, _ = await pending_thread(h)
        recent, _ = await executed_thread(h, "carol")
        approved_t, approved_card = await pending_thread(h, "dan")
        await h.worker.stop(release=False)  # nobody executes the approved card
        await h.decide(await h.card(approved_card), Decision.APPROVE)
        await age(h, [old_done, old_pending, approved_t])
        before = await rows_of(h.store, [old_done])
        assert before["messages"] > 0 and before["cards"] == 1

        dry = await prune(h, tmp_path, dry_run=True)
        assert dry.threads == 1 and dry.audited == 1
        assert await rows_of(h.store, [old_done]) == before  # a dry run changes nothing
        assert audit_lines(tmp_path) == []

        done = await prune(h, tmp_path)
        assert done == dry
        assert done.messages == before["messages"] and done.runs == before["runs"]
        assert await rows_of(h.store, [old_done]) == dict.fromkeys(before, 0)
        # never touched: a pending card, an approved card, a recent thread
        for kept in (old_pending, recent, approved_t):
            assert (await rows_of(h.store, [kept]))["threads"] == 1
        (line,) = audit_lines(tmp_path)
        assert line["id"] == old_card and line["status"] == "executed"
        assert [e["to"] for e in line["events"]] == ["pending", "approved", "executing", "executed"]
        assert line["events"][1]["actor"] == "alice" and line["summary"]
        assert archive_modes(tmp_path) == [0o600]
        assert await prune(h, tmp_path) == PruneCounts()  # nothing left to do


async def test_an_active_run_and_a_card_executing_keep_their_thread(
    database_url: str, tmp_path: Path
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        running, _ = await pending_thread(h)
        await h.store.pool.execute(
            "UPDATE runs SET status = 'running' WHERE thread_id = $1::uuid", running
        )
        executing, card2 = await pending_thread(h, "eve")
        await h.worker.stop(release=False)
        await h.store.pool.execute(
            "UPDATE runs SET status = 'done' WHERE thread_id = $1::uuid", executing
        )
        await h.store.pool.execute(
            "UPDATE cards SET status = 'executing' WHERE id = $1::uuid", card2
        )
        await age(h, [running, executing])
        assert await prune(h, tmp_path) == PruneCounts()
        assert (await rows_of(h.store, [running, executing]))["threads"] == 2


async def test_another_tenant_and_a_zero_rule_are_kept(database_url: str, tmp_path: Path) -> None:
    async with harness(database_url, model=Scripted(pix())) as a:
        async with harness(database_url, model=Scripted(pix())) as b:
            ta, _ = await executed_thread(a)
            tb, _ = await executed_thread(b)
            await age(a, [ta])
            await age(b, [tb])
            policy = retention.Policy.parse(0, [f"{a.tenant}=1", f"{b.tenant}=0"])
            archive = retention.JsonlArchive(tmp_path)
            done = await retention.prune(a.store.retention, policy, archive=archive)
            assert done.rules[a.tenant].threads == 1 and b.tenant not in done.rules
            assert (await rows_of(b.store, [tb]))["threads"] == 1
            assert (await rows_of(a.store, [ta]))["threads"] == 0


async def test_two_prunes_racing_delete_each_thread_once_and_export_it_once(
    database_url: str, tmp_path: Path
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        threads = [(await executed_thread(h, f"u{i}"))[0] for i in range(8)]
        await age(h, threads)
        one, two = await asyncio.gather(
            prune(h, tmp_path / "a", batch=1), prune(h, tmp_path / "b", batch=1)
        )
        assert one.threads + two.threads == 8
        assert one.audited + two.audited == 8
        lines = audit_lines(tmp_path / "a") + audit_lines(tmp_path / "b")
        assert len(lines) == 8 and len({line["id"] for line in lines}) == 8
        assert (await rows_of(h.store, threads))["threads"] == 0


async def test_a_new_message_holding_an_old_thread_keeps_it(
    database_url: str, tmp_path: Path
) -> None:
    """The message's transaction holds the thread (as start_run does): the prune skips it,
    and once the message committed the thread is no longer quiet."""
    async with harness(database_url, model=Scripted(pix())) as h:
        thread, _ = await executed_thread(h)
        await age(h, [thread])
        async with h.store.db.tx() as conn:
            await conn.execute(
                "SELECT id FROM threads WHERE id = $1::uuid FOR NO KEY UPDATE", thread
            )
            seq = await conn.fetchval(
                "UPDATE threads SET last_seq = last_seq + 1 WHERE id = $1::uuid RETURNING last_seq",
                thread,
            )
            await conn.execute(
                "INSERT INTO messages (thread_id, seq, kind, body) VALUES ($1::uuid, $2, 'user', "
                "'{\"content\": []}'::jsonb)",
                thread,
                seq,
            )
            assert await prune(h, tmp_path) == PruneCounts()  # skipped, not waited for
        assert await prune(h, tmp_path) == PruneCounts()  # the thread is active again
        assert (await rows_of(h.store, [thread]))["threads"] == 1


async def test_a_message_after_the_prune_is_a_clear_error_and_writes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        thread, _ = await executed_thread(h)
        await age(h, [thread])
        race = await asyncio.gather(
            prune(h, tmp_path), h.say(thread, "de novo", "alice"), return_exceptions=True
        )
        counts, said = race
        assert isinstance(counts, PruneCounts)
        if counts.threads == 1:
            # The prune won: the worker finds no thread (NotFound, the run never exists),
            # reports nothing it could write, and nothing is left behind.
            assert said is None, said
        else:  # the message won: the thread lives on with it
            assert not isinstance(said, BaseException) and said is not None, said
            assert (await rows_of(h.store, [thread]))["threads"] == 1
            return
        assert await rows_of(h.store, [thread]) == dict.fromkeys(
            ("threads", "messages", "runs", "cards"), 0
        )
        with pytest.raises(NotFound):  # what the HTTP API answers as 404
            await h.store.get_thread(thread)
        assert await h.say(thread, "again", "alice") is None
        assert (await rows_of(h.store, [thread]))["messages"] == 0


def _prune_cli(
    database_url: str, tenant: str, folder: Path, *faults: str
) -> subprocess.CompletedProcess[str]:
    env = pgbouncer.child_env()
    env.update(
        SIGNOFF_DATABASE_URL=database_url,
        SIGNOFF_RETENTION_TENANTS=f"{tenant}=1",
        SIGNOFF_FAULTS=",".join(faults),
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "signoff",
            "prune",
            "--tenant",
            tenant,
            "--batch",
            "2",
            "--archive-dir",
            str(folder),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


async def test_a_prune_killed_between_batches_is_finished_by_the_next(
    database_url: str, tmp_path: Path
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        threads = [(await executed_thread(h, f"k{i}"))[0] for i in range(5)]
        await age(h, threads)
        killed = await asyncio.to_thread(
            _prune_cli, database_url, h.tenant, tmp_path, "prune.after_batch"
        )
        assert killed.returncode == -9, killed
        left = await rows_of(h.store, threads)
        assert left["threads"] == 3  # the first batch (2) committed whole, nothing else
        assert len(audit_lines(tmp_path)) == 2
        again = await asyncio.to_thread(_prune_cli, database_url, h.tenant, tmp_path)
        assert again.returncode == 0, again
        assert json.loads(again.stdout)["rules"][h.tenant]["threads"] == 3
        assert await rows_of(h.store, threads) == dict.fromkeys(left, 0)
        assert len({line["id"] for line in audit_lines(tmp_path)}) == 5
        # no orphans of the deleted threads anywhere
        for table in ("card_events", "operations"):
            n = await h.store.pool.fetchval(
                f"SELECT count(*) FROM {table} t LEFT JOIN cards c ON c.id = t.card_id "
                "WHERE c.id IS NULL"
            )
            assert n == 0


async def test_an_archive_that_cannot_be_written_deletes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        thread, _ = await executed_thread(h)
        await age(h, [thread])
        blocked = tmp_path / "file"
        blocked.write_text("not a folder")
        with pytest.raises(retention.ArchiveFailed, match="nothing was deleted"):
            await prune(h, blocked)
        assert (await rows_of(h.store, [thread]))["threads"] == 1


async def test_one_scheduled_prune_at_a_time(database_url: str) -> None:
    store = await PostgresStore.connect(database_url)
    try:
        async with store.retention.exclusive() as first:
            async with store.retention.exclusive() as second:
                assert first and not second
        async with store.retention.exclusive() as again:
            assert again  # given back when the first one ended
        # A pruner killed while holding it: its lease lapses, then another takes it.
        await store.pool.execute(
            "INSERT INTO retention_lease VALUES ('prune', 'killed', now() + interval '0.3 s')"
            " ON CONFLICT (name) DO UPDATE SET holder = 'killed', until = EXCLUDED.until"
        )
        async with store.retention.exclusive() as during:
            assert not during
        await asyncio.sleep(0.4)
        async with store.retention.exclusive() as after:
            assert after
    finally:
        await store.close()


RETENTION_COUNTERS = (
    "signoff_retention_runs_total",
    "signoff_retention_threads_pruned_total",
    "signoff_retention_failures_total",
)


async def test_the_workers_prune_on_a_schedule(database_url: str, tmp_path: Path) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        thread, card = await executed_thread(h)
        await age(h, [thread])
        settings = h.settings.with_(
            retention_tenants=(f"{h.tenant}=1",),
            retention_interval_seconds=0.05,
            retention_archive_dir=str(tmp_path),
        )
        before = {k: COUNTERS.values.get(k, 0) for k in RETENTION_COUNTERS}
        loop = asyncio.create_task(retention.prune_loop(h.store.retention, settings))
        try:
            for _ in range(200):
                if (await rows_of(h.store, [thread]))["threads"] == 0:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # a tick past the one that pruned it
        finally:
            loop.cancel()
        assert (await rows_of(h.store, [thread]))["threads"] == 0
        assert [line["id"] for line in audit_lines(tmp_path)] == [card]
        # What an operator graphs (an operator probe: a prune that never ran, or failed
        # every hour, was only in the log).
        grew = {k: COUNTERS.values.get(k, 0) - before[k] for k in RETENTION_COUNTERS}
        assert grew["signoff_retention_runs_total"] >= 2, grew
        assert grew["signoff_retention_threads_pruned_total"] >= 1, grew
        assert grew["signoff_retention_failures_total"] == 0, grew


def test_a_bad_rule_is_a_clear_error() -> None:
    for bad in (["acme"], ["acme=x"], ["=3"], ["acme=-1"]):
        with pytest.raises(SignoffError, match="tenant=days"):
            retention.Policy.parse(0, bad)
    policy = retention.Policy.parse(7, ["acme=30", "demo=0"])
    assert policy.rules() == [("acme", 30 * 86400.0), (None, 7 * 86400.0)]
    assert policy.rules("demo") == [] and policy.rules("other") == [("other", 7 * 86400.0)]
    assert (
        msgspec.to_builtins(PruneCounts(threads=1) + PruneCounts(threads=2, runs=1))["threads"] == 3
    )


async def test_a_prune_stalled_behind_a_lock_times_out_and_deletes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    """Postgres slow: a row of the thread is held by another transaction; the prune's
    statement runs past its timeout, the batch is rolled back whole (a retriable
    Unavailable), and the next prune does the job."""
    async with harness(database_url, model=Scripted(pix())) as h:
        thread, card_id = await executed_thread(h)
        await age(h, [thread])
        slow = await PostgresStore.connect(database_url, timeout=0.5)
        try:
            async with h.store.db.tx() as conn:
                await conn.execute("SELECT 1 FROM cards WHERE id = $1::uuid FOR UPDATE", card_id)
                with pytest.raises(Unavailable):
                    await retention.prune(
                        slow.retention,
                        policy_for(h.tenant),
                        archive=retention.JsonlArchive(tmp_path),
                        only=h.tenant,
                    )
                assert (await rows_of(h.store, [thread]))["cards"] == 1
        finally:
            await slow.close()
        assert (await prune(h, tmp_path)).threads == 1
        assert (await rows_of(h.store, [thread]))["threads"] == 0
        # The rolled-back batch had exported its audit already: at least once, by card id.
        assert {line["id"] for line in audit_lines(tmp_path)} == {card_id}
