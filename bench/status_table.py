#!/usr/bin/env python3
"""Would a card's status in a narrow table of its own pay? (the lever named in rounds
of issue 14; not in ``run_all.py``).

A card transition is not a HOT update: ``status`` is in the predicates of the partial
indexes (pending expiry, pending per thread, approved, executing) and the moved
timestamps are indexed, so each move copies the whole card row (snapshot, summary,
impact) and inserts into every index. The lever would move ``status`` and the
timestamps the sweeps read into ``card_state (card_id, thread_id, status, expires_at,
decided_at, executing_since)`` with the same partial indexes, leaving the wide row
untouched after its insert.

This script measures the part of a transition the lever would change, in one run,
paired and alternated (A B, B A, ...): ``--cards`` cards of realistic width (the
demo's Pix charge) in a fresh signoff schema on a private Postgres, each moved
``approved -> executing`` and back by

* ``wide``: the conditional ``UPDATE cards SET status, executing_since ...`` signoff runs;
* ``narrow``: the same conditional ``UPDATE`` on ``card_state``;

autocommitted, one at a time (each a durable commit, as in a decision). For scale it
also times signoff's whole ``card_begin_execution`` statement (lock, move, audit row,
log entry, operation row). Writes ``bench/results/status_table.json``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg

from bench.common import RESULTS, base_parser, log, machine, services, summarize_ms, write_json
from signoff.store.queries import SQL

NARROW = """
CREATE TABLE card_state (
    card_id uuid PRIMARY KEY REFERENCES cards (id) ON DELETE CASCADE,
    thread_id uuid NOT NULL,
    status text NOT NULL,
    expires_at timestamptz NOT NULL,
    decided_at timestamptz,
    executing_since timestamptz
);
CREATE INDEX card_state_pending_expiry ON card_state (expires_at) WHERE status = 'pending';
CREATE INDEX card_state_thread_pending ON card_state (thread_id) WHERE status = 'pending';
CREATE INDEX card_state_approved ON card_state (decided_at) WHERE status = 'approved';
CREATE INDEX card_state_executing ON card_state (executing_since) WHERE status = 'executing';
"""

FILL = """
WITH t AS (
    INSERT INTO threads (id, tenant, owner, last_seq)
    SELECT gen_random_uuid(), 'bench', 'demo', 0 FROM generate_series(1, $1)
    RETURNING id
), r AS (
    INSERT INTO runs (id, thread_id, state, status, tenant, owner, role)
    SELECT gen_random_uuid(), t.id, '{}', 'waiting', 'bench', 'demo', 'user' FROM t
    RETURNING id, thread_id
), c AS (
    SELECT gen_random_uuid() AS id, r.id AS run_id, r.thread_id FROM r
)
INSERT INTO cards (id, thread_id, run_id, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id, status,
    expires_at, decided_at, decided_by, channel)
SELECT c.id, c.thread_id, c.run_id, 'bench', 'demo', 'create_pix_charge',
    'toolu_' || c.id::text, 'critical', $2::jsonb, $2::jsonb,
    'Cobrar R$ 150,00 de João da Silva via Pix, vencimento 10/12/2026', $3::jsonb,
    md5(c.id::text), 'rk:' || c.id::text, gen_random_uuid(), 'approved',
    now() + interval '1 day', now(), 'demo', 'ws'
FROM c
"""

SNAPSHOT = {
    "payer_name": "João da Silva",
    "payer_document": "123.456.789-09",
    "amount_cents": 15000,
    "currency": "BRL",
    "description": "Serviço de manutenção, visita técnica de 02/12/2026",
    "due_date": "2026-12-10",
}
IMPACT = {"amount": "R$ 150,00", "to": "João da Silva", "balance_after": "R$ 1.234,00"}

MOVE = {
    "wide": "UPDATE cards SET status = $2, executing_since = {since} WHERE id = $1 AND status = $3",
    "narrow": "UPDATE card_state SET status = $2, executing_since = {since} "
    "WHERE card_id = $1 AND status = $3",
}


async def measure(url: str, n_cards: int, rounds: int, per_round: int) -> dict[str, Any]:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(NARROW)
        await conn.execute(FILL, n_cards, json.dumps(SNAPSHOT), json.dumps(IMPACT))
        await conn.execute(
            "INSERT INTO card_state SELECT id, thread_id, status, expires_at, decided_at, "
            "executing_since FROM cards"
        )
        await conn.execute("VACUUM ANALYZE")
        ids = [r["id"] for r in await conn.fetch("SELECT id FROM cards")]
        random.Random(14).shuffle(ids)
        samples: dict[str, list[float]] = {"wide": [], "narrow": []}
        at = 0
        for rnd in range(rounds):
            order = ["wide", "narrow"] if rnd % 2 == 0 else ["narrow", "wide"]
            for side in order:
                forward = MOVE[side].format(since="now()")
                back = MOVE[side].format(since="NULL")
                for j in range(per_round):
                    card = ids[(at + j) % len(ids)]
                    t0 = time.perf_counter_ns()
                    status = await conn.execute(forward, card, "executing", "approved")
                    samples[side].append(time.perf_counter_ns() - t0)
                    assert status == "UPDATE 1", status
                    await conn.execute(back, card, "approved", "executing")
            at += per_round
        whole: list[float] = []
        for card in ids[:per_round]:
            t0 = time.perf_counter_ns()
            row = await conn.fetchrow(
                SQL.card_begin_execution,
                card,
                "approved",
                "executing",
                None,
                "bench",
                None,
                "{}",
                None,  # $8: the run's holder (design note 49); None: not checked
            )
            whole.append(time.perf_counter_ns() - t0)
            assert row is not None
    finally:
        await conn.close()
    out: dict[str, Any] = {side: summarize_ms(v) for side, v in samples.items()}
    out["card_begin_execution"] = summarize_ms(whole)
    out["saved_p50_ms"] = round(out["wide"]["p50"] - out["narrow"]["p50"], 3)
    return out


def main() -> None:
    p = base_parser(__doc__ or "")
    p.add_argument("--cards", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=8, help="alternations of the two sides")
    p.add_argument("--per-round", type=int, default=500)
    p.add_argument("--quick", action="store_true", help="2,000 cards, 4 rounds of 100")
    args = p.parse_args()
    if args.quick:
        args.cards, args.rounds, args.per_round = 2_000, 4, 100
    with services(args, "statustable") as svc:
        result = asyncio.run(measure(svc.database_url, args.cards, args.rounds, args.per_round))
    log(result)
    path = write_json(
        RESULTS,
        "status_table",
        {
            "machine": machine(),
            "cards": args.cards,
            "rounds": args.rounds,
            "per_round": args.per_round,
            **result,
        },
    )
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
