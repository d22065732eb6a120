-- Every SQL statement signoff runs, by name (loaded by store/queries.py).
--
-- A block is a "-- name: <name>" line, comments saying what the statement does and
-- what its parameters are, and the statement, ending with ";". Every block can be
-- pasted into psql as it is (as the body of PREPARE when it has parameters).
-- Blocks with a "generated" line are written by scripts/generate_queries.py (the card
-- transitions, one statement each: design note 11); edit those there.
--
-- Lock order (design note 16), the same on every write path: the thread, then the run,
-- then cards. Statements that write a card or a run lock their thread first, in a
-- MATERIALIZED CTE that the write joins, with FOR NO KEY UPDATE (which does not
-- conflict with the KEY SHARE locks that inserting a row referencing the thread takes).
--
-- Runs: the column runs.worker_id holds the id of the worker that holds the run; the
-- statements call it "holder".


-- == schema migrations (store/schema.py) =================================================

-- name: migrations_table
CREATE TABLE IF NOT EXISTS signoff_migrations (
    version     text PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_checksums
-- Each migration's SHA-256 as applied (NULL: applied by a version that kept none).
ALTER TABLE signoff_migrations ADD COLUMN IF NOT EXISTS checksum text;

-- name: migrations_lock
-- Serialises concurrent `signoff migrate`s (until commit).
SELECT pg_advisory_xact_lock(7401553901);

-- name: migrations_lock_timeout
-- Once this process migrates (the advisory lock above is held, so no other one waits on
-- it): a table lock a migration cannot get within $1 (an open transaction on the table)
-- fails it, rather than queueing every query of the live processes behind it.
SELECT set_config('lock_timeout', $1, true);

-- name: migrations_applied
SELECT version, checksum FROM signoff_migrations;

-- name: migration_record
INSERT INTO signoff_migrations (version, checksum) VALUES ($1, $2);

-- name: migration_checksum_set
-- The checksum of a migration applied by a version that kept none (it is taken as is).
UPDATE signoff_migrations SET checksum = $2 WHERE version = $1 AND checksum IS NULL;

-- name: ping
-- True when this session can write: not a standby, not read-only by default.
SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off';


-- == threads and the thread log (store/threads.py) =======================================

-- name: thread_insert
-- No row when a thread of that id exists (a keyed message's thread made by its first send).
INSERT INTO threads (id, tenant, owner) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING
RETURNING id::text, tenant, owner, last_seq, created_at;

-- name: thread_get
SELECT id::text, tenant, owner, last_seq, created_at FROM threads WHERE id = $1;

-- name: thread_age
-- Seconds since thread $1 was created (by the database's clock); no row: no such thread.
SELECT extract(epoch FROM now() - created_at)::float8 AS age FROM threads WHERE id = $1;

-- name: threads_of_owner
-- A person's threads, the most recently active first, at most $3:
-- the time of the last log entry, the cards still waiting for a decision and the first
-- message (the page's thread list, GET /v1/threads).
SELECT t.id::text, t.last_seq, t.created_at,
       COALESCE(last.created_at, t.created_at) AS updated_at,
       (SELECT count(*) FROM cards c
         WHERE c.thread_id = t.id AND c.status = 'pending' AND c.expires_at > now())::int
         AS pending,
       (SELECT m.body FROM messages m
         WHERE m.thread_id = t.id AND m.kind = 'user' ORDER BY m.seq LIMIT 1) AS first_message
FROM threads t
LEFT JOIN messages last ON last.thread_id = t.id AND last.seq = t.last_seq
WHERE t.tenant = $1 AND t.owner = $2
ORDER BY updated_at DESC, t.id
LIMIT $3;

-- name: thread_get_locked
-- Thread $1, locked first by a transaction that goes on to its runs and cards.
SELECT id::text, tenant, owner, last_seq, created_at FROM threads WHERE id = $1
FOR NO KEY UPDATE;

-- name: thread_delete_empty
-- A thread created for a message that was refused: gone only while nothing was written to
-- it (no log entry, no run). The row lock orders it against a worker's start_run.
DELETE FROM threads t WHERE t.id = $1 AND t.last_seq = 0
    AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.id);

-- name: thread_next_seq
UPDATE threads SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq;

-- name: message_insert
INSERT INTO messages (thread_id, seq, run_id, kind, body) VALUES ($1, $2, $3, $4, $5)
RETURNING created_at;

-- name: messages_after
SELECT seq, run_id::text, kind, body, created_at FROM messages
WHERE thread_id = $1 AND seq > $2 ORDER BY seq LIMIT $3;

-- name: conversation
SELECT seq, run_id::text, kind, body, created_at FROM messages
WHERE thread_id = $1 AND kind IN ('user', 'assistant', 'tool_results') ORDER BY seq;

-- name: quota_user_lock
-- Serialises one user's thread creations and workflow starts (until commit), so the count
-- in thread_insert_within_quota (wf_runs_recent) sees every earlier insert of theirs; other users never
-- wait. A transaction-level lock: released at commit or rollback, so it is safe with the
-- pool's no-op reset.
SELECT pg_advisory_xact_lock(hashtext('signoff:quota'), hashtext($1 || '/' || $2));

-- name: thread_insert_within_quota
-- A thread ($1) for tenant $2 / owner $3, unless that owner created $4 or more in the
-- last $5 seconds. Always one row: the thread's columns (NULL when refused, or when a
-- thread of that id exists), how many were in the window, and the seconds until the
-- oldest of them leaves it.
WITH recent AS (
    SELECT count(*) AS n, min(created_at) AS oldest FROM threads
    WHERE tenant = $2 AND owner = $3 AND created_at > now() - make_interval(secs => $5)
), made AS (
    INSERT INTO threads (id, tenant, owner) SELECT $1, $2, $3 FROM recent WHERE recent.n < $4
    ON CONFLICT (id) DO NOTHING
    RETURNING id::text, tenant, owner, last_seq, created_at
)
SELECT made.id, made.tenant, made.owner, made.last_seq, made.created_at, recent.n AS recent,
       extract(epoch FROM recent.oldest + make_interval(secs => $5) - now())::float8
           AS retry_after
FROM recent LEFT JOIN made ON true;


-- == runs (store/runs.py) ===============================================================

-- name: run_get
SELECT id::text, thread_id::text, tenant, owner, role, status, worker_id AS holder, state, error
FROM runs WHERE id = $1;

-- name: run_age
-- Seconds since run $1 was created (by the database's clock); no row: no such run.
SELECT extract(epoch FROM now() - created_at)::float8 AS age FROM runs WHERE id = $1;

-- name: runs_held_among
-- Which of runs $2 worker $1 still holds (active, and its own).
SELECT id::text FROM runs
WHERE id = ANY($2::uuid[]) AND worker_id = $1 AND status IN ('running', 'waiting');

-- name: run_active_for_thread
SELECT id::text, thread_id::text, tenant, owner, role, status, worker_id AS holder, state, error
FROM runs WHERE thread_id = $1 AND status IN ('running', 'waiting');

-- name: run_supersede_active
-- The active runs of thread $1 (locked first by the caller) become superseded.
UPDATE runs SET status = 'superseded', updated_at = now()
WHERE thread_id = $1 AND status IN ('running', 'waiting')
RETURNING id::text, thread_id::text, tenant, owner, role, status, worker_id AS holder, state,
    error;

-- name: run_insert
-- A new run ($1) of thread $2 for tenant $3 / owner $4 in role $5, held by worker $6: the
-- holder's lease row exists from here on (inserted with $7 seconds if this worker never
-- renewed, e.g. one driven without its lease loop).
WITH w AS (
    INSERT INTO workers (id, lease_until) VALUES ($6, now() + make_interval(secs => $7))
    ON CONFLICT (id) DO NOTHING
)
INSERT INTO runs (id, thread_id, tenant, owner, role, status, worker_id)
VALUES ($1, $2, $3, $4, $5, 'running', $6)
RETURNING id::text, thread_id::text, tenant, owner, role, status, worker_id AS holder, state,
    error;

-- name: run_start_quiet
-- A user message's run on a quiet thread, in one statement (start_run's transaction takes
-- nine round trips): thread $2 locked first (the one lock order); no run $1 yet (I5), no
-- active run and no pending card in the thread, and nothing committed to the thread while
-- this statement waited for its lock (its last_seq as locked, the newest, equals the one
-- this statement's snapshot reads: every write that adds a run or a card to a thread
-- appends to its log); then run $1 (owner $3, role $4, held by worker $5, whose lease row
-- is inserted with $6 seconds if missing) and the user message $7 appended. No row: the
-- thread is not quiet, not found, or run $1 exists; start_run's transaction decides.
WITH th AS MATERIALIZED (
    SELECT threads.id, threads.tenant, threads.last_seq FROM threads
    WHERE threads.id = $2 FOR NO KEY UPDATE
),
quiet AS MATERIALIZED (
    SELECT th.id, th.tenant FROM th
    WHERE th.last_seq = (SELECT s.last_seq FROM threads s WHERE s.id = $2)
      AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.id = $1)
      AND NOT EXISTS (
          SELECT 1 FROM runs WHERE runs.thread_id = $2 AND runs.status IN ('running', 'waiting')
      )
      AND NOT EXISTS (
          SELECT 1 FROM cards WHERE cards.thread_id = $2 AND cards.status = 'pending'
      )
),
w AS (
    INSERT INTO workers (id, lease_until)
    SELECT $5, now() + make_interval(secs => $6) FROM quiet
    ON CONFLICT (id) DO NOTHING
),
r AS (
    INSERT INTO runs (id, thread_id, tenant, owner, role, status, worker_id)
    SELECT $1, quiet.id, quiet.tenant, $3, $4, 'running', $5 FROM quiet
    ON CONFLICT DO NOTHING
    RETURNING runs.id, runs.thread_id, runs.tenant, runs.owner, runs.role, runs.status,
        runs.worker_id, runs.state, runs.error
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + 1 FROM r WHERE threads.id = r.thread_id
    RETURNING threads.last_seq
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT r.thread_id, t.last_seq, r.id, 'user', $7 FROM r, t
    RETURNING seq, created_at
)
SELECT r.id::text, r.thread_id::text, r.tenant, r.owner, r.role, r.status,
    r.worker_id AS holder, r.state, r.error, m.seq AS log_seq, m.created_at AS log_at
FROM r, m;

-- name: run_set_state
-- Run $1's status ($2), state ($3) and error ($4) while it is active and, with $5, held by
-- that worker (a fence: note 14). No row: nothing was written.
UPDATE runs SET status = $2, state = $3, error = $4, updated_at = now()
WHERE id = $1 AND status IN ('running', 'waiting') AND ($5::text IS NULL OR worker_id = $5)
RETURNING id::text, thread_id::text, tenant, owner, role, status, worker_id AS holder, state,
    error;

-- name: run_step
-- Append entries ($3 kinds, $4 a JSON array of bodies) to thread $2 for run $1 and set
-- the run's status ($5), state ($6) and error ($7), in one statement. No row: the run is
-- no longer active (or, with $8, no longer held by that worker), and nothing was written.
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = ($2) FOR NO KEY UPDATE
),
r AS (
    UPDATE runs SET status = $5, state = $6, error = $7, updated_at = now()
    FROM lk
    WHERE lk.locked = runs.thread_id AND id = $1 AND status IN ('running', 'waiting')
      AND ($8::text IS NULL OR worker_id = $8)
    RETURNING id::text, thread_id::text, tenant, owner, role, status, worker_id AS holder,
        state, error
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + cardinality($3::text[])
    FROM r WHERE threads.id = $2
    RETURNING threads.last_seq
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT $2, t.last_seq - cardinality($3::text[]) + x.ord, $1, ($3::text[])[x.ord], x.body
    FROM t, jsonb_array_elements($4::jsonb) WITH ORDINALITY AS x(body, ord)
    RETURNING seq, created_at
)
SELECT r.*, (SELECT array_agg(seq ORDER BY seq) FROM m) AS seqs,
       (SELECT array_agg(created_at ORDER BY seq) FROM m) AS ats
