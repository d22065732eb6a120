"""A big, finished database and the statements timers run on it.

Shared by ``tests/integration/test_query_plans.py`` (each periodic statement reads
indexes, not tables) and ``bench/timers.py`` (what each costs at 20k and 200k threads).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg

from signoff.store.queries import SQL

# Pages a periodic statement may touch in the idle state: an index descent or two per
# table it reads, the rows it finds (a few), and its own writes. A full scan of one of
# the big tables here is hundreds to thousands of pages.
PAGE_BUDGET = 120
# The tables that grow with use (wa_due is not one: a work list of the threads with
# something to send, read whole).
BIG = {
    "threads", "runs", "cards", "messages", "card_events", "operations", "deliveries",
    "wa_contacts", "wa_outbound", "card_refusals", "workflow_runs", "interrupts",
    "workflow_events",
}  # fmt: skip


# The statements a timer runs, with the arguments the running processes pass.
PERIODIC: dict[str, tuple[Any, ...]] = {
    # worker sweep, every sweep_seconds (runtime/sweeper.py)
    "cards_overdue": (100,),
    "cards_stuck_executing": (300.0,),
    "cards_approved_stale": (30.0, 100),
    "workers_forget": (60.0,),
    # worker slow poll, every poll_seconds (runtime/worker.py; the full re-read of the
    # parked cards, every 12th tick, is a chunk of ids by their primary key)
    "cards_approved_held": ("w1", 1000, ["create_pix_charge"]),
    # worker lease tick
    "worker_renew": ("w1", 10.0),
    "run_adopt": ("w2", 10.0, 100, False),
    # presence (runtime/presence.py)
    "app_processes_live": ("p1", 30.0),
    # workflows (runtime/workflows)
    "wf_runs_due": ("w1", 100),
    "wf_runs_adopt": ("w2", 10.0, 100, False, "a", ["wf"]),
    "wf_interrupts_overdue": (100, "a", ["wf"]),
    # WhatsApp courier, every whatsapp_poll_seconds on every gateway
    "wa_outbound_reclaim": (100, "g1", 60.0, 86400.0),
    "wa_outbound_claim": (100, "g1", 86400.0),
    # retention, hourly, one batch after another (here every row is old enough to go: a
    # batch of 5 keeps the work a right plan does under the budget)
    "retention_lease_take": ("w1", 600.0),
    "retention_pick": (None, 86400.0, 5, ["other"]),
    "retention_outbound_delete": (None, 86400.0, 5, ["other"]),
    "retention_deliveries_delete": (86400.0, 5),
}


# Statements whose transaction turns JIT off first (store/retention.py), as explain() does.
JIT_OFF = {"retention_pick"}
# JIT compiles a statement whose plan costs more than jit_above_cost (100,000 by default)
# on every execution: milliseconds of LLVM for a statement of a fraction of one. Costs
# grow with the tables; at a tenth of the rows, a tenth of the threshold.
JIT_ABOVE_COST_AT_20K = 10_000


def literal(value: Any) -> str:
    """A SQL literal of unknown type (the prepared statement's parameter types apply)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "'true'" if value else "'false'"
    if isinstance(value, list):
        value = "{" + ",".join(f'"{v}"' for v in value) + "}"
    return "'" + str(value).replace("'", "''") + "'"


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def populate_sql(n: int) -> str:
    """Statements that fill a migrated database with n finished threads and all that hangs
    off them (a few of each still open: pending, approved, executing, waiting)."""
    return f"""
INSERT INTO threads (id, tenant, owner, last_seq, created_at)
  SELECT md5('t'||i)::uuid, 't'||(i%5), 'u'||(i%5000), 5, now() - interval '2 days'
  FROM generate_series(1,{n}) i;
INSERT INTO runs (id, thread_id, tenant, owner, status, worker_id)
  SELECT md5('r'||i)::uuid, md5('t'||i)::uuid, 't'||(i%5), 'u'||(i%5000),
     CASE WHEN i%1000=0 THEN 'waiting' ELSE 'done' END, CASE WHEN i%1000=0 THEN 'w1' END
  FROM generate_series(1,{n}) i;
INSERT INTO cards (id, thread_id, run_id, tenant, owner, tool, risk, args_snapshot, summary,
    impact, snapshot_hash, request_key, operation_id, status, expires_at, decided_at,
    executing_since)
  SELECT md5('c'||i)::uuid, md5('t'||i)::uuid, md5('r'||i)::uuid, 't'||(i%5),
     'u'||(i%5000), 'create_pix_charge', 'critical', '{{"a":1}}', 's', '{{}}', 'h', 'k'||i,
     md5('o'||i)::uuid,
     CASE WHEN i%1000=0 THEN 'pending' WHEN i%1000=1 THEN 'approved'
          WHEN i%1000=2 THEN 'executing' ELSE 'executed' END,
     now() + interval '1 hour', now(), now()
  FROM generate_series(1,{n}) i;
INSERT INTO messages (thread_id, seq, kind, body, created_at)
  SELECT md5('t'||i)::uuid, s, 'assistant', '{{}}', now() - interval '2 days'
  FROM generate_series(1,{n}) i, generate_series(1,5) s;
INSERT INTO card_events (card_id, to_status, actor)
  SELECT md5('c'||i)::uuid, 'executed', 'x' FROM generate_series(1,{n}) i;
INSERT INTO operations (operation_id, card_id, tool, status)
  SELECT md5('o'||i)::uuid, md5('c'||i)::uuid, 'create_pix_charge', 'succeeded'
  FROM generate_series(1,{n}) i;
INSERT INTO deliveries (channel, message_id, received_at)
  SELECT 'whatsapp', 'm'||i, now() - interval '2 days' FROM generate_series(1,{n}) i;
INSERT INTO wa_contacts (tenant, wa_id, thread_id, last_inbound_at, sent_seq)
  SELECT 't'||(i%5), 'wa'||i, md5('t'||i)::uuid, now(), 5 FROM generate_series(1,{n}) i;
INSERT INTO wa_outbound (key, tenant, wa_id, thread_id, seq, kind, status, claimed_by)
  SELECT 'log:'||i, 't'||(i%5), 'wa'||i, md5('t'||i)::uuid, 5, 'assistant',
     CASE WHEN i%1000=1 THEN 'failed' ELSE 'sent' END, 'g'
  FROM generate_series(1,{n}) i;
INSERT INTO workflow_runs (id, tenant, owner, app, workflow, status, worker_id)
  SELECT md5('w'||i)::uuid, 't'||(i%5), 'u'||(i%5000), 'a', 'wf',
     CASE WHEN i%1000=0 THEN 'running' WHEN i%1000=1 THEN 'awaiting_human'
          ELSE 'completed' END,
     CASE WHEN i%1000=0 THEN 'w1' END
  FROM generate_series(1,{n}) i;
INSERT INTO interrupts (id, run_id, step, step_name, kind, schema, status, deadline)
  SELECT md5('i'||i)::uuid, md5('w'||i)::uuid, 1, 's', 'human', '{{}}',
     CASE WHEN i%1000=1 THEN 'open' ELSE 'resolved' END, now() + interval '1 day'
  FROM generate_series(1,{n}) i;
INSERT INTO workflow_events (id, run_id, name, payload, delivered_by, consumed_at)
  SELECT md5('e'||i)::uuid, md5('w'||i)::uuid, 'ev', '{{}}', 'x', now()
  FROM generate_series(1,{n}) i;
UPDATE threads SET wa = true;
INSERT INTO wa_due (thread_id, seq)
  SELECT md5('t'||i)::uuid, 5 FROM generate_series(1,{n}) i WHERE i%10000=5;
INSERT INTO workers (id, lease_until) VALUES ('w1', now() + interval '1 hour');
"""


async def connect(url: str) -> asyncpg.Connection:
    """A connection that plans as a long-lived process does after a statement's fifth
    call: generic plans, whatever the arguments."""
    conn: asyncpg.Connection = await asyncpg.connect(url, statement_cache_size=0)
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    return conn


def pages(plan: dict[str, Any]) -> int:
    """Shared buffers a plan touched (a node's count includes its children's)."""
    return int(
        max(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in nodes(plan))
    )


def scans(plan: dict[str, Any]) -> list[str]:
    """The big tables a plan reads whole."""
    return sorted(
        n["Relation Name"]
        for n in nodes(plan)
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in BIG
    )


async def explain(conn: asyncpg.Connection, name: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """The generic plan of statement ``name`` run once with ``args``, rolled back."""
    sql = getattr(SQL, name).strip().rstrip(";")
    tx = conn.transaction()
    await tx.start()
    try:
        if name in JIT_OFF:
            await conn.execute(SQL.retention_jit_off)
        await conn.execute(f"PREPARE probe AS {sql}")
        call = f"EXECUTE probe({', '.join(literal(a) for a in args)})" if args else "EXECUTE probe"
        out = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {call}")
        top: dict[str, Any] = json.loads(out)[0]
        return top
    finally:
        await tx.rollback()
        await conn.execute("DEALLOCATE ALL")
