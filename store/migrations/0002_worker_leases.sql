-- 0002: one lease per worker instead of one per run.
-- A run is held by runs.worker_id while that worker's lease (workers.lease_until) is in
-- the future. Renewing is one row per worker per tick, however many runs it holds (the
-- per-run lease rewrote every held run's row: ~1.2 s of Postgres work per tick at 100k).

CREATE TABLE workers (
    id           text PRIMARY KEY,
    lease_until  timestamptz NOT NULL
);

-- Runs whose own lease had lapsed are released; the others keep their holder, whose
-- lease is the latest of its runs'.
UPDATE runs SET worker_id = NULL
WHERE status IN ('running', 'waiting') AND (lease_until IS NULL OR lease_until < now());
INSERT INTO workers (id, lease_until)
SELECT worker_id, max(lease_until) FROM runs
WHERE status IN ('running', 'waiting') AND worker_id IS NOT NULL
GROUP BY worker_id;

DROP INDEX runs_lease;
ALTER TABLE runs DROP COLUMN lease_until;
CREATE INDEX runs_holder ON runs (worker_id) WHERE status IN ('running', 'waiting');