FROM r;

-- name: run_append
-- Append one entry (kind $2, body $4) to thread $1 for run $3 while the run is active and,
-- with $5, held by that worker (the thread, then the run row are locked for it).
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = ($1) FOR NO KEY UPDATE
),
r AS (
    SELECT runs.id FROM runs JOIN lk ON lk.locked = runs.thread_id
    WHERE runs.id = $3 AND status IN ('running', 'waiting')
      AND ($5::text IS NULL OR worker_id = $5)
    FOR NO KEY UPDATE OF runs
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + 1 FROM r WHERE threads.id = $1
    RETURNING threads.last_seq
)
INSERT INTO messages (thread_id, seq, run_id, kind, body)
SELECT $1, t.last_seq, $3, $2, $4 FROM t
RETURNING seq, created_at;

-- name: run_with_cards
-- generated by scripts/generate_queries.py: edit it there, then run the script
-- Run $1, its cards (as clients see them) and its thread's conversation, in one read:
-- what continuing a parked run starts from.
SELECT id::text, thread_id::text, tenant, owner, role, status, worker_id AS holder, state, error,
    (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'id', c.id,
            'thread_id', c.thread_id,
            'run_id', c.run_id,
            'tenant', c.tenant,
            'owner', c.owner,
            'tool', c.tool,
            'risk', c.risk,
            'args_snapshot', c.args_snapshot,
            'summary', c.summary,
            'impact', c.impact,
            'snapshot_hash', c.snapshot_hash,
            'request_key', c.request_key,
            'operation_id', c.operation_id,
            'status', c.status,
            'tool_use_id', c.tool_use_id,
            'input', c.input,
            'decided_by', c.decided_by,
            'channel', c.channel,
            'reason', c.reason,
            'superseded_by', c.superseded_by,
            'result', c.result,
            'needs_reconciliation', c.needs_reconciliation,
            'expires_at', CASE WHEN c.expires_at IS NULL THEN NULL
                WHEN date_part('microseconds', c.expires_at)::bigint % 1000000 = 0
                THEN to_char(c.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                ELSE to_char(c.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
            'created_at', CASE WHEN c.created_at IS NULL THEN NULL
                WHEN date_part('microseconds', c.created_at)::bigint % 1000000 = 0
                THEN to_char(c.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                ELSE to_char(c.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
            'decided_at', CASE WHEN c.decided_at IS NULL THEN NULL
                WHEN date_part('microseconds', c.decided_at)::bigint % 1000000 = 0
                THEN to_char(c.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                ELSE to_char(c.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
            'editable', to_jsonb(c.editable)
        ) ORDER BY c.created_at, c.id), '[]')
     FROM cards c WHERE c.run_id = runs.id) AS cards,
    (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'thread_id', m.thread_id, 'seq', m.seq, 'run_id', m.run_id, 'kind', m.kind,
                'body', m.body, 'created_at', m.created_at) ORDER BY m.seq), '[]')
     FROM messages m
     WHERE m.thread_id = runs.thread_id AND m.kind IN ('user', 'assistant', 'tool_results')
    ) AS conversation
FROM runs WHERE id = $1;

-- name: turns_in_flight
-- Model turns in flight for tenant $1 / owner $2: their runs `running` now, and which of
-- the accepted messages' run ids ($3) no worker has started yet. One statement, one
-- snapshot: a run starting meanwhile is counted once, as one or the other.
SELECT
    (SELECT count(*) FROM runs WHERE tenant = $1 AND owner = $2 AND status = 'running')
        AS running,
    count(a.id) FILTER (WHERE r.id IS NULL) AS queued,
    coalesce(array_agg(a.id::text) FILTER (WHERE r.id IS NOT NULL), '{}') AS started
FROM unnest($3::uuid[]) AS a(id) LEFT JOIN runs r ON r.id = a.id;


-- == workers and their leases (store/workers.py; design note 14) ========================

-- name: worker_renew
-- Worker $1's lease, $2 seconds from now: renewing is one row, however many runs it holds.
-- (Every renewal counts from when it took the row, `clock_timestamp()`, not from its
-- transaction's start: one that waited on a lock must not hand back a lapsed lease.)
INSERT INTO workers (id, lease_until) VALUES ($1, now() + make_interval(secs => $2))
ON CONFLICT (id) DO UPDATE SET lease_until = clock_timestamp() + make_interval(secs => $2);

-- name: worker_lease
-- Worker $1's lease: when it lapses and how far off that is (seconds, by the database's
-- clock); no row for a worker that stopped cleanly or never ran.
SELECT lease_until, extract(epoch FROM lease_until - now())::float8 AS left_seconds
FROM workers WHERE id = $1;

-- name: worker_fence
-- Before a provider call the worker's own clock could not vouch for (design notes 47, 49):
-- renew worker $2's lease ($3 seconds) and say whether card $1 may be sent: it is still
-- `executing` and not flagged for reconciliation (read locked, so a reconcile or a flag
-- committed while this waited is seen), and its run is active and still waits on it
-- with no result (nobody told its model anything about the card). The run is then held
-- by $2: kept, or taken back from an adopter (whose next write, conditional on holding
-- the run, fails; it leaves a card executing elsewhere alone for a lease and flags it,
-- under the thread's lock, before telling its model). `executing_since` restarts, so the
-- sweeper does not flag a card just sent. The thread is locked first (the card's lock
-- joins `lk`, so it is taken after it), then the card, then the run: under the thread's
-- lock nothing else locks both.
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = (SELECT cards.thread_id FROM cards WHERE cards.id = $1) FOR NO KEY UPDATE
),
me AS (
    INSERT INTO workers (id, lease_until) VALUES ($2, now() + make_interval(secs => $3))
    ON CONFLICT (id) DO UPDATE SET lease_until = clock_timestamp() + make_interval(secs => $3)
),
kc AS MATERIALIZED (
    SELECT k.run_id FROM cards k JOIN lk ON lk.locked = k.thread_id
    WHERE k.id = $1 AND k.status = 'executing' AND NOT k.needs_reconciliation
    FOR NO KEY UPDATE OF k
),
r AS (
    UPDATE runs SET worker_id = $2
    FROM kc
    WHERE runs.id = kc.run_id AND runs.status IN ('running', 'waiting')
      AND EXISTS (
          SELECT 1 FROM jsonb_each_text(runs.state -> 'waiting') AS w(use_id, card_id)
          WHERE w.card_id = $1::text
            AND NOT coalesce(runs.state -> 'results', '{}'::jsonb) ? w.use_id)
    RETURNING runs.id
),
k AS (
    UPDATE cards SET executing_since = now() FROM r WHERE cards.id = $1 AND cards.run_id = r.id
    RETURNING cards.id
)
SELECT EXISTS (SELECT 1 FROM k) AS ours;

-- name: run_release
-- A graceful stop: holder $1 hands its runs back at once and its lease row goes.
WITH r AS (
    UPDATE runs SET worker_id = NULL
    WHERE worker_id = $1 AND status IN ('running', 'waiting')
)
DELETE FROM workers WHERE id = $1;

-- name: run_release_idle
-- A stopping worker hands back at once its waiting runs but those it still has a step of
-- in flight ($2); those stay held (its lease renewed) until they are done.
UPDATE runs SET worker_id = NULL
WHERE worker_id = $1 AND status = 'waiting' AND NOT (id = ANY($2::uuid[]))
RETURNING id::text;

-- name: run_adopt
-- Worker $1 takes over (up to $3) active runs nobody holds: released ones, and those of
-- workers whose lease lapsed ($4: also its own, for a restarted worker with a stable id).
-- Its own lease is renewed ($2 seconds) in the same statement. Both arms are index scans
-- on runs_holder; a run another adopter took first fails the re-check under its lock (its
-- new holder is alive) and is skipped.
WITH me AS (
    INSERT INTO workers (id, lease_until) VALUES ($1, now() + make_interval(secs => $2))
    ON CONFLICT (id) DO UPDATE SET lease_until = clock_timestamp() + make_interval(secs => $2)
),
lapsed AS (
    SELECT id, worker_id FROM runs
    WHERE status IN ('running', 'waiting')
      AND (worker_id IS NULL
           OR worker_id = ANY (ARRAY(
               SELECT w.id FROM workers w WHERE w.lease_until < now() AND w.id <> $1
           ) || CASE WHEN $4 THEN ARRAY[$1::text] ELSE ARRAY[]::text[] END))
    ORDER BY updated_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE runs r SET worker_id = $1
FROM lapsed WHERE r.id = lapsed.id AND r.worker_id IS NOT DISTINCT FROM lapsed.worker_id
RETURNING r.id::text, r.thread_id::text, r.tenant, r.owner, r.role, r.status,
    r.worker_id AS holder, r.state, r.error;

-- name: workers_forget
-- Lease rows of workers lapsed for $1 seconds that hold nothing any more.
DELETE FROM workers w
WHERE w.lease_until < now() - make_interval(secs => $1)
  AND NOT EXISTS (
      SELECT 1 FROM runs r WHERE r.worker_id = w.id AND r.status IN ('running', 'waiting')
  );


-- == cards (store/cards.py) =============================================================

-- name: card_propose
-- generated by scripts/generate_queries.py: edit it there, then run the script
-- A proposal ($1 id, $2 thread, $3 run, $4 tenant, $5 owner, $6 tool, $7 tool_use_id,
-- $8 risk, $9 input, $10 args_snapshot, $11 summary, $12 impact, $13 snapshot_hash,
-- $14 request_key, $15 operation_id, $16 editable, $17 ttl seconds) with its audit
-- row and its 'card' log entry; no row when the request already has its card (I5),
-- or when run $3 is no longer active (superseded or ended while its step ran: a
-- card proposed then could never run; a hostile probe's racing messages left one).
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = ($2::uuid) FOR NO KEY UPDATE
),
r AS MATERIALIZED (
    SELECT runs.id, runs.thread_id FROM runs JOIN lk ON runs.thread_id = lk.locked
    WHERE runs.id = $3 AND runs.status IN ('running', 'waiting')
    FOR SHARE OF runs
),
c AS (
    INSERT INTO cards (id, thread_id, run_id, tenant, owner, tool, tool_use_id, risk, input,
                       args_snapshot, summary, impact, snapshot_hash, request_key, operation_id,
                       editable, status, expires_at)
    SELECT $1, lk.locked, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
           'pending', now() + make_interval(secs => $17)
    FROM lk JOIN r ON r.thread_id = lk.locked
    ON CONFLICT (request_key) DO NOTHING
    RETURNING cards.*, jsonb_build_object(
        'id', cards.id,
        'thread_id', cards.thread_id,
        'run_id', cards.run_id,
        'tenant', cards.tenant,
        'owner', cards.owner,
        'tool', cards.tool,
        'risk', cards.risk,
        'args_snapshot', cards.args_snapshot,
        'summary', cards.summary,
        'impact', cards.impact,
        'snapshot_hash', cards.snapshot_hash,
        'request_key', cards.request_key,
        'operation_id', cards.operation_id,
        'status', cards.status,
        'tool_use_id', cards.tool_use_id,
        'input', cards.input,
        'decided_by', cards.decided_by,
        'channel', cards.channel,
        'reason', cards.reason,
        'superseded_by', cards.superseded_by,
        'result', cards.result,
        'needs_reconciliation', cards.needs_reconciliation,
        'expires_at', CASE WHEN cards.expires_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.expires_at)::bigint % 1000000 = 0
            THEN to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'created_at', CASE WHEN cards.created_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.created_at)::bigint % 1000000 = 0
            THEN to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'decided_at', CASE WHEN cards.decided_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.decided_at)::bigint % 1000000 = 0
            THEN to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'editable', to_jsonb(cards.editable)
    ) AS body
),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, NULL, status, 'system', NULL, snapshot_hash, '{}'::jsonb FROM c
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + 1 FROM c WHERE threads.id = c.thread_id
    RETURNING threads.id, threads.last_seq
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT t.id, t.last_seq, c.run_id, 'card', c.body FROM c JOIN t ON t.id = c.thread_id
    RETURNING seq AS log_seq, created_at AS log_at
)
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at,
    c.body, m.log_seq, m.log_at,
    (SELECT worker_id FROM runs WHERE runs.id = c.run_id) AS holder
