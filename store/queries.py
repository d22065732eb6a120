"""Every SQL statement signoff runs, in one place, by name."""

from __future__ import annotations

CARD_COLUMNS = """
    id::text, thread_id::text, run_id::text, tenant, owner, tool, tool_use_id, risk, input,
    args_snapshot, summary, impact, snapshot_hash, request_key, operation_id::text, editable,
    status, expires_at, decided_at, decided_by, channel, reason, superseded_by::text, result,
    needs_reconciliation, created_at
"""

RUN_COLUMNS = """
    id::text, thread_id::text, tenant, owner, role, status, worker_id AS holder, state, error
"""


def _ts(col: str) -> str:
    """A timestamptz as msgspec writes a datetime: RFC 3339 in UTC with "Z", microseconds
    only when not zero (so a card reads the same in the log and in an HTTP answer)."""
    return (
        f"CASE WHEN {col} IS NULL THEN NULL "
        f"WHEN date_part('microseconds', {col})::bigint % 1000000 = 0 "
        f"""THEN to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') """
        f"""ELSE to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END"""
    )


def card_json(t: str) -> str:
    """The card row ``t`` as clients see it (``runtime.cards.Card.public()``), as jsonb.

    Spelled out inline rather than as a SQL function: Postgres does not inline a
    function of a row type, and calling one costs ~0.2 ms per statement here."""
    plain = (
        "id thread_id run_id tenant owner tool risk args_snapshot summary impact snapshot_hash "
        "request_key operation_id status tool_use_id input decided_by channel reason "
        "superseded_by result needs_reconciliation"
    ).split()
    pairs = [f"'{c}', {t}.{c}" for c in plain]
    pairs += [f"'{c}', {_ts(f'{t}.{c}')}" for c in ("expires_at", "created_at", "decided_at")]
    pairs.append(f"'editable', to_jsonb({t}.editable)")
    return f"jsonb_build_object({', '.join(pairs)})"


# Lock order (DESIGN.md §9), the same on every write path: the thread, then the run,
# then cards. A card transition locks its thread first (``thread_lock``), so an approve
# racing a new message in the same thread queues behind it instead of deadlocking.
# FOR NO KEY UPDATE: it does not conflict with the KEY SHARE locks that inserting a row
# referencing the thread takes, as FOR UPDATE would.
def thread_lock(thread_id: str) -> str:
    """A CTE body that locks the thread whose id is the SQL expression ``thread_id``;
    its one column is ``locked``. Used ``AS MATERIALIZED`` and joined by the statement's
    writes, so the lock is taken before any row they change."""
    return f"SELECT threads.id AS locked FROM threads WHERE threads.id = ({thread_id}) FOR NO KEY UPDATE"


def card_thread_lock(card_id: str = "$1") -> str:
    """``thread_lock`` for the thread of the card ``card_id`` (a card's thread never changes)."""
    return thread_lock(f"SELECT cards.thread_id FROM cards WHERE cards.id = {card_id}")


def logged(
    update: str,
    *,
    src: str,
    actor: str,
    channel: str,
    hash_seen: str,
    detail: str,
    also: str = "",
    kind: str = "card_update",
    lock: str | None = None,
) -> str:
    """One statement for one card transition: the conditional ``UPDATE cards ...`` (or the
    proposal's ``INSERT``, with ``kind='card'``; without RETURNING), its ``card_events`` row and its thread-log entry (the card as clients see
    it, built by ``card_json``). Returns the card's columns plus ``body``,
    ``log_seq``, ``log_at`` and ``holder`` (the worker holding the card's run); no row when the update matched nothing, and then nothing
    was written. ``also``: further CTEs over ``c`` (the moved card), e.g. the operation row.
    One statement is one round trip and one implicit transaction: no BEGIN/COMMIT.

    ``update`` joins ``lk`` (``FROM lk WHERE lk.locked = cards.thread_id ...``), the card's
    thread locked first (``lock``; by default the thread of card ``$1``).
    """
    return f"""
WITH lk AS MATERIALIZED ({lock or card_thread_lock()}),
c AS ({update} RETURNING cards.*, {card_json("cards")} AS body),
ev AS (
    INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
    SELECT id, {src}, status, {actor}, {channel}, {hash_seen}, {detail} FROM c
),
t AS (
    UPDATE threads SET last_seq = threads.last_seq + 1 FROM c WHERE threads.id = c.thread_id
    RETURNING threads.id, threads.last_seq
),
m AS (
    INSERT INTO messages (thread_id, seq, run_id, kind, body)
    SELECT t.id, t.last_seq, c.run_id, '{kind}', c.body FROM c JOIN t ON t.id = c.thread_id
    RETURNING seq AS log_seq, created_at AS log_at
){also}
SELECT {CARD_COLUMNS}, c.body, m.log_seq, m.log_at,
       (SELECT worker_id FROM runs WHERE runs.id = c.run_id) AS holder
FROM c, m
"""


MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS signoff_migrations (
    version     text PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""
MIGRATIONS_LOCK = "SELECT pg_advisory_xact_lock(7401553901)"
MIGRATIONS_APPLIED = "SELECT version FROM signoff_migrations"
MIGRATION_RECORD = "INSERT INTO signoff_migrations (version) VALUES ($1)"

THREAD_INSERT = """
INSERT INTO threads (id, tenant, owner) VALUES ($1, $2, $3)
RETURNING id::text, tenant, owner, last_seq, created_at
"""
THREAD_GET = "SELECT id::text, tenant, owner, last_seq, created_at FROM threads WHERE id = $1"
# A thread created for a message that was refused: gone only while nothing was written to
# it (no log entry, no run). The row lock orders it against a worker's start_run.
THREAD_DELETE_EMPTY = """
DELETE FROM threads t WHERE t.id = $1 AND t.last_seq = 0
    AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.id)
"""
THREAD_NEXT_SEQ = "UPDATE threads SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq"

MESSAGE_INSERT = """
INSERT INTO messages (thread_id, seq, run_id, kind, body) VALUES ($1, $2, $3, $4, $5)
RETURNING created_at
"""
MESSAGES_AFTER = """
SELECT seq, run_id::text, kind, body, created_at FROM messages
WHERE thread_id = $1 AND seq > $2 ORDER BY seq LIMIT $3
"""
CONVERSATION = """
SELECT seq, run_id::text, kind, body, created_at FROM messages
WHERE thread_id = $1 AND kind IN ('user', 'assistant', 'tool_results') ORDER BY seq
"""

RUN_SUPERSEDE_ACTIVE = f"""
UPDATE runs SET status = 'superseded', updated_at = now()
WHERE thread_id = $1 AND status IN ('running', 'waiting')
RETURNING {RUN_COLUMNS}
"""
# A new run is held by the worker that starts it: its lease row exists from here on
# (inserted if this worker never renewed, e.g. one driven without its lease loop).
RUN_INSERT = f"""
WITH w AS (
    INSERT INTO workers (id, lease_until) VALUES ($6, now() + make_interval(secs => $7))
    ON CONFLICT (id) DO NOTHING
)
INSERT INTO runs (id, thread_id, tenant, owner, role, status, worker_id)
VALUES ($1, $2, $3, $4, $5, 'running', $6)
RETURNING {RUN_COLUMNS}
"""
RUN_GET = f"SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"
RUN_ACTIVE_FOR_THREAD = f"""
SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = $1 AND status IN ('running', 'waiting')
"""
RUN_SET_STATE = f"""
UPDATE runs SET status = $2, state = $3, error = $4, updated_at = now()
WHERE id = $1 AND status IN ('running', 'waiting') AND ($5::text IS NULL OR worker_id = $5)
RETURNING {RUN_COLUMNS}
"""
# Append entries ($3 kinds, $4 a JSON array of bodies) to an active run's thread and
# set the run's status, state and error, in one statement. No row: the run is no
# longer active (or, with $8, no longer held by that worker), and nothing was written.
RUN_STEP = f"""
WITH lk AS MATERIALIZED ({thread_lock("$2")}),
r AS (
    UPDATE runs SET status = $5, state = $6, error = $7, updated_at = now()
    FROM lk
    WHERE lk.locked = runs.thread_id AND id = $1 AND status IN ('running', 'waiting')
      AND ($8::text IS NULL OR worker_id = $8)
    RETURNING {RUN_COLUMNS}
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
FROM r
"""
# Append one entry while the run is active (the thread, then the run row are locked for it).
RUN_APPEND = f"""
WITH lk AS MATERIALIZED ({thread_lock("$1")}),
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
RETURNING seq, created_at
"""
# A run, its cards (as clients see them) and its thread's conversation, in one read:
# what continuing a parked run needs.
RUN_WITH_CARDS = f"""
SELECT {RUN_COLUMNS},
       (SELECT coalesce(jsonb_agg({card_json("c")} ORDER BY c.created_at, c.id), '[]')
        FROM cards c WHERE c.run_id = runs.id) AS cards,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'thread_id', m.thread_id, 'seq', m.seq, 'run_id', m.run_id, 'kind', m.kind,
                   'body', m.body, 'created_at', m.created_at) ORDER BY m.seq), '[]')
        FROM messages m
        WHERE m.thread_id = runs.thread_id AND m.kind IN ('user', 'assistant', 'tool_results')
       ) AS conversation
FROM runs WHERE id = $1
"""
# Leases are per worker (migration 0002): renewing is one row, however many runs it holds.
WORKER_RENEW = """
INSERT INTO workers (id, lease_until) VALUES ($1, now() + make_interval(secs => $2))
ON CONFLICT (id) DO UPDATE SET lease_until = EXCLUDED.lease_until
"""
# A graceful stop hands the runs back at once and forgets the worker.
RUN_RELEASE = """
WITH r AS (
    UPDATE runs SET worker_id = NULL
    WHERE worker_id = $1 AND status IN ('running', 'waiting')
)
DELETE FROM workers WHERE id = $1
"""
# Take over active runs nobody holds: released ones, and those of workers whose lease
# lapsed (``$4``: also this worker's own, for a restarted worker with a stable id). The
# adopter's own lease is renewed in the same statement. Both arms are index scans on
# runs_holder; a run another adopter took first fails the re-check under its lock (its
# new holder is alive) and is skipped.
RUN_ADOPT = f"""
WITH me AS (
    INSERT INTO workers (id, lease_until) VALUES ($1, now() + make_interval(secs => $2))
    ON CONFLICT (id) DO UPDATE SET lease_until = EXCLUDED.lease_until
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
RETURNING {", ".join("r." + c.strip() for c in RUN_COLUMNS.split(","))}
"""
# Lease rows of workers that are gone and hold nothing any more.
WORKERS_FORGET = """
DELETE FROM workers w
WHERE w.lease_until < now() - make_interval(secs => $1)
  AND NOT EXISTS (
      SELECT 1 FROM runs r WHERE r.worker_id = w.id AND r.status IN ('running', 'waiting')
  )
"""

# A proposal with its audit row and its 'card' log entry, in one statement (I5: nothing
# when the request already has its card).
CARD_PROPOSE = logged(
    """INSERT INTO cards (id, thread_id, run_id, tenant, owner, tool, tool_use_id, risk, input,
                   args_snapshot, summary, impact, snapshot_hash, request_key, operation_id,
                   editable, status, expires_at)
    SELECT $1, lk.locked, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
           'pending', now() + make_interval(secs => $17)
    FROM lk
    ON CONFLICT (request_key) DO NOTHING""",
    src="NULL",
    actor="'system'",
    channel="NULL",
    hash_seen="snapshot_hash",
    detail="'{}'::jsonb",
    kind="card",
    lock=thread_lock("$2::uuid"),
)
CARD_GET = f"SELECT {CARD_COLUMNS} FROM cards WHERE id = $1"
CARD_BY_REQUEST_KEY = f"SELECT {CARD_COLUMNS} FROM cards WHERE request_key = $1"
CARDS_OF_RUN = f"SELECT {CARD_COLUMNS} FROM cards WHERE run_id = $1 ORDER BY created_at, id"
CARDS_PENDING_OF_THREAD = f"""
SELECT {CARD_COLUMNS} FROM cards WHERE thread_id = $1 AND status = 'pending'
ORDER BY created_at, id
"""
CARDS_LIST = f"""
SELECT {CARD_COLUMNS} FROM cards
WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR owner = $2)
ORDER BY created_at DESC LIMIT $3
"""
CARD_DIAGNOSE = f"SELECT {CARD_COLUMNS}, expires_at <= now() AS is_expired FROM cards WHERE id = $1"


# The thread of a card, locked: what a multi-statement transaction on a card takes first.
CARD_LOCK_THREAD = card_thread_lock()
# The deciding update (I3, I7, I2): owner (of this tenant, when given), pending, fresh hash
# and the database's clock.
CARD_DECIDE = f"""
UPDATE cards
SET status = $2, decided_at = now(), decided_by = $3, channel = $4, reason = $5
WHERE id = $1 AND status = 'pending' AND owner = $3 AND snapshot_hash = $6
  AND expires_at > now() AND ($7::text IS NULL OR tenant = $7)
RETURNING {CARD_COLUMNS}
"""
# The same, with its audit row and log entry, in one statement (one round trip).
# $8: the event's detail.
CARD_DECIDE_LOGGED = logged(
    """UPDATE cards
    SET status = $2, decided_at = now(), decided_by = $3, channel = $4, reason = $5
    FROM lk
    WHERE lk.locked = cards.thread_id AND id = $1 AND status = 'pending' AND owner = $3 AND snapshot_hash = $6
      AND expires_at > now() AND ($7::text IS NULL OR tenant = $7)""",
    src="'pending'",
    actor="$3",
    channel="$4",
    hash_seen="$6",
    detail="$8::jsonb",
)
_MOVE = """UPDATE cards
    SET status = $3,
        result = COALESCE($4, result),
        executing_since = CASE WHEN $3 = 'executing' THEN now() ELSE executing_since END,
        decided_at = CASE WHEN $2 = 'pending' THEN COALESCE(decided_at, now())
                          ELSE decided_at END,
        decided_by = CASE WHEN $2 = 'pending' THEN COALESCE(decided_by, $5) ELSE decided_by END
    FROM lk
    WHERE lk.locked = cards.thread_id AND id = $1 AND status = $2"""


def _move_logged(also: str = "") -> str:
    """$1 id, $2 from, $3 to, $4 result, $5 actor, $6 channel, $7 detail (+ ``also``'s)."""
    return logged(
        _MOVE,
        src="$2",
        actor="$5",
        channel="$6::text",
        hash_seen="NULL",
        detail="$7::jsonb",
        also=also,
    )


CARD_MOVE_LOGGED = _move_logged()
# approved -> executing and the operation row, in the same statement (I4).
CARD_BEGIN_EXECUTION = _move_logged(""",
op AS (
    INSERT INTO operations (operation_id, card_id, tool, status)
    SELECT operation_id, id, tool, 'started' FROM c
)""")
# executing -> executed|failed and the operation's outcome ($8), in the same statement.
CARD_FINISH_EXECUTION = _move_logged(""",
op AS (
    UPDATE operations SET status = $8, result = $4, finished_at = now()
    FROM c WHERE operations.operation_id = c.operation_id
)""")
CARD_EXPIRE_LOGGED = logged(
    """UPDATE cards SET status = 'expired', decided_at = now(), decided_by = 'system:expiry'
    FROM lk
    WHERE lk.locked = cards.thread_id AND id = $1 AND status = 'pending'
      AND expires_at <= now()""",
    src="'pending'",
    actor="'system:expiry'",
    channel="NULL",
    hash_seen="NULL",
    detail="'{}'::jsonb",
)

CARDS_OVERDUE = """
SELECT id::text FROM cards WHERE status = 'pending' AND expires_at <= now()
ORDER BY expires_at LIMIT $1
"""
CARDS_STUCK_EXECUTING = f"""
UPDATE cards SET needs_reconciliation = true
WHERE status = 'executing' AND NOT needs_reconciliation
  AND executing_since < now() - make_interval(secs => $1)
RETURNING {CARD_COLUMNS}
"""
CARD_RECONCILE_FLAG = "UPDATE cards SET needs_reconciliation = $2 WHERE id = $1"

EVENT_INSERT = """
INSERT INTO card_events (card_id, from_status, to_status, actor, channel, hash_seen, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""
EVENTS_OF_CARD = """
SELECT id, card_id::text, from_status, to_status, actor, channel, hash_seen, at, detail
FROM card_events WHERE card_id = $1 ORDER BY id
"""

OPERATION_FINISH = """
UPDATE operations SET status = $2, result = $3, finished_at = now() WHERE operation_id = $1
"""

DELIVERY_INSERT = """
INSERT INTO deliveries (channel, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1
"""

CARDS_DECIDED_AMONG = (
    "SELECT id::text, status FROM cards WHERE id = ANY($1::uuid[]) AND status <> 'pending'"
)
CARDS_APPROVED_OF_RUNS = f"""
SELECT {CARD_COLUMNS} FROM cards WHERE run_id = ANY($1::uuid[]) AND status = 'approved'
ORDER BY created_at, id
"""
# Approved cards not started for $1 seconds, with whether their run is still active
# (partial index cards_approved: approved cards are few and short-lived).
CARDS_APPROVED_STALE = f"""
SELECT {", ".join("c." + col.strip() for col in CARD_COLUMNS.split(","))},
       r.status IN ('running', 'waiting') AS run_active
FROM cards c JOIN runs r ON r.id = c.run_id
WHERE c.status = 'approved' AND c.decided_at < now() - make_interval(secs => $1)
ORDER BY c.decided_at LIMIT $2
"""

# -- per-user quotas (gateway/quotas.py) ------------------------------------------------

# Serialises one user's thread creations (until commit), so the count below sees every
# earlier insert of theirs; other users never wait. A transaction-level lock: released at
# commit or rollback, so it is safe with the pool's no-op reset.
QUOTA_USER_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtext('signoff:quota'), hashtext($1 || '/' || $2))"
)

# A thread ($1) for tenant $2 / owner $3, unless that owner created $4 or more in the last
# $5 seconds. Always one row: the thread's columns (NULL when refused), how many were in
# the window, and the seconds until the oldest of them leaves it.
THREAD_INSERT_WITHIN_QUOTA = """
WITH recent AS (
    SELECT count(*) AS n, min(created_at) AS oldest FROM threads
    WHERE tenant = $2 AND owner = $3 AND created_at > now() - make_interval(secs => $5)
), made AS (
    INSERT INTO threads (id, tenant, owner) SELECT $1, $2, $3 FROM recent WHERE recent.n < $4
    RETURNING id::text, tenant, owner, last_seq, created_at
)
SELECT made.id, made.tenant, made.owner, made.last_seq, made.created_at, recent.n AS recent,
       extract(epoch FROM recent.oldest + make_interval(secs => $5) - now())::float8
           AS retry_after
FROM recent LEFT JOIN made ON true
"""

# Model turns in flight for tenant $1 / owner $2: their runs `running` now, and which of
# the accepted messages' run ids ($3) no worker has started yet. One statement, one
# snapshot: a run starting meanwhile is counted once, as one or the other.
TURNS_IN_FLIGHT = """
SELECT
    (SELECT count(*) FROM runs WHERE tenant = $1 AND owner = $2 AND status = 'running')
        AS running,
    count(a.id) FILTER (WHERE r.id IS NULL) AS queued,
    coalesce(array_agg(a.id::text) FILTER (WHERE r.id IS NOT NULL), '{}') AS started
FROM unnest($3::uuid[]) AS a(id) LEFT JOIN runs r ON r.id = a.id
"""
