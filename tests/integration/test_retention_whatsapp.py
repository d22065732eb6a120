"""Retention of the WhatsApp channel's bookkeeping (runtime/retention.py, design note 28):
finished ``wa_outbound`` rows of a rule's tenants older than the rule go, rows still
claimed never do; ``deliveries`` (no tenant) go once older than the policy's longest
rule and never before Meta's 7 days of redelivery. Real Postgres."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from signoff.runtime import retention
from signoff.runtime.config import Settings
from signoff.runtime.records import PruneReport
from signoff.store.postgres import PostgresStore
from signoff.store.whatsapp import CHANNEL
from tests import pgbouncer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def a_tenant() -> str:
    return "t-" + secrets.token_hex(4)


async def outbound(
    store: PostgresStore, tenant: str, status: str, days_old: float = 0, wa_id: str = "5511900"
) -> str:
    """An outbound row as the channel leaves it (claimed; finished with ``status`` unless
    that is ``claimed``), made ``days_old`` days ago; its key."""
    key = f"reply:wamid.{secrets.token_hex(8)}"
    assert await store.whatsapp.claim_reply(key, tenant, wa_id, "notice", "gateway-test", 30.0)
    if status != "claimed":
        sent = "wamid.out" if status == "sent" else None
        error = "HTTP 400" if status == "failed" else None
        await store.whatsapp.finish_outgoing(key, status, 1, error, sent)
    await store.pool.execute(
        "UPDATE wa_outbound SET created_at = now() - make_interval(secs => $2), "
        "claimed_at = now() - make_interval(secs => $2) WHERE key = $1",
        key,
        days_old * retention.DAY,
    )
    return key


async def delivery(store: PostgresStore, days_old: float) -> str:
    message_id = f"wamid.in.{secrets.token_hex(8)}"
    claim = await store.whatsapp.claim_delivery(CHANNEL, message_id, 30)
    assert claim.state == "claimed"
    await store.whatsapp.delivery_handled(CHANNEL, message_id, claim)
    await store.pool.execute(
        "UPDATE deliveries SET received_at = now() - make_interval(secs => $2) "
        "WHERE channel = $3 AND message_id = $1",
        message_id,
        days_old * retention.DAY,
        CHANNEL,
    )
    return message_id


async def outbound_left(store: PostgresStore, keys: list[str]) -> set[str]:
    rows = await store.db.fetch("SELECT key FROM wa_outbound WHERE key = ANY($1)", keys)
    return {r["key"] for r in rows}


async def deliveries_left(store: PostgresStore, ids: list[str]) -> set[str]:
    rows = await store.db.fetch("SELECT message_id FROM deliveries WHERE message_id = ANY($1)", ids)
    return {r["message_id"] for r in rows}


async def run(
    store: PostgresStore,
    policy: retention.Policy,
    folder: Path,
    *,
    batch: int = 200,
    dry_run: bool = False,
    only: str | None = None,
) -> PruneReport:
    return await retention.prune(
        store.retention,
        policy,
        archive=retention.JsonlArchive(folder),
        batch=batch,
        dry_run=dry_run,
        only=only,
    )


async def test_old_finished_outbound_rows_go_and_claimed_fresh_or_other_tenants_stay(
    store: PostgresStore, tmp_path: Path
) -> None:
    mine, other = a_tenant(), a_tenant()
    old = [await outbound(store, mine, s, days_old=3) for s in ("sent", "failed", "skipped")]
    kept = [
        await outbound(store, mine, "claimed", days_old=3),  # a send in flight / to take over
        await outbound(store, mine, "sent", days_old=0.5),  # younger than the rule
        await outbound(store, other, "sent", days_old=3),  # another tenant, no rule
    ]
    policy = retention.Policy.parse(0, [f"{mine}=1"])

    dry = await run(store, policy, tmp_path, dry_run=True, only=mine)
    assert dry.rules[mine].wa_outbound == 3 and dry.rules[mine].threads == 0
    assert await outbound_left(store, old + kept) == set(old + kept)  # dry: nothing changed

    done = await run(store, policy, tmp_path, batch=2, only=mine)  # two batches, then short
    assert done.rules[mine].wa_outbound == 3
    assert await outbound_left(store, old + kept) == set(kept)
    again = await run(store, policy, tmp_path, only=mine)
    assert again.rules[mine].wa_outbound == 0

    # The default rule covers every tenant without a rule of its own, never one with a
    # rule that keeps (0).
    other_old = kept[2]
    keeper = a_tenant()
    kept_by_zero = await outbound(store, keeper, "failed", days_old=3)
    policy = retention.Policy.parse(2, [f"{mine}=1", f"{keeper}=0"])
    assert (await run(store, policy, tmp_path, dry_run=True)).rules["*"].wa_outbound >= 1
    await run(store, policy, tmp_path)
    assert await outbound_left(store, [other_old, kept_by_zero]) == {kept_by_zero}
    assert await outbound_left(store, kept[:2]) == set(kept[:2])


async def test_deliveries_are_kept_for_metas_redelivery_window_whatever_the_rule(
    store: PostgresStore, tmp_path: Path
) -> None:
    tenant = a_tenant()
    fresh = await delivery(store, 0)
    recent = await delivery(store, 3)  # older than the 1-day rule, inside Meta's 7 days
    old = [await delivery(store, 8) for _ in range(3)]
    short = retention.Policy.parse(0, [f"{tenant}=1"])
    assert retention.deliveries_window(short) == retention.DELIVERY_DEDUP_SECONDS
    assert retention.deliveries_window(retention.Policy.parse(0, [])) == 0

    # A prune of one tenant leaves them: they carry no tenant.
    only = await run(store, short, tmp_path, only=tenant)
    assert only.deliveries == 0 and only.deliveries_days == 0
    assert await deliveries_left(store, old) == set(old)

    dry = await run(store, short, tmp_path, dry_run=True)
    assert (dry.deliveries, dry.deliveries_days) == (3, 7)
    done = await run(store, short, tmp_path, batch=2)
    assert (done.deliveries, done.deliveries_days) == (3, 7)
    assert await deliveries_left(store, [fresh, recent, *old]) == {fresh, recent}
    # A pruned id is a new delivery again (Meta stopped redelivering it days ago).
    assert (await store.whatsapp.claim_delivery(CHANNEL, old[0], 30)).state == "claimed"

    # The policy's longest rule wins when it is longer than 7 days.
    nine = await delivery(store, 9)
    longer = retention.Policy.parse(10, [f"{tenant}=1"])
    assert (await run(store, longer, tmp_path)).deliveries_days == 10
    assert await deliveries_left(store, [nine]) == {nine}
    await store.pool.execute(
        "DELETE FROM deliveries WHERE channel = $1 AND message_id = $2", CHANNEL, nine
    )


async def test_two_prunes_racing_delete_each_row_once(store: PostgresStore, tmp_path: Path) -> None:
    tenant = a_tenant()
    rows = [await outbound(store, tenant, "sent", days_old=3) for _ in range(12)]
    before = await store.retention.count_deliveries(retention.DELIVERY_DEDUP_SECONDS)
    ids = [await delivery(store, 8) for _ in range(12)]
    policy = retention.Policy.parse(0, [f"{tenant}=1"])
    one, two = await asyncio.gather(
        run(store, policy, tmp_path / "a", batch=1), run(store, policy, tmp_path / "b", batch=1)
    )
    assert one.rules[tenant].wa_outbound + two.rules[tenant].wa_outbound == 12
    assert one.deliveries + two.deliveries == before + 12  # (the session's database is shared)
    assert await outbound_left(store, rows) == set()
    assert await deliveries_left(store, ids) == set()


async def test_the_scheduled_prune_deletes_them_under_its_lease(
    store: PostgresStore, tmp_path: Path
) -> None:
    tenant = a_tenant()
    row = await outbound(store, tenant, "failed", days_old=3)
    old = await delivery(store, 8)
    settings = Settings(
        retention_tenants=(f"{tenant}=1",),
        retention_interval_seconds=0.05,
        retention_archive_dir=str(tmp_path),
    )
    # The session's database is shared: a lease an earlier test's pruner left (it lapses
    # only after 300 s) is cleared first, so that "another process holds it" is ours.
    await store.db.execute("DELETE FROM retention_lease WHERE name = 'prune'")
    # Another process holds the lease: the loop waits its turn and deletes nothing.
    async with store.retention.exclusive() as held:
        assert held
        loop = asyncio.create_task(retention.prune_loop(store.retention, settings))
        try:
            await asyncio.sleep(0.4)
            assert await outbound_left(store, [row]) == {row}
            assert await deliveries_left(store, [old]) == {old}
        except BaseException:
            loop.cancel()
            raise
    try:
        for _ in range(100):
            if not await outbound_left(store, [row]) and not await deliveries_left(store, [old]):
                break
            await asyncio.sleep(0.05)
    finally:
        loop.cancel()
    assert await outbound_left(store, [row]) == set()
    assert await deliveries_left(store, [old]) == set()


def _prune_cli(database_url: str, tenant: str, folder: Path, *extra: str) -> str:
    env = pgbouncer.child_env()
    env.update(SIGNOFF_DATABASE_URL=database_url, SIGNOFF_RETENTION_TENANTS=f"{tenant}=1")
    done = subprocess.run(
        [sys.executable, "-m", "signoff", "prune", "--archive-dir", str(folder), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done
    return done.stdout


async def test_the_cli_reports_what_went(
    database_url: str, store: PostgresStore, tmp_path: Path
) -> None:
    tenant = a_tenant()
    await outbound(store, tenant, "sent", days_old=3)
    await outbound(store, tenant, "claimed", days_old=3)
    await delivery(store, 8)
    # Delivery ids have no tenant: count those other tests of the session left too.
    old = await store.db.fetchval(
        "SELECT count(*) FROM deliveries WHERE received_at < now() - interval '7 days'"
    )
    assert old >= 1
    dry = await asyncio.to_thread(_prune_cli, database_url, tenant, tmp_path, "--dry-run")
    assert f"tenant {tenant}: would delete 0 threads" in dry
    assert "1 finished WhatsApp outbound rows" in dry
    assert f"channel deliveries: would delete {old} delivery ids older than 7 days" in dry
    printed = json.loads(
        await asyncio.to_thread(_prune_cli, database_url, tenant, tmp_path, "--json")
    )
    assert printed["rules"][tenant]["wa_outbound"] == 1
    assert (printed["deliveries"], printed["deliveries_days"], printed["dry_run"]) == (
        old,
        7,
        False,
    )
    # With --tenant the ids (no tenant) are left alone, and not reported.
    await delivery(store, 8)
    scoped = await asyncio.to_thread(_prune_cli, database_url, tenant, tmp_path, "--tenant", tenant)
    assert "0 finished WhatsApp outbound rows" in scoped and "channel deliveries" not in scoped


async def test_a_reply_claim_left_by_a_dead_gateway_is_closed_then_pruned(
    store: PostgresStore, tmp_path: Path
) -> None:
    """A direct reply claimed by a gateway that died before sending it cannot be sent by
    another (its text was never stored): past the claim lease the next courier tick
    closes it as failed, and retention then prunes it like any finished row; a fresh
    claim is left alone."""
    tenant = a_tenant()
    dead = await outbound(store, tenant, "claimed", days_old=2)
    fresh = await outbound(store, tenant, "claimed")
    # Two gateways' couriers at once: the claim is closed once, neither takes it over.
    taken = await asyncio.gather(
        store.whatsapp.reclaim_outgoing("gateway-a", 60, 86400),
        store.whatsapp.reclaim_outgoing("gateway-b", 60, 86400),
    )
    assert all(dead not in {item.key for item in found} for found in taken)
    status = "SELECT status, error FROM wa_outbound WHERE key = $1"
    row = await store.db.fetchrow(status, dead)
    assert row is not None and row["status"] == "failed" and "stopped" in row["error"]
    row = await store.db.fetchrow(status, fresh)
    assert row is not None and row["status"] == "claimed"
    await run(store, retention.Policy.from_settings(Settings(retention_days=1)), tmp_path)
    assert await outbound_left(store, [dead, fresh]) == {fresh}