FROM c, m;

-- name: card_get
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at
FROM cards WHERE id = $1;

-- name: card_execution_attempt
-- Card $1 as it stands, and the attempt token of the begin that last moved it to
-- `executing` (NULL: none, or begun by a version that wrote none): a worker whose begin
-- got no answer tells its own commit from another process's (design note 50).
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at,
    (SELECT e.detail ->> 'attempt' FROM card_events e
     WHERE e.card_id = cards.id AND e.to_status = 'executing'
     ORDER BY e.id DESC LIMIT 1) AS attempt
FROM cards WHERE id = $1;

-- name: card_fence_begin
-- The begin carrying token $2 must change nothing if it runs later: card $1 was read
-- back still approved, under its thread's lock (design note 53). Added to the earlier
-- ones: a later lost begin's read-back must not lift an earlier one's fence.
UPDATE cards SET fenced_attempts = array_append(fenced_attempts, $2)
WHERE id = $1 AND status = 'approved';

-- name: card_by_request_key
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at
FROM cards WHERE request_key = $1;

-- name: card_input
-- The model's original (parsed) input, which an edit starts from.
SELECT input FROM cards WHERE id = $1;

-- name: cards_of_run
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at
FROM cards WHERE run_id = $1 ORDER BY created_at, id;

-- name: cards_of_tool_uses
-- What became of the calls $2 of thread $1 (tool_use ids), newest card last: read only
-- when a conversation has calls left without a result (runtime/conversation.py).
SELECT tool_use_id, status, result, reason FROM cards
WHERE thread_id = $1 AND tool_use_id = ANY($2::text[]) ORDER BY created_at, id;

-- name: cards_pending_of_thread
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at
FROM cards WHERE thread_id = $1 AND status = 'pending'
ORDER BY created_at, id;

-- name: cards_approved_of_runs
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at
FROM cards WHERE run_id = ANY($1::uuid[]) AND status = 'approved'
ORDER BY created_at, id;

-- name: cards_list
-- For operators (`signoff cards list`): newest first, by status $1 and owner $2 if given.
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at
FROM cards
WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR owner = $2)
ORDER BY created_at DESC LIMIT $3;

-- name: cards_decided_among
-- Which of cards $1 (a worker's parked cards, in chunks) left pending: the slow poll's
-- full re-read, every 12th tick (runtime/worker.py).
SELECT id::text, status FROM cards WHERE id = ANY($1::uuid[]) AND status <> 'pending';

-- name: cards_approved_held
-- Approved cards not started whose run worker $1 holds: the slow poll's read at every
-- other tick, constant however many runs are parked (partial index cards_approved:
-- approved cards are few and short-lived). Also those whose run still waits on a pending
-- card: an approved card runs without waiting for its siblings (design note 60). Only
-- those of tools $3 when not NULL: the worker's own (another version's card beside a
-- pending sibling waits parked for it: not woken at every tick).
SELECT c.id::text, c.run_id::text FROM cards c JOIN runs r ON r.id = c.run_id
WHERE c.status = 'approved' AND r.worker_id = $1
  AND ($3::text[] IS NULL OR c.tool = ANY($3::text[]))
ORDER BY c.decided_at LIMIT $2;

-- name: card_lock_thread
-- The thread of card $1, locked: what a multi-statement transaction on a card takes first.
SELECT threads.id AS locked FROM threads
WHERE threads.id = (SELECT cards.thread_id FROM cards WHERE cards.id = $1) FOR NO KEY UPDATE;

-- name: card_diagnose
-- Card $1 as it is now, and whether its deadline passed: why a deciding update changed
-- nothing.
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at,
    expires_at <= now() AS is_expired
FROM cards WHERE id = $1;

-- name: card_decide_logged
-- generated by scripts/generate_queries.py: edit it there, then run the script
-- The deciding update (I3, I7, I2: the owner, of tenant $7 when given; pending; the
-- hash shown, $6; the database's clock) with its audit row ($8: the event's detail)
-- and its log entry. $1 card, $2 approved|rejected, $3 principal, $4 channel,
-- $5 reason, $9 the tools this process serves, comma-separated (NULL: any; a gateway
-- does not approve a card of a tool it does not serve: UnknownTool, design note 21;
-- one text rather than a text[]: an array parameter cost ~0.4 ms a decision here).
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = (SELECT cards.thread_id FROM cards WHERE cards.id = $1) FOR NO KEY UPDATE
),
c AS (
    UPDATE cards
    SET status = $2, decided_at = now(), decided_by = $3, channel = $4, reason = $5
    FROM lk
    WHERE lk.locked = cards.thread_id AND id = $1 AND status = 'pending' AND owner = $3
      AND snapshot_hash = $6 AND expires_at > now() AND ($7::text IS NULL OR tenant = $7)
      AND ($9::text IS NULL OR tool = ANY (string_to_array($9::text, ',')))
    RETURNING cards.*, jsonb_build_object(
        'id', cards.id,
        'thread_id', cards.thread_id,
        'run_id', cards.run_id,
        'tenant', cards.tenant,
        'owner', cards.owner,
        'tool', cards.tool,
        'risk', cards.risk,
        'args_snapshot', cards.args_snapshot,
        'summary', cards.summary,
        'impact', cards.impact,
        'snapshot_hash', cards.snapshot_hash,
        'request_key', cards.request_key,
        'operation_id', cards.operation_id,
        'status', cards.status,
        'tool_use_id', cards.tool_use_id,
        'input', cards.input,
        'decided_by', cards.decided_by,
        'channel', cards.channel,
        'reason', cards.reason,
        'superseded_by', cards.superseded_by,
        'result', cards.result,
        'needs_reconciliation', cards.needs_reconciliation,
        'expires_at', CASE WHEN cards.expires_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.expires_at)::bigint % 1000000 = 0
            THEN to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'created_at', CASE WHEN cards.created_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.created_at)::bigint % 1000000 = 0
            THEN to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'decided_at', CASE WHEN cards.decided_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.decided_at)::bigint % 1000000 = 0
            THEN to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'editable', to_jsonb(cards.editable)
    ) AS body
),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, 'pending', status, $3, $4, $6, $8::jsonb FROM c
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + 1 FROM c WHERE threads.id = c.thread_id
    RETURNING threads.id, threads.last_seq
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT t.id, t.last_seq, c.run_id, 'card_update', c.body FROM c JOIN t ON t.id = c.thread_id
    RETURNING seq AS log_seq, created_at AS log_at
)
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at,
    c.body, m.log_seq, m.log_at,
    (SELECT worker_id FROM runs WHERE runs.id = c.run_id) AS holder
FROM c, m;

-- name: card_decide
-- The deciding update without its audit row and log entry, for an edit (status $2 is
-- 'modified'), whose transaction writes those itself; the parameters of
-- card_decide_logged.
UPDATE cards
SET status = $2, decided_at = now(), decided_by = $3, channel = $4, reason = $5
WHERE id = $1 AND status = 'pending' AND owner = $3 AND snapshot_hash = $6
  AND expires_at > now() AND ($7::text IS NULL OR tenant = $7)
RETURNING id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk,
    input, args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text,
    editable, status, expires_at, decided_at, decided_by, channel, reason,
    superseded_by::text, result, needs_reconciliation, created_at;

-- name: card_set_superseded_by
-- Card $1 (just modified) points at the card $2 proposed in its place.
UPDATE cards SET superseded_by = $2 WHERE id = $1
RETURNING id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk,
    input, args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text,
    editable, status, expires_at, decided_at, decided_by, channel, reason,
    superseded_by::text, result, needs_reconciliation, created_at;

-- name: card_move_logged
-- generated by scripts/generate_queries.py: edit it there, then run the script
-- A conditional move $2 -> $3 of card $1 with its audit row and log entry ($4 result,
-- $5 actor, $6 channel, $7 detail).
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = (SELECT cards.thread_id FROM cards WHERE cards.id = $1) FOR NO KEY UPDATE
),
c AS (
    UPDATE cards
    SET status = $3,
        result = COALESCE($4, result),
        executing_since = CASE WHEN $3 = 'executing' THEN now() ELSE executing_since END,
        decided_at = CASE WHEN $2 = 'pending' THEN COALESCE(decided_at, now())
                          ELSE decided_at END,
        decided_by = CASE WHEN $2 = 'pending' THEN COALESCE(decided_by, $5) ELSE decided_by END,
        -- an outcome recorded: nothing is left to reconcile
        needs_reconciliation = needs_reconciliation AND $2 <> 'executing'
    FROM lk
    WHERE lk.locked = cards.thread_id AND id = $1 AND status = $2
    RETURNING cards.*, jsonb_build_object(
        'id', cards.id,
        'thread_id', cards.thread_id,
        'run_id', cards.run_id,
        'tenant', cards.tenant,
        'owner', cards.owner,
        'tool', cards.tool,
        'risk', cards.risk,
        'args_snapshot', cards.args_snapshot,
        'summary', cards.summary,
        'impact', cards.impact,
        'snapshot_hash', cards.snapshot_hash,
        'request_key', cards.request_key,
        'operation_id', cards.operation_id,
        'status', cards.status,
        'tool_use_id', cards.tool_use_id,
        'input', cards.input,
        'decided_by', cards.decided_by,
        'channel', cards.channel,
        'reason', cards.reason,
        'superseded_by', cards.superseded_by,
        'result', cards.result,
        'needs_reconciliation', cards.needs_reconciliation,
        'expires_at', CASE WHEN cards.expires_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.expires_at)::bigint % 1000000 = 0
            THEN to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'created_at', CASE WHEN cards.created_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.created_at)::bigint % 1000000 = 0
            THEN to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'decided_at', CASE WHEN cards.decided_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.decided_at)::bigint % 1000000 = 0
            THEN to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'editable', to_jsonb(cards.editable)
    ) AS body
),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, $2, status, $5, $6::text, NULL, $7::jsonb FROM c
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + 1 FROM c WHERE threads.id = c.thread_id
    RETURNING threads.id, threads.last_seq
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT t.id, t.last_seq, c.run_id, 'card_update', c.body FROM c JOIN t ON t.id = c.thread_id
    RETURNING seq AS log_seq, created_at AS log_at
)
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at,
    c.body, m.log_seq, m.log_at,
    (SELECT worker_id FROM runs WHERE runs.id = c.run_id) AS holder
FROM c, m;

