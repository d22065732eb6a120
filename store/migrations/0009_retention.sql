-- 0009: retention (`signoff prune`, runtime/retention.py, design note 28). Pruning deletes
-- whole threads; their rows go by ON DELETE CASCADE, which needs an index on every
-- referencing column (without one, each deleted thread or card is a scan of the child
-- table). Threads are picked oldest first.
CREATE INDEX threads_created ON threads (created_at);
CREATE INDEX runs_thread ON runs (thread_id);
CREATE INDEX cards_thread ON cards (thread_id);
CREATE INDEX cards_superseded_by ON cards (superseded_by) WHERE superseded_by IS NOT NULL;
-- The hot tables are vacuumed and analysed after 5 % / 2 % of their rows changed (the
-- defaults, 20 % / 10 %, let a large table carry many dead rows between runs).
ALTER TABLE messages SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE runs SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE cards SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE card_events SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE threads SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);
-- One scheduled prune at a time across the workers: a leased row (retention_lease_take).
CREATE TABLE retention_lease (
    name    text PRIMARY KEY,
    holder  text NOT NULL,
    until   timestamptz NOT NULL
);
