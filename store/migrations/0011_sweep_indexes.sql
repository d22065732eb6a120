-- 0011: the sweeps every worker runs every `sweep_seconds` read indexes, not tables.
-- `cards_stuck_executing` (flag cards in `executing` past `stuck_after_seconds`) had no
-- index to use and read the whole `cards` table on every sweep of every worker: 70 ms of
-- Postgres at 200k cards, every 2 s per worker, growing with the audit trail. Cards are
-- in `executing` for the length of one provider call, so this index stays a few entries.
CREATE INDEX cards_executing ON cards (executing_since)
    WHERE status = 'executing' AND NOT needs_reconciliation;