-- name: card_begin_execution
-- generated by scripts/generate_queries.py: edit it there, then run the script
-- approved -> executing and the operation row, in the same statement (I4); the
-- parameters of card_move_logged, and $8 the worker that must hold the card's run.
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = (SELECT cards.thread_id FROM cards WHERE cards.id = $1) FOR NO KEY UPDATE
),
c AS (
    UPDATE cards
    SET status = $3,
        result = COALESCE($4, result),
        executing_since = CASE WHEN $3 = 'executing' THEN now() ELSE executing_since END,
        decided_at = CASE WHEN $2 = 'pending' THEN COALESCE(decided_at, now())
                          ELSE decided_at END,
        decided_by = CASE WHEN $2 = 'pending' THEN COALESCE(decided_by, $5) ELSE decided_by END,
        -- an outcome recorded: nothing is left to reconcile
        needs_reconciliation = needs_reconciliation AND $2 <> 'executing'
    FROM lk
    WHERE lk.locked = cards.thread_id AND id = $1 AND status = $2
      AND ($8::text IS NULL OR EXISTS (
          SELECT 1 FROM runs WHERE runs.id = cards.run_id AND runs.worker_id = $8))
      -- a begin whose answer was lost and whose card was read back still approved: it
      -- must change nothing if it runs later (design note 53; the fence is on the row,
      -- so a begin that waited on the thread's lock rechecks it on the row's new version)
      AND NOT coalesce(($7::jsonb ->> 'attempt') = ANY (cards.fenced_attempts), false)
    RETURNING cards.*, jsonb_build_object(
        'id', cards.id,
        'thread_id', cards.thread_id,
        'run_id', cards.run_id,
        'tenant', cards.tenant,
        'owner', cards.owner,
        'tool', cards.tool,
        'risk', cards.risk,
        'args_snapshot', cards.args_snapshot,
        'summary', cards.summary,
        'impact', cards.impact,
        'snapshot_hash', cards.snapshot_hash,
        'request_key', cards.request_key,
        'operation_id', cards.operation_id,
        'status', cards.status,
        'tool_use_id', cards.tool_use_id,
        'input', cards.input,
        'decided_by', cards.decided_by,
        'channel', cards.channel,
        'reason', cards.reason,
        'superseded_by', cards.superseded_by,
        'result', cards.result,
        'needs_reconciliation', cards.needs_reconciliation,
        'expires_at', CASE WHEN cards.expires_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.expires_at)::bigint % 1000000 = 0
            THEN to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'created_at', CASE WHEN cards.created_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.created_at)::bigint % 1000000 = 0
            THEN to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'decided_at', CASE WHEN cards.decided_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.decided_at)::bigint % 1000000 = 0
            THEN to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'editable', to_jsonb(cards.editable)
    ) AS body
),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, $2, status, $5, $6::text, NULL, $7::jsonb FROM c
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + 1 FROM c WHERE threads.id = c.thread_id
    RETURNING threads.id, threads.last_seq
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT t.id, t.last_seq, c.run_id, 'card_update', c.body FROM c JOIN t ON t.id = c.thread_id
    RETURNING seq AS log_seq, created_at AS log_at
),
op AS (
    INSERT INTO operations (operation_id, card_id, tool, status)
    SELECT operation_id, id, tool, 'started' FROM c
)
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at,
    c.body, m.log_seq, m.log_at,
    (SELECT worker_id FROM runs WHERE runs.id = c.run_id) AS holder
FROM c, m;

-- name: card_finish_execution
-- generated by scripts/generate_queries.py: edit it there, then run the script
-- executing -> executed|failed and the operation's outcome ($8), in the same
-- statement; the other parameters of card_move_logged.
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = (SELECT cards.thread_id FROM cards WHERE cards.id = $1) FOR NO KEY UPDATE
),
c AS (
    UPDATE cards
    SET status = $3,
        result = COALESCE($4, result),
        executing_since = CASE WHEN $3 = 'executing' THEN now() ELSE executing_since END,
        decided_at = CASE WHEN $2 = 'pending' THEN COALESCE(decided_at, now())
                          ELSE decided_at END,
        decided_by = CASE WHEN $2 = 'pending' THEN COALESCE(decided_by, $5) ELSE decided_by END,
        -- an outcome recorded: nothing is left to reconcile
        needs_reconciliation = needs_reconciliation AND $2 <> 'executing'
    FROM lk
    WHERE lk.locked = cards.thread_id AND id = $1 AND status = $2
    RETURNING cards.*, jsonb_build_object(
        'id', cards.id,
        'thread_id', cards.thread_id,
        'run_id', cards.run_id,
        'tenant', cards.tenant,
        'owner', cards.owner,
        'tool', cards.tool,
        'risk', cards.risk,
        'args_snapshot', cards.args_snapshot,
        'summary', cards.summary,
        'impact', cards.impact,
        'snapshot_hash', cards.snapshot_hash,
        'request_key', cards.request_key,
        'operation_id', cards.operation_id,
        'status', cards.status,
        'tool_use_id', cards.tool_use_id,
        'input', cards.input,
        'decided_by', cards.decided_by,
        'channel', cards.channel,
        'reason', cards.reason,
        'superseded_by', cards.superseded_by,
        'result', cards.result,
        'needs_reconciliation', cards.needs_reconciliation,
        'expires_at', CASE WHEN cards.expires_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.expires_at)::bigint % 1000000 = 0
            THEN to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'created_at', CASE WHEN cards.created_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.created_at)::bigint % 1000000 = 0
            THEN to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'decided_at', CASE WHEN cards.decided_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.decided_at)::bigint % 1000000 = 0
            THEN to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'editable', to_jsonb(cards.editable)
    ) AS body
),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, $2, status, $5, $6::text, NULL, $7::jsonb FROM c
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + 1 FROM c WHERE threads.id = c.thread_id
    RETURNING threads.id, threads.last_seq
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT t.id, t.last_seq, c.run_id, 'card_update', c.body FROM c JOIN t ON t.id = c.thread_id
    RETURNING seq AS log_seq, created_at AS log_at
),
op AS (
    UPDATE operations SET status = $8, result = $4, finished_at = now()
    FROM c WHERE operations.operation_id = c.operation_id
)
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at,
    c.body, m.log_seq, m.log_at,
    (SELECT worker_id FROM runs WHERE runs.id = c.run_id) AS holder
FROM c, m;

-- name: card_expire_logged
-- generated by scripts/generate_queries.py: edit it there, then run the script
-- pending -> expired for card $1 if the database's clock says its deadline passed
-- (I7), with its audit row and log entry.
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = (SELECT cards.thread_id FROM cards WHERE cards.id = $1) FOR NO KEY UPDATE
),
c AS (
    UPDATE cards SET status = 'expired', decided_at = now(), decided_by = 'system:expiry'
    FROM lk
    WHERE lk.locked = cards.thread_id AND id = $1 AND status = 'pending'
      AND expires_at <= now()
    RETURNING cards.*, jsonb_build_object(
        'id', cards.id,
        'thread_id', cards.thread_id,
        'run_id', cards.run_id,
        'tenant', cards.tenant,
        'owner', cards.owner,
        'tool', cards.tool,
        'risk', cards.risk,
        'args_snapshot', cards.args_snapshot,
        'summary', cards.summary,
        'impact', cards.impact,
        'snapshot_hash', cards.snapshot_hash,
        'request_key', cards.request_key,
        'operation_id', cards.operation_id,
        'status', cards.status,
        'tool_use_id', cards.tool_use_id,
        'input', cards.input,
        'decided_by', cards.decided_by,
        'channel', cards.channel,
        'reason', cards.reason,
        'superseded_by', cards.superseded_by,
        'result', cards.result,
        'needs_reconciliation', cards.needs_reconciliation,
        'expires_at', CASE WHEN cards.expires_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.expires_at)::bigint % 1000000 = 0
            THEN to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'created_at', CASE WHEN cards.created_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.created_at)::bigint % 1000000 = 0
            THEN to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'decided_at', CASE WHEN cards.decided_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.decided_at)::bigint % 1000000 = 0
            THEN to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'editable', to_jsonb(cards.editable)
    ) AS body
),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, 'pending', status, 'system:expiry', NULL, NULL, '{}'::jsonb FROM c
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + 1 FROM c WHERE threads.id = c.thread_id
    RETURNING threads.id, threads.last_seq
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT t.id, t.last_seq, c.run_id, 'card_update', c.body FROM c JOIN t ON t.id = c.thread_id
    RETURNING seq AS log_seq, created_at AS log_at
)
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at,
    c.body, m.log_seq, m.log_at,
    (SELECT worker_id FROM runs WHERE runs.id = c.run_id) AS holder
FROM c, m;

-- name: cards_overdue
-- Up to $1 pending cards past their deadline (the sweeper expires them one by one).
SELECT id::text FROM cards WHERE status = 'pending' AND expires_at <= now()
ORDER BY expires_at LIMIT $1;

-- name: cards_approved_stale
-- Approved cards not started for $1 seconds, with whether their run is still active
-- and who holds it (partial index cards_approved: approved cards are few and short-lived),
-- also while its run waits on another, pending card (design note 60).
SELECT c.id::text, c.thread_id::text, c.run_id::text, c.tenant, c.owner, c.tool,
    c.tool_use_id, c.risk, c.input, c.args_snapshot, c.summary, c.impact, c.snapshot_hash,
    c.request_key, c.operation_id::text, c.editable, c.status, c.expires_at, c.decided_at,
    c.decided_by, c.channel, c.reason, c.superseded_by::text, c.result,
    c.needs_reconciliation, c.created_at,
    r.status IN ('running', 'waiting') AS run_active, r.worker_id AS holder
FROM cards c JOIN runs r ON r.id = c.run_id
WHERE c.status = 'approved' AND c.decided_at < now() - make_interval(secs => $1)
ORDER BY c.decided_at LIMIT $2;

-- name: cards_stuck_executing
-- Cards in executing for more than $1 seconds (and more than their worker's in-flight
-- time, kept in the `executing` audit row: its call may still be answered) are flagged
-- for reconciliation by a person (never retried: I4).
UPDATE cards SET needs_reconciliation = true
WHERE status = 'executing' AND NOT needs_reconciliation
  AND executing_since < now() - make_interval(secs => greatest($1::float8, coalesce((
      SELECT max((e.detail ->> 'in_flight_seconds')::float8) FROM card_events e
      WHERE e.card_id = cards.id AND e.to_status = 'executing'), 0)))
RETURNING id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk,
    input, args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text,
    editable, status, expires_at, decided_at, decided_by, channel, reason,
    superseded_by::text, result, needs_reconciliation, created_at;

-- name: cards_flag_elsewhere
-- Worker $3, holding run $2, gives up waiting on cards $1 found `executing` elsewhere
-- (design note 49): each still `executing` is flagged for reconciliation, audited, before
-- its model is told the outcome is unknown, unless the run was taken back meanwhile
-- (`worker_fence`, under the same thread lock: one of the two goes first); also by the
-- holder itself when a call it made stays unanswered. Reason $4 in the audit. Thread,
-- then run, then cards. Returns the ids flagged.
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = (SELECT runs.thread_id FROM runs WHERE runs.id = $2) FOR NO KEY UPDATE
),
r AS MATERIALIZED (
    SELECT runs.id FROM runs JOIN lk ON lk.locked = runs.thread_id
    WHERE runs.id = $2 AND runs.worker_id = $3 AND runs.status IN ('running', 'waiting')
    FOR SHARE OF runs
),
c AS (
    UPDATE cards SET needs_reconciliation = true
    FROM r
    WHERE cards.id = ANY ($1::uuid[]) AND cards.run_id = r.id
      AND cards.status = 'executing' AND NOT cards.needs_reconciliation
    RETURNING cards.id
),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, 'executing', 'executing', 'worker:' || $3, NULL, NULL,
           jsonb_build_object('needs_reconciliation', true, 'reason', $4::text)
    FROM c
)
SELECT id::text FROM c;

-- name: card_late_outcome
-- The provider answered ($2: succeeded | failed, result $3) for card $1 after the card
-- left `executing` (an operator settled it while the call was in flight): the answer is
-- written to the card's audit by $4, the card itself unchanged. The thread's lock first,
-- as every writer of a card's audit (retention's prune skips a locked thread). No row
-- while the card is `executing`, or when it already holds this very answer (this
-- worker's own record committed and its reply was lost); else the card's status.
WITH lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id = (SELECT cards.thread_id FROM cards WHERE cards.id = $1) FOR NO KEY UPDATE
),
c AS (
    SELECT cards.id, cards.status FROM cards JOIN lk ON lk.locked = cards.thread_id
    WHERE cards.id = $1 AND cards.status <> 'executing'
      AND NOT (cards.status = CASE $2::text WHEN 'succeeded' THEN 'executed' ELSE 'failed' END
               AND cards.result IS NOT DISTINCT FROM $3::jsonb)
),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, status, status, $4, NULL, NULL,
           jsonb_build_object('late_outcome', $2::text, 'result', $3::jsonb,
                              'reason', 'the provider answered after the card was settled')
    FROM c
)
SELECT status FROM c;

-- name: card_in_flight
-- Card $1 when it is `executing`, not flagged, and a provider call may still be in
-- flight: it started (or was last fenced) less than its worker's in-flight time ago (kept
-- in the `executing` audit row; at least $2 seconds). Seconds since then and that time;
-- no row otherwise. Run under the thread's lock (card_lock_thread), as the fence is.
SELECT extract(epoch FROM now() - c.executing_since)::float8 AS since, w.secs
FROM cards c
CROSS JOIN LATERAL (
    SELECT greatest($2::float8, coalesce(max((e.detail ->> 'in_flight_seconds')::float8), 0))
        AS secs
    FROM card_events e WHERE e.card_id = c.id AND e.to_status = 'executing'
) w
WHERE c.id = $1 AND c.status = 'executing' AND NOT c.needs_reconciliation
  AND c.executing_since > now() - make_interval(secs => w.secs);

-- name: card_reconcile_flag
UPDATE cards SET needs_reconciliation = $2 WHERE id = $1;

-- name: operation_finish
UPDATE operations SET status = $2, result = $3, finished_at = now() WHERE operation_id = $1;

-- name: event_insert
INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: events_of_card
SELECT id, card_id::text, from_status, to_status, actor, channel, hash_seen, at, detail
FROM card_events WHERE card_id = $1 ORDER BY id;

-- name: app_join_lock
-- Serialises processes joining (any app): a check and its insert see every earlier join.
SELECT pg_advisory_xact_lock(7401553902);

-- name: app_processes_live
-- The processes other than $1 renewed within $2 seconds (runtime/presence.py).
SELECT id, app, fingerprint, tools, roles, bus FROM app_processes
WHERE id <> $1 AND seen_at > now() - make_interval(secs => $2)
ORDER BY started_at, id;

-- name: app_process_upsert
-- Register or renew process $1 serving app $2 (fingerprint $3, tools $4, roles $5) on
-- bus $6.
INSERT INTO app_processes (id, app, fingerprint, tools, roles, bus)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (id) DO UPDATE SET app = EXCLUDED.app, fingerprint = EXCLUDED.fingerprint,
    tools = EXCLUDED.tools, roles = EXCLUDED.roles, bus = EXCLUDED.bus, seen_at = now();

-- name: app_process_leave
-- A process stopping cleanly forgets its row.
DELETE FROM app_processes WHERE id = $1;

-- name: installation_id
-- This database's own random id (migration 0014), made now if its row went missing.
WITH made AS (
    INSERT INTO signoff_installation DEFAULT VALUES ON CONFLICT (one) DO NOTHING RETURNING id
)
SELECT id::text FROM made UNION ALL SELECT id::text FROM signoff_installation LIMIT 1;

-- name: app_processes_forget
-- Rows of processes gone for a day: nobody reads them any more.
DELETE FROM app_processes WHERE seen_at < now() - make_interval(secs => 86400);

-- name: run_hand_over
-- A run whose approved card names a tool its holder ($2) does not serve, handed back
-- (holder NULL: any worker adopts it) when a live worker ($4 seconds) of the same app
-- ($5: a process of another app on the database serves its own tools, whatever their
-- names) serves tool $3.
UPDATE runs SET worker_id = NULL, updated_at = now()
WHERE id = $1 AND worker_id = $2 AND status IN ('running', 'waiting')
  AND EXISTS (
      SELECT 1 FROM app_processes p
      WHERE p.id <> $2 AND p.app = $5 AND 'worker' = ANY (p.roles) AND p.tools ? $3
        AND p.seen_at > now() - make_interval(secs => $4)
  )
RETURNING id::text;

-- The WhatsApp channel (store/whatsapp.py, gateway/channels/whatsapp).

-- name: delivery_claim
-- Claim channel delivery $2 for $3 seconds: 'claimed' the first time it is seen, or when
-- an earlier claim lapsed before it was handled (its gateway died, or was too slow: then
-- with the effect its handling had chosen, if it had written one); 'handled' once its
-- effect committed; 'busy' while another request holds a live claim on it (or claimed it
-- while this statement ran: its row is not in this statement's snapshot). A row with no
-- claim time was written by a gateway of the version before claims, whose insert was its
-- mark of "seen": handled, as that gateway took it (claimed again, a "sim" it had
-- approved would be chosen afresh, as a message). The claim's end time is its token: the
-- holder's later statements name it, and do nothing once another request re-claimed.
WITH claimed AS (
    INSERT INTO deliveries (channel, message_id, claimed_until)
    VALUES ($1, $2, now() + make_interval(secs => $3::float8))
    ON CONFLICT (channel, message_id) DO UPDATE
        SET claimed_until = EXCLUDED.claimed_until
        WHERE NOT deliveries.handled AND deliveries.claimed_until < now()
    RETURNING effect, claimed_until
)
SELECT CASE
    WHEN EXISTS (SELECT 1 FROM claimed) THEN 'claimed'
    WHEN (SELECT handled OR claimed_until IS NULL
          FROM deliveries WHERE channel = $1 AND message_id = $2) THEN 'handled'
    ELSE 'busy'
END AS state, (SELECT effect FROM claimed) AS effect,
    (SELECT claimed_until FROM claimed) AS token;

-- name: delivery_effect
-- What the delivery's handling under claim $3 chose to do ($4), before doing it: a
-- redelivery after a lapsed claim does the same. No row: the claim was lost (it lapsed
-- and another request re-claimed the delivery, or handled it), and its holder must not act.
UPDATE deliveries SET effect = $4
WHERE channel = $1 AND message_id = $2 AND claimed_until = $3 AND NOT handled
RETURNING effect;

-- name: delivery_handled
-- The effect of the delivery's handling under claim $3 committed: a redelivery is
-- answered 200 and dropped.
UPDATE deliveries SET handled = true
WHERE channel = $1 AND message_id = $2 AND claimed_until = $3;

-- name: delivery_held
-- Whether claim $3 on the delivery is still held (not taken over, not handled): a
-- handling that lost it leaves the telling to the request that took it over.
SELECT EXISTS (
    SELECT 1 FROM deliveries
    WHERE channel = $1 AND message_id = $2 AND claimed_until = $3 AND NOT handled
);

-- name: delivery_forget
-- A delivery that could not be handled under claim $3: gone when nothing was chosen for it
-- yet (a redelivery is new, to a gateway of any version), else its claim let go and its
-- choice kept (a decision whose answer was lost may have committed: handled again at once,
-- a "sim" must do what it chose, not become a message).
WITH gone AS (
    DELETE FROM deliveries
    WHERE channel = $1 AND message_id = $2 AND claimed_until = $3 AND NOT handled
      AND effect IS NULL
)
UPDATE deliveries SET claimed_until = '-infinity'
WHERE channel = $1 AND message_id = $2 AND claimed_until = $3 AND NOT handled
  AND effect IS NOT NULL;

-- name: wa_card_shown
-- Whether a text "ok" of unix second $3 (the message's `timestamp`, whole seconds) can
-- only have been about card $2 of thread $1: its proposal (its 'card' entry) was sent to
-- the thread's WhatsApp number before then (a send within that second counts), and no
-- other card of the thread had been sent by then and was still undecided at that second
-- (an "ok" written while two cards waited chose neither, whichever is left when it is
-- handled: a hostile probe), unless the reply quotes the card ($4: then it is about that
-- card alone). Not one shown after a late redelivery, either. Another card counts from
-- the moment its send was claimed, sent or not: a send whose "sent" was not recorded (a
-- crash after the claim, an answer lost, then 'failed') may have reached the phone.
SELECT EXISTS (
    SELECT 1 FROM messages m
    JOIN wa_outbound o ON o.key = 'log:' || m.thread_id || ':' || m.seq
    WHERE m.thread_id = $1 AND m.kind = 'card' AND m.body->>'id' = $2::text
      AND o.status = 'sent'
      AND o.sent_at < to_timestamp($3::bigint + 1)
) AND ($4::boolean OR NOT EXISTS (
    SELECT 1 FROM messages m
    JOIN wa_outbound o ON o.key = 'log:' || m.thread_id || ':' || m.seq
    JOIN cards c ON c.id = (m.body->>'id')::uuid AND c.thread_id = $1
    WHERE m.thread_id = $1 AND m.kind = 'card' AND m.body->>'id' <> $2::text
      AND o.status <> 'skipped'
      AND o.created_at < to_timestamp($3::bigint + 1)
      AND c.expires_at > to_timestamp($3::bigint)
      AND NOT EXISTS (
          SELECT 1 FROM card_events e
          WHERE e.card_id = c.id AND e.from_status = 'pending'
            AND e.at < to_timestamp($3::bigint)
      )
));

-- name: wa_quoted_card
-- The card whose WhatsApp message $2 (Meta's id, as the send returned it) a reply in
-- thread $1 quotes, if it quotes one.
SELECT m.body->>'id' FROM messages m
JOIN wa_outbound o ON o.key = 'log:' || m.thread_id || ':' || m.seq
WHERE m.thread_id = $1 AND m.kind = 'card' AND o.wa_message = $2
LIMIT 1;

-- name: wa_contact_get
SELECT thread_id::text FROM wa_contacts WHERE tenant = $1 AND wa_id = $2;

-- name: wa_contact_insert
-- The thread is created by the caller first; a concurrent first message for the same
-- number wins or loses here, and the loser's empty thread is deleted.
-- The thread is flagged as a WhatsApp thread (`threads.wa`: its appends are recorded in
-- `wa_due` from now on) under its row lock, so the contact's cursor starts at the newest
-- seq and no append falls between the two.
WITH flagged AS (
    UPDATE threads SET wa = true WHERE id = $3 RETURNING id, last_seq
)
INSERT INTO wa_contacts (tenant, wa_id, thread_id, sent_seq)
SELECT $1, $2, flagged.id, flagged.last_seq FROM flagged
ON CONFLICT (tenant, wa_id) DO NOTHING
RETURNING thread_id::text;

-- name: wa_contact_inbound
UPDATE wa_contacts SET last_inbound_at = now() WHERE tenant = $1 AND wa_id = $2;

-- name: wa_contact_text
-- The number wrote a text at unix second $3 that goes on to its agent as a message
-- (marked again, the same second is kept once).
UPDATE wa_contacts
SET last_text_sent = greatest(coalesce(last_text_sent, $3), $3),
    text_seconds = CASE WHEN $3 = ANY (text_seconds) THEN text_seconds
                        ELSE (text_seconds || $3::bigint)[greatest(cardinality(text_seconds) - 18, 1):]
                   END
WHERE tenant = $1 AND wa_id = $2;

-- name: wa_thread_text
-- A message for thread $1's agent came from another channel (the chat page) now (the
-- database's clock, as the card sends it is compared with): to a "sim" on WhatsApp it
-- is a text the number wrote too.
WITH t AS (SELECT floor(extract(epoch FROM now()))::bigint AS s)
UPDATE wa_contacts
SET last_text_sent = greatest(coalesce(last_text_sent, t.s), t.s),
    text_seconds = CASE WHEN t.s = ANY (text_seconds) THEN text_seconds
                        ELSE (text_seconds || t.s)[greatest(cardinality(text_seconds) - 18, 1):]
                   END
FROM t
WHERE thread_id = $1;

-- name: wa_written_since
-- Whether thread $1's number wrote a text that went on as a message in a second after
-- the one card $2's proposal was sent to it in, and no later than second $3 (the "sim"'s:
-- a text of that same second may have come first): a "sim" after it is about what came
-- after it. A text of the card's own second was written before the card could be read
-- (the request that made it, most often); one written after the "sim" does not change
-- what the "sim" meant.
SELECT EXISTS (
    SELECT 1 FROM wa_contacts c
    JOIN messages m ON m.thread_id = c.thread_id AND m.kind = 'card' AND m.body->>'id' = $2::text
    JOIN wa_outbound o ON o.key = 'log:' || m.thread_id || ':' || m.seq
    CROSS JOIN LATERAL unnest(c.text_seconds) AS s(second)
    WHERE c.thread_id = $1
      AND s.second > floor(extract(epoch FROM coalesce(o.sent_at, o.created_at)))
      AND s.second <= $3
);

-- name: wa_outbound_claim
-- Claim up to $1 thread-log entries of WhatsApp threads not yet claimed, for claimer $2:
-- the INSERT ... ON CONFLICT lets exactly one gateway claim each entry; the contact's
-- cursor moves past what was looked at. $3: the 24-hour window, in seconds. Only threads
-- listed in `wa_due` are read (their appends put them there); a thread's row goes once the
-- cursor has passed its seq. An append racing with this statement raised that seq, so
-- its row stays (the DELETE re-checks the row it finds changed) for the next poll.
WITH due AS (
    SELECT c.tenant, c.wa_id, m.thread_id, m.seq, m.kind, m.body,
           (c.last_inbound_at IS NOT NULL
            AND c.last_inbound_at > now() - make_interval(secs => $3)) AS in_window
    FROM wa_due q
    JOIN wa_contacts c ON c.thread_id = q.thread_id
    JOIN messages m ON m.thread_id = c.thread_id AND m.seq > c.sent_seq
    ORDER BY m.thread_id, m.seq
    LIMIT $1
), tops AS (
    SELECT thread_id, max(seq) AS top FROM due GROUP BY thread_id
), advanced AS (
    UPDATE wa_contacts c SET sent_seq = greatest(c.sent_seq, d.top)
    FROM tops d
    WHERE c.thread_id = d.thread_id
), settled AS (
    DELETE FROM wa_due q
    USING wa_contacts c LEFT JOIN tops d ON d.thread_id = c.thread_id
    WHERE c.thread_id = q.thread_id AND q.seq <= greatest(c.sent_seq, d.top)
), claimed AS (
    INSERT INTO wa_outbound (key, tenant, wa_id, thread_id, seq, kind, claimed_by)
    SELECT 'log:' || thread_id || ':' || seq, tenant, wa_id, thread_id, seq, kind, $2
    FROM due WHERE kind IN ('assistant', 'card', 'card_update')
    ON CONFLICT (key) DO NOTHING
    RETURNING key
)
SELECT d.tenant, d.wa_id, d.thread_id::text, d.seq, d.kind, d.body, d.in_window,
       'log:' || d.thread_id || ':' || d.seq AS key
FROM due d JOIN claimed k ON k.key = 'log:' || d.thread_id || ':' || d.seq
ORDER BY d.thread_id, d.seq;

-- name: wa_outbound_reclaim
-- Take over up to $1 thread-log claims that stayed 'claimed' longer than the lease ($3
-- seconds): their gateway died between claim and send (design note 24). The re-checked
-- WHERE of the UPDATE lets one gateway win each row. $2: the new claimer, $4: the window.
-- A direct reply's claim left so (no thread: its text was never stored, it cannot be
-- sent by another gateway) is closed as failed, so that it is counted and pruned.
WITH abandoned AS (
    UPDATE wa_outbound
    SET status = 'failed', error = 'the gateway that claimed this reply stopped before sending it'
    WHERE status = 'claimed' AND thread_id IS NULL
      AND claimed_at < now() - make_interval(secs => $3)
), stale AS (
    SELECT key FROM wa_outbound
    WHERE status = 'claimed' AND thread_id IS NOT NULL
      AND claimed_at < now() - make_interval(secs => $3)
    ORDER BY claimed_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE wa_outbound o SET claimed_by = $2, claimed_at = now()
    FROM stale WHERE o.key = stale.key
    RETURNING o.key, o.tenant, o.wa_id, o.thread_id, o.seq, o.kind
)
SELECT t.tenant, t.wa_id, t.thread_id::text, t.seq, t.kind, m.body,
       (c.last_inbound_at IS NOT NULL
        AND c.last_inbound_at > now() - make_interval(secs => $4)) AS in_window,
       t.key
FROM taken t
JOIN messages m ON m.thread_id = t.thread_id AND m.seq = t.seq
JOIN wa_contacts c ON c.tenant = t.tenant AND c.wa_id = t.wa_id
ORDER BY t.thread_id, t.seq;

-- name: wa_reply_claim
-- A direct answer to one inbound delivery (a late or refused button, a "sim" told how to
-- decide), claimed once; taken back by the delivery's own redelivery when its gateway
-- stopped before sending it (closed as failed with no attempt by the reclaim, or still
-- claimed past the lease $6): a person whose "sim" was answered so got no answer at all.
INSERT INTO wa_outbound (key, tenant, wa_id, kind, claimed_by)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (key) DO UPDATE
    SET claimed_by = EXCLUDED.claimed_by, claimed_at = now(), status = 'claimed',
        error = NULL
    WHERE wa_outbound.attempts = 0
      AND (wa_outbound.status = 'failed'
           OR (wa_outbound.status = 'claimed'
               AND wa_outbound.claimed_at < now() - make_interval(secs => $6)))
RETURNING key;

-- name: wa_outbound_hold
-- Whether claimer $2 still holds the claim on $1, renewing it (claimed_at) if so: asked
-- before each attempt to send it, so a claim taken over by another gateway after its
-- lease (a slow Graph API held this one's batch) is not sent a second time by this one.
UPDATE wa_outbound SET claimed_at = now()
WHERE key = $1 AND claimed_by = $2 AND status = 'claimed'
RETURNING 1;

-- name: wa_outbound_finish
-- $6: the claimer finishing it (NULL: anyone); a row another gateway took over since
-- is that gateway's to finish (a late finish would overwrite its outcome).
UPDATE wa_outbound
SET status = $2, attempts = $3, error = $4, wa_message = $5,
    sent_at = CASE WHEN $2 = 'sent' THEN now() END
WHERE key = $1 AND ($6::text IS NULL OR (claimed_by = $6 AND status = 'claimed'));

-- name: wa_in_window
SELECT coalesce(last_inbound_at > now() - make_interval(secs => $3), false)
FROM wa_contacts WHERE tenant = $1 AND wa_id = $2;

-- name: card_refusal_insert
INSERT INTO card_refusals (card_id, actor, channel, reason, detail)
VALUES ($1, $2, $3, $4, $5);

-- name: card_refusals_of_card
SELECT card_id::text, actor, channel, reason, detail, at
FROM card_refusals WHERE card_id = $1 ORDER BY id;

-- ---------------------------------------------------------------------------------------
-- Durable workflows (store/workflows.py, design note 26). Locks: the run row first, then
-- its interrupts and buffered events. A holder is live while its row in workers has a
-- future lease (a worker that stopped gracefully has no row any more).

-- name: wf_run_insert
-- A run id the client chose may already exist (a retried start): nothing is inserted.
INSERT INTO workflow_runs (id, tenant, owner, app, workflow, status, input)
VALUES ($1, $2, $3, $4, $5, 'running', $6)
ON CONFLICT (id) DO NOTHING
RETURNING id::text, tenant, owner, app, workflow, status, step, state, input, steps,
    worker_id AS holder, error, created_at, updated_at;

-- name: wf_runs_recent
-- How many workflow runs owner $2 of tenant $1 started in the last $3 seconds, and the
-- seconds until the oldest of them leaves that window (run under quota_user_lock).
SELECT count(*) AS n,
       extract(epoch FROM min(created_at) + make_interval(secs => $3) - now())::float8
           AS retry_after
FROM workflow_runs
WHERE tenant = $1 AND owner = $2 AND created_at > now() - make_interval(secs => $3);

-- name: wf_run_get
SELECT id::text, tenant, owner, app, workflow, status, step, state, input, steps,
    worker_id AS holder, error, created_at, updated_at
FROM workflow_runs WHERE id = $1;

-- name: wf_run_lock
SELECT r.id::text, r.tenant, r.owner, r.app, r.workflow, r.status, r.step, r.state, r.input,
    r.steps, r.worker_id AS holder, r.error, r.created_at, r.updated_at,
    EXISTS (SELECT 1 FROM workers w WHERE w.id = r.worker_id AND w.lease_until > now())
        AS holder_live
FROM workflow_runs r WHERE r.id = $1
FOR UPDATE OF r;

-- name: wf_runs_list
-- Newest first; $1 tenant, $2 owner, $3 status (NULL: any), $4 at most.
SELECT id::text, tenant, owner, app, workflow, status, step, state, input, steps,
    worker_id AS holder, error, created_at, updated_at
FROM workflow_runs
WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR owner = $2)
  AND ($3::text IS NULL OR status = $3)
ORDER BY updated_at DESC LIMIT $4;

-- name: agent_runs_list
-- Agent runs (one per user message) for `signoff runs list`; $1 status (NULL: any).
SELECT id::text, thread_id::text, tenant, owner, status, worker_id AS holder, error,
    created_at, updated_at
FROM runs WHERE ($1::text IS NULL OR status = $1)
ORDER BY updated_at DESC LIMIT $2;

-- name: wf_claim
-- Worker $2 takes run $1 to run its next steps: only a running run of a workflow it
-- serves (app $3, workflows $4) held by nobody, by itself, or by a worker whose lease
-- lapsed (or who let go of it).
UPDATE workflow_runs r SET worker_id = $2
WHERE r.id = $1 AND r.status = 'running' AND r.app = $3 AND r.workflow = ANY ($4::text[])
  AND (r.worker_id IS NULL OR r.worker_id = $2
       OR NOT EXISTS (SELECT 1 FROM workers w
                      WHERE w.id = r.worker_id AND w.lease_until > now()))
RETURNING r.id::text, r.tenant, r.owner, r.app, r.workflow, r.status, r.step, r.state,
    r.input, r.steps, r.worker_id AS holder, r.error, r.created_at, r.updated_at;

-- name: wf_step_done
-- Step $3 of run $1 (held by $2) finished: its update $4 merged, step + 1, the step ($5)
-- logged; the run completes with its last step ($6 = the workflow's step count). One
-- statement: a completed step is never run again.
UPDATE workflow_runs
SET state = state || $4::jsonb, step = step + 1,
    steps = steps || jsonb_build_array(jsonb_build_object('name', $5::text, 'at', now())),
    status = CASE WHEN step + 1 >= $6 THEN 'completed' ELSE 'running' END,
    updated_at = now()
WHERE id = $1 AND worker_id = $2 AND step = $3 AND status = 'running'
RETURNING id::text, tenant, owner, app, workflow, status, step, state, input, steps,
    worker_id AS holder, error, created_at, updated_at;

-- name: wf_gate_passed
-- The gate at run $1's current step was resolved with payload $2 (its name $3): merged,
-- step + 1, running again (or completed after the last step, $4 = the step count). $5
-- (re-enter): an extension step's wait, whose step runs again with the resolution on its
-- interrupt: nothing merged, same step, running.
UPDATE workflow_runs
SET state = CASE WHEN $5 THEN state ELSE state || $2::jsonb END,
    step = CASE WHEN $5 THEN step ELSE step + 1 END,
    steps = CASE WHEN $5 THEN steps
                 ELSE steps || jsonb_build_array(jsonb_build_object('name', $3::text, 'at', now()))
            END,
    status = CASE WHEN NOT $5 AND step + 1 >= $4 THEN 'completed' ELSE 'running' END,
    error = NULL, updated_at = now()
WHERE id = $1
RETURNING id::text, tenant, owner, app, workflow, status, step, state, input, steps,
    worker_id AS holder, error, created_at, updated_at;

-- name: wf_set_status
UPDATE workflow_runs SET status = $2, error = $3, updated_at = now()
WHERE id = $1
RETURNING id::text, tenant, owner, app, workflow, status, step, state, input, steps,
    worker_id AS holder, error, created_at, updated_at;

-- name: wf_fail
-- Run $1, held by $2 and running, failed with error $3.
UPDATE workflow_runs SET status = 'failed', error = $3, updated_at = now()
WHERE id = $1 AND worker_id = $2 AND status = 'running'
RETURNING id::text, tenant, owner, app, workflow, status, step, state, input, steps,
    worker_id AS holder, error, created_at, updated_at;

-- name: wf_runs_due
-- Running runs held by $1 (a resolution whose signal this worker missed is found here).
SELECT id::text FROM workflow_runs WHERE worker_id = $1 AND status = 'running' LIMIT $2;

-- name: wf_runs_adopt
-- Worker $1 takes over (up to $3) running runs of the workflows it serves (app $5,
-- workflows $6) that nobody live holds ($4: also its own, for a restarted worker with a
-- stable id); its lease ($2 s) is renewed in the same statement.
-- Parked runs are not adopted: they need no holder (a resolution goes to the inbox).
WITH me AS (
    INSERT INTO workers (id, lease_until) VALUES ($1, now() + make_interval(secs => $2))
    ON CONFLICT (id) DO UPDATE SET lease_until = clock_timestamp() + make_interval(secs => $2)
),
lapsed AS (
    SELECT r.id, r.worker_id FROM workflow_runs r
    WHERE r.status = 'running' AND r.app = $5 AND r.workflow = ANY ($6::text[])
      AND (r.worker_id IS NULL
           OR ($4 AND r.worker_id = $1)
           OR (r.worker_id <> $1 AND NOT EXISTS (
                  SELECT 1 FROM workers w WHERE w.id = r.worker_id AND w.lease_until > now())))
    ORDER BY r.updated_at
    LIMIT $3
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE workflow_runs r SET worker_id = $1
FROM lapsed WHERE r.id = lapsed.id AND r.worker_id IS NOT DISTINCT FROM lapsed.worker_id
RETURNING r.id::text;

-- name: wf_release
-- A graceful stop: holder $1 lets go of its workflow runs.
UPDATE workflow_runs SET worker_id = NULL
WHERE worker_id = $1 AND status IN ('running', 'awaiting_human', 'awaiting_event');

-- name: wf_interrupt_insert
-- $9: seconds to the deadline (NULL: none), on the database clock (I7).
INSERT INTO interrupts (id, run_id, step, step_name, kind, reason, schema, event, deadline,
    timeout_response, status, payload, resolved_by, resolved_at, automatic, detail, reenter)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
    CASE WHEN $9::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => $9::float8) END,
    $10, $11, $12, $13, CASE WHEN $11 = 'resolved' THEN now() END, $14, $15, $16)
RETURNING id::text, run_id::text, step, step_name, kind, reason, schema, event, deadline,
    timeout_response, status, payload, resolved_by, resolved_at, automatic, detail, reenter, created_at;

-- name: wf_interrupts_of_run
SELECT id::text, run_id::text, step, step_name, kind, reason, schema, event, deadline,
    timeout_response, status, payload, resolved_by, resolved_at, automatic, detail, reenter, created_at
FROM interrupts WHERE run_id = $1 ORDER BY created_at, id;

-- name: wf_interrupt_open_lock
SELECT id::text, run_id::text, step, step_name, kind, reason, schema, event, deadline,
    timeout_response, status, payload, resolved_by, resolved_at, automatic, detail, reenter, created_at,
    deadline IS NOT NULL AND deadline <= now() AS overdue
FROM interrupts WHERE run_id = $1 AND status = 'open'
FOR UPDATE;

-- name: wf_interrupt_last
SELECT id::text, run_id::text, step, step_name, kind, reason, schema, event, deadline,
    timeout_response, status, payload, resolved_by, resolved_at, automatic, detail, reenter, created_at
FROM interrupts WHERE run_id = $1 AND step = $2 ORDER BY created_at DESC, id LIMIT 1;

-- name: wf_interrupt_resolve
UPDATE interrupts
SET status = 'resolved', payload = $2, resolved_by = $3, resolved_at = now(), automatic = $4
WHERE id = $1 AND status = 'open'
RETURNING id::text, run_id::text, step, step_name, kind, reason, schema, event, deadline,
    timeout_response, status, payload, resolved_by, resolved_at, automatic, detail, reenter, created_at;

-- name: wf_interrupt_time_out
UPDATE interrupts
SET status = 'timed_out', resolved_by = 'system:timeout', resolved_at = now(), automatic = true
WHERE id = $1 AND status = 'open'
RETURNING id::text, run_id::text, step, step_name, kind, reason, schema, event, deadline,
    timeout_response, status, payload, resolved_by, resolved_at, automatic, detail, reenter, created_at;

-- name: wf_interrupts_cancel
UPDATE interrupts SET status = 'cancelled', resolved_by = $2, resolved_at = now()
WHERE run_id = $1 AND status = 'open';

-- name: wf_interrupts_overdue
-- Open gates whose deadline passed (database clock): (interrupt, run) for the sweeper.
-- Only those of the workflows this worker serves (app $2, workflows $3).
SELECT i.id::text, i.run_id::text FROM interrupts i JOIN workflow_runs r ON r.id = i.run_id
WHERE i.status = 'open' AND i.deadline <= now() AND r.app = $2 AND r.workflow = ANY ($3::text[])
ORDER BY i.deadline LIMIT $1;

-- name: wf_event_insert
INSERT INTO workflow_events (id, run_id, name, payload, delivered_by)
VALUES ($1, $2, $3, $4, $5);

-- name: wf_event_id_get
-- What the delivery of run $1's event $2 (its sender's id) did, if it was delivered.
SELECT name, kept FROM workflow_event_ids WHERE run_id = $1 AND event_id = $2;

-- name: wf_event_id_record
-- Run $1's event $2 (named $3) was delivered: passed a gate, or kept ($4); under the run's
-- lock, in the delivery's transaction.
INSERT INTO workflow_event_ids (run_id, event_id, name, kept) VALUES ($1, $2, $3, $4);

-- name: wf_events_kept
-- How many events run $1 keeps that a gate may still take: not consumed, delivered within
-- the last $2 seconds (the longest lookback of the gates that take them; older ones can
-- never be taken, so they do not count against the bound). Under the run's lock.
SELECT count(*) FROM workflow_events
WHERE run_id = $1 AND consumed_at IS NULL
  AND delivered_at >= now() - make_interval(secs => $2::float8);

-- name: wf_event_take
-- The earliest event $2 delivered to run $1 within the last $3 seconds and not consumed
-- yet, consumed now (the gate it was kept for has been reached).
UPDATE workflow_events SET consumed_at = now()
WHERE id = (
    SELECT id FROM workflow_events
    WHERE run_id = $1 AND name = $2 AND consumed_at IS NULL
      AND delivered_at >= now() - make_interval(secs => $3::float8)
    ORDER BY delivered_at LIMIT 1
    FOR UPDATE
)
RETURNING payload, delivered_by;

-- name: wf_pass_gate
-- The fast path of a resume or an event (one statement): run $1, found parked with status
-- $2 at step $3, has its open interrupt (of event $7 when given; the kind is implied by
-- the status) resolved with payload $4 by $5 (automatic $6) and passes the gate (step
-- + 1; completed after the last step, $8 = the step count). The run row is locked first.
-- No row: the run moved on meanwhile (the caller diagnoses under locks).
WITH run AS (
    SELECT r.id FROM workflow_runs r
    WHERE r.id = $1 AND r.status = $2 AND r.step = $3
    FOR UPDATE
),
intr AS (
    UPDATE interrupts i
    SET status = 'resolved', payload = $4, resolved_by = $5, resolved_at = now(), automatic = $6
    FROM run
    WHERE i.run_id = run.id AND i.status = 'open' AND ($7::text IS NULL OR i.event = $7)
    RETURNING i.*
),
passed AS (
    UPDATE workflow_runs w
    SET state = CASE WHEN intr.reenter THEN w.state ELSE w.state || $4::jsonb END,
        step = CASE WHEN intr.reenter THEN w.step ELSE w.step + 1 END,
        steps = CASE WHEN intr.reenter THEN w.steps
                     ELSE w.steps || jsonb_build_array(
                         jsonb_build_object('name', intr.step_name, 'at', now()))
                END,
        status = CASE WHEN NOT intr.reenter AND w.step + 1 >= $8 THEN 'completed'
                      ELSE 'running' END,
        error = NULL, updated_at = now()
    FROM intr
    WHERE w.id = $1
    RETURNING w.id::text, w.tenant, w.owner, w.app, w.workflow, w.status, w.step, w.state,
        w.input, w.steps, w.worker_id AS holder, w.error, w.created_at, w.updated_at
)
SELECT passed.*, to_jsonb(intr) AS interrupt,
    EXISTS (SELECT 1 FROM workers k WHERE k.id = passed.holder AND k.lease_until > now())
        AS holder_live
FROM passed, intr;
-- == retention (store/retention.py, `signoff prune`, design note 28) ====================
-- A thread is prunable when it was created and last written to before now() - $2 seconds
-- and nothing in it is live: no active run, no card pending, approved or executing.
-- $1: the tenant (NULL: every tenant but those listed in $4, which have rules of their own).

-- name: retention_jit_off
-- A prune batch's first statement: no JIT for this transaction. retention_pick's generic
-- plan is costed for the whole threads table (its LIMIT is a parameter), which passes
-- jit_above_cost (100,000) from ~200k threads: 19 ms of LLVM compilation per batch for
-- 0.2 ms of work (bench/timers.py). SET LOCAL: gone at commit, fine behind PgBouncer.
SET LOCAL jit = off;

-- name: retention_pick
-- Up to $3 prunable threads, oldest first, locked FOR UPDATE (a delete's lock); a thread a
-- writer holds is skipped (SKIP LOCKED) and left for the next run. The last entry's age is
-- a correlated lookup by the log's key, one per candidate (as NOT EXISTS it was planned as
-- a hash anti join over every recent entry of the log, every batch); so are the thread's
-- open cards, a sub-select the planner cannot turn into a join over every card.
SELECT t.id FROM threads t
WHERE (($1::text IS NULL AND NOT (t.tenant = ANY($4::text[]))) OR t.tenant = $1)
    AND t.created_at < now() - make_interval(secs => $2::float8)
    AND coalesce((SELECT m.created_at FROM messages m
                  WHERE m.thread_id = t.id AND m.seq = t.last_seq), '-infinity')
        < now() - make_interval(secs => $2::float8)
    AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.id
        AND r.status IN ('running', 'waiting'))
    AND NOT (SELECT EXISTS (SELECT 1 FROM cards c WHERE c.thread_id = t.id
        AND c.status IN ('pending', 'approved', 'executing')))
ORDER BY t.created_at LIMIT $3
FOR UPDATE OF t SKIP LOCKED;

-- name: retention_recheck
-- The threads $1 (locked by this transaction) still prunable, seen by a fresh statement:
-- whatever committed before the lock was granted (a new message, a new run) counts.
SELECT t.id FROM threads t
WHERE t.id = ANY($1::uuid[])
    AND t.created_at < now() - make_interval(secs => $2::float8)
    AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.thread_id = t.id AND m.seq = t.last_seq
        AND m.created_at >= now() - make_interval(secs => $2::float8))
    AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.id
        AND r.status IN ('running', 'waiting'))
    AND NOT EXISTS (SELECT 1 FROM cards c WHERE c.thread_id = t.id
        AND c.status IN ('pending', 'approved', 'executing'));

-- name: retention_counts
-- What deleting the threads $1 deletes with them.
SELECT cardinality($1::uuid[]) AS threads,
    (SELECT count(*) FROM messages WHERE thread_id = ANY($1::uuid[])) AS messages,
    (SELECT count(*) FROM runs WHERE thread_id = ANY($1::uuid[])) AS runs,
    (SELECT count(*) FROM cards WHERE thread_id = ANY($1::uuid[])) AS cards,
    (SELECT count(*) FROM cards WHERE thread_id = ANY($1::uuid[])
        AND status IN ('executed', 'failed')) AS audited;

-- name: retention_audit
-- The audit of the cards of threads $1 that reached the provider (executed or failed):
-- the card as decided and every transition, for the JSONL export.
SELECT c.id::text AS id, c.tenant, c.owner, c.tool, c.thread_id::text AS thread_id,
    c.run_id::text AS run_id, c.risk, c.args_snapshot, c.summary, c.impact, c.snapshot_hash,
    c.operation_id::text AS operation_id, c.status, c.decided_at, c.decided_by, c.channel,
    c.result, c.needs_reconciliation, c.created_at,
    (SELECT coalesce(jsonb_agg(jsonb_build_object('id', e.id, 'from', e.from_status,
        'to', e.to_status, 'actor', e.actor, 'channel', e.channel, 'hash_seen', e.hash_seen,
        'at', e.at, 'detail', e.detail) ORDER BY e.id), '[]'::jsonb)
     FROM card_events e WHERE e.card_id = c.id) AS events
FROM cards c
WHERE c.thread_id = ANY($1::uuid[]) AND c.status IN ('executed', 'failed')
ORDER BY c.created_at, c.id;

-- name: retention_delete
-- The threads $1 and, by ON DELETE CASCADE, their messages, runs, cards, card events,
-- operations, interrupts, refusals and WhatsApp contacts.
DELETE FROM threads WHERE id = ANY($1::uuid[]);

-- name: retention_dry_run
-- What retention_pick would find without a limit, counted (no lock taken, nothing changed).
WITH doomed AS (
    SELECT t.id FROM threads t
    WHERE (($1::text IS NULL AND NOT (t.tenant = ANY($3::text[]))) OR t.tenant = $1)
        AND t.created_at < now() - make_interval(secs => $2::float8)
        AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.thread_id = t.id
            AND m.seq = t.last_seq AND m.created_at >= now() - make_interval(secs => $2::float8))
        AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.id
            AND r.status IN ('running', 'waiting'))
        AND NOT EXISTS (SELECT 1 FROM cards c WHERE c.thread_id = t.id
            AND c.status IN ('pending', 'approved', 'executing'))
)
SELECT (SELECT count(*) FROM doomed) AS threads,
    (SELECT count(*) FROM messages WHERE thread_id IN (SELECT id FROM doomed)) AS messages,
    (SELECT count(*) FROM runs WHERE thread_id IN (SELECT id FROM doomed)) AS runs,
    (SELECT count(*) FROM cards WHERE thread_id IN (SELECT id FROM doomed)) AS cards,
    (SELECT count(*) FROM cards WHERE thread_id IN (SELECT id FROM doomed)
        AND status IN ('executed', 'failed')) AS audited;

-- name: retention_outbound_delete
-- Up to $3 finished WhatsApp outbound rows (sent, failed or skipped) of the rule's tenants
-- ($1 and $4 as in retention_pick) made before now() - $2 seconds, oldest first; how many
-- went. A row still 'claimed' (being sent, or waiting for another gateway's courier to
-- take it over) is never deleted; a row another prune holds is skipped. A finished row is
-- no longer needed: the contact's cursor (sent_seq) moved past its entry when it was
-- claimed, and a direct reply's inbound delivery is deduplicated by `deliveries`. Deleted
-- by ctid, as in retention_deliveries_delete.
WITH doomed AS (
    SELECT ctid FROM wa_outbound
    WHERE status IN ('sent', 'failed', 'skipped')
        AND (($1::text IS NULL AND NOT (tenant = ANY($4::text[]))) OR tenant = $1)
        AND created_at < now() - make_interval(secs => $2::float8)
    ORDER BY created_at LIMIT $3
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM wa_outbound o WHERE o.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
      AND o.status IN ('sent', 'failed', 'skipped')
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: retention_outbound_dry_run
-- How many rows retention_outbound_delete would find without a limit ($1..$3 as in
-- retention_dry_run).
SELECT count(*) FROM wa_outbound
WHERE status IN ('sent', 'failed', 'skipped')
    AND (($1::text IS NULL AND NOT (tenant = ANY($3::text[]))) OR tenant = $1)
    AND created_at < now() - make_interval(secs => $2::float8);

-- name: retention_deliveries_delete
-- Up to $2 channel delivery ids received before now() - $1 seconds, oldest first; how many
-- went. They carry no tenant: the caller picks the window (never under Meta's 7 days of
-- redelivery, runtime/retention.py). A row another prune holds is skipped. The rows locked
-- are deleted by their ctid (a TID scan; a join on the key was planned as a hash join over
-- the whole table, every batch).
WITH doomed AS (
    SELECT ctid FROM deliveries
    WHERE received_at < now() - make_interval(secs => $1::float8)
    ORDER BY received_at LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM deliveries d WHERE d.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: retention_deliveries_dry_run
SELECT count(*) FROM deliveries WHERE received_at < now() - make_interval(secs => $1::float8);

-- name: retention_lease_take
-- One scheduled prune at a time across the workers: a leased row, taken by holder $1 for
-- $2 seconds when free or lapsed (a killed pruner's lease lapses). Not a session advisory
-- lock: behind PgBouncer in transaction mode a session lock would stay on a server
-- connection nobody owns.
INSERT INTO retention_lease (name, holder, until)
VALUES ('prune', $1, now() + make_interval(secs => $2))
ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until
WHERE retention_lease.until < now()
RETURNING holder;

-- name: retention_lease_give
DELETE FROM retention_lease WHERE name = 'prune' AND holder = $1;

-- == operators (store/operator.py, `signoff cards`) ======================================

-- name: cards_find
-- `signoff cards list`: newest first; every filter optional (NULL): status $1, thread $2,
-- tool $3, created more than $4 seconds ago, created less than $5 seconds ago; $6 at most;
-- $7 true: only cards flagged for reconciliation.
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at
FROM cards
WHERE ($1::text IS NULL OR status = $1) AND ($2::uuid IS NULL OR thread_id = $2)
    AND ($3::text IS NULL OR tool = $3)
    AND ($4::float8 IS NULL OR created_at < now() - make_interval(secs => $4))
    AND ($5::float8 IS NULL OR created_at >= now() - make_interval(secs => $5))
    AND (NOT $7::bool OR needs_reconciliation)
ORDER BY created_at DESC, id LIMIT $6;

-- name: card_ids_between
-- Card ids in [$1, $2] (a prefix's range on the primary key), at most $3.
SELECT id::text FROM cards WHERE id BETWEEN $1::uuid AND $2::uuid ORDER BY id LIMIT $3;

-- name: thread_ids_between
SELECT id::text FROM threads WHERE id BETWEEN $1::uuid AND $2::uuid ORDER BY id LIMIT $3;

-- name: run_ids_between
-- Workflow run and agent run ids in [$1, $2] (`signoff runs show` by prefix), at most $3.
(SELECT id::text FROM workflow_runs WHERE id BETWEEN $1::uuid AND $2::uuid ORDER BY id LIMIT $3)
UNION ALL
(SELECT id::text FROM runs WHERE id BETWEEN $1::uuid AND $2::uuid ORDER BY id LIMIT $3);

-- name: card_decide_batch
-- generated by scripts/generate_queries.py: edit it there, then run the script
-- Group commit of card_decide_logged (store/group.py): per decision (arrays, one
-- element each) $1 card, $2 approved|rejected, $3 principal, $4 channel, $5 reason,
-- $6 the hash shown, $7 tenant, $8 the tools served (comma-separated; NULL: any).
-- Card ids distinct; one row per card decided, with its position ``ord`` (from 1).
WITH req AS MATERIALIZED (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::text[])
        WITH ORDINALITY AS r(card_id, dst, principal, r_channel, r_reason, hash, r_tenant,
                             tools, ord)
),
lk AS MATERIALIZED (
    SELECT threads.id AS locked FROM threads
    WHERE threads.id IN (SELECT cards.thread_id FROM cards WHERE cards.id = ANY ($1::uuid[]))
    ORDER BY threads.id FOR NO KEY UPDATE
),
c AS (
    UPDATE cards
    SET status = req.dst, decided_at = now(), decided_by = req.principal,
        channel = req.r_channel, reason = req.r_reason
    FROM lk, req
    WHERE cards.id = ANY ($1::uuid[]) AND cards.id = req.card_id
      AND lk.locked = cards.thread_id AND cards.status = 'pending' AND cards.owner = req.principal AND cards.snapshot_hash = req.hash
      AND cards.expires_at > now() AND (req.r_tenant IS NULL OR cards.tenant = req.r_tenant)
      AND (req.tools IS NULL OR cards.tool = ANY (string_to_array(req.tools, ',')))
    RETURNING cards.*, req.*, jsonb_build_object(
        'id', cards.id,
        'thread_id', cards.thread_id,
        'run_id', cards.run_id,
        'tenant', cards.tenant,
        'owner', cards.owner,
        'tool', cards.tool,
        'risk', cards.risk,
        'args_snapshot', cards.args_snapshot,
        'summary', cards.summary,
        'impact', cards.impact,
        'snapshot_hash', cards.snapshot_hash,
        'request_key', cards.request_key,
        'operation_id', cards.operation_id,
        'status', cards.status,
        'tool_use_id', cards.tool_use_id,
        'input', cards.input,
        'decided_by', cards.decided_by,
        'channel', cards.channel,
        'reason', cards.reason,
        'superseded_by', cards.superseded_by,
        'result', cards.result,
        'needs_reconciliation', cards.needs_reconciliation,
        'expires_at', CASE WHEN cards.expires_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.expires_at)::bigint % 1000000 = 0
            THEN to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'created_at', CASE WHEN cards.created_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.created_at)::bigint % 1000000 = 0
            THEN to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'decided_at', CASE WHEN cards.decided_at IS NULL THEN NULL
            WHEN date_part('microseconds', cards.decided_at)::bigint % 1000000 = 0
            THEN to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(cards.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
        'editable', to_jsonb(cards.editable)
    ) AS body
),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, 'pending', status, principal, r_channel, hash,
        CASE WHEN coalesce(r_reason, '') = '' THEN '{}'::jsonb
             ELSE jsonb_build_object('reason', r_reason) END
    FROM c
),
n AS (
    SELECT c.thread_id AS n_thread, count(*) AS k FROM c GROUP BY c.thread_id
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + n.k FROM n WHERE threads.id = n.n_thread
    RETURNING threads.id AS t_thread, threads.last_seq AS t_last, n.k AS t_k
),
s AS (
    SELECT c.id AS s_card, t.t_thread AS s_thread,
        t.t_last - t.t_k + row_number() OVER (PARTITION BY c.thread_id ORDER BY c.ord) AS s_seq
    FROM c JOIN t ON t.t_thread = c.thread_id
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT s.s_thread, s.s_seq, c.run_id, 'card_update', c.body FROM s JOIN c ON c.id = s.s_card
    RETURNING thread_id AS m_thread, seq AS m_seq, created_at AS log_at
)
SELECT id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at,
    c.body, s.s_seq AS log_seq, m.log_at, c.ord,
    (SELECT worker_id FROM runs WHERE runs.id = c.run_id) AS holder
FROM c JOIN s ON s.s_card = c.id JOIN m ON m.m_thread = s.s_thread AND m.m_seq = s.s_seq;
