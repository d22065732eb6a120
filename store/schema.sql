-- signoff canonical schema: what replaying every migration must produce (tests/integration/test_migrations.py).

CREATE TABLE threads (
    id          uuid PRIMARY KEY,
    tenant      text NOT NULL,
    owner       text NOT NULL,
    last_seq    bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The thread log: conversation turns (user / assistant / tool_results) and the
-- events clients see (card, card_update, run, error), one per-thread seq.
CREATE TABLE messages (
    thread_id   uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    seq         bigint NOT NULL,
    run_id      uuid,
    kind        text NOT NULL CHECK (kind IN
                  ('user', 'assistant', 'tool_results', 'card', 'card_update', 'run', 'error')),
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, seq)
);

CREATE TABLE runs (
    id           uuid PRIMARY KEY,
    thread_id    uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    tenant       text NOT NULL,
    owner        text NOT NULL,
    role         text NOT NULL DEFAULT 'user',
    status       text NOT NULL CHECK (status IN ('running', 'waiting', 'done', 'failed', 'superseded')),
    worker_id    text,
    state        jsonb NOT NULL DEFAULT '{}'::jsonb,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
-- At most one active run per thread, across every worker.
CREATE UNIQUE INDEX runs_one_active_per_thread ON runs (thread_id)
    WHERE status IN ('running', 'waiting');
CREATE INDEX runs_holder ON runs (worker_id) WHERE status IN ('running', 'waiting');

-- A run is held by runs.worker_id while that worker's lease is in the future: renewing
-- is one row per worker, however many runs it holds.
CREATE TABLE workers (
    id           text PRIMARY KEY,
    lease_until  timestamptz NOT NULL
);

CREATE TABLE cards (
    id                    uuid PRIMARY KEY,
    thread_id             uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    run_id                uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    tenant                text NOT NULL,
    owner                 text NOT NULL,
    tool                  text NOT NULL,
    tool_use_id           text NOT NULL DEFAULT '',
    risk                  text NOT NULL CHECK (risk IN ('read', 'reversible', 'critical')),
    input                 jsonb NOT NULL DEFAULT '{}'::jsonb,
    args_snapshot         jsonb NOT NULL,
    summary               text NOT NULL,
    impact                jsonb NOT NULL,
    snapshot_hash         text NOT NULL,
    request_key           text NOT NULL UNIQUE,
    operation_id          uuid NOT NULL UNIQUE,
    editable              text[] NOT NULL DEFAULT '{}',
    status                text NOT NULL CHECK (status IN
                            ('pending', 'approved', 'rejected', 'expired', 'superseded', 'modified',
                             'invalidated', 'executing', 'executed', 'failed')),
    expires_at            timestamptz NOT NULL,
    decided_at            timestamptz,
    decided_by            text,
    channel               text,
    reason                text,
    superseded_by         uuid REFERENCES cards (id),
    result                jsonb,
    executing_since       timestamptz,
    needs_reconciliation  boolean NOT NULL DEFAULT false,
    created_at            timestamptz NOT NULL DEFAULT now(),
    fenced_attempts       text[] NOT NULL DEFAULT '{}'  -- begins that must not commit (0015)
);
CREATE INDEX cards_run ON cards (run_id);
CREATE INDEX cards_pending_expiry ON cards (expires_at) WHERE status = 'pending';
CREATE INDEX cards_thread_pending ON cards (thread_id) WHERE status = 'pending';
CREATE INDEX cards_approved ON cards (decided_at) WHERE status = 'approved';

CREATE TABLE card_events (
    id           bigserial PRIMARY KEY,
    card_id      uuid NOT NULL REFERENCES cards (id) ON DELETE CASCADE,
    from_status  text,
    to_status    text NOT NULL,
    actor        text NOT NULL,
    channel      text,
    hash_seen    text,
    at           timestamptz NOT NULL DEFAULT now(),
    detail       jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX card_events_card ON card_events (card_id, id);

CREATE TABLE operations (
    operation_id  uuid PRIMARY KEY,
    card_id       uuid NOT NULL UNIQUE REFERENCES cards (id) ON DELETE CASCADE,
    tool          text NOT NULL,
    status        text NOT NULL CHECK (status IN ('started', 'succeeded', 'failed')),
    result        jsonb,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);

-- A channel delivery (a WhatsApp message id): claimed until `claimed_until` by the request
-- handling it, `handled` once its effect committed, `effect` what its first handling chose
-- when that depends on the moment (replayed by a redelivery; design note 64).
CREATE TABLE deliveries (
    channel      text NOT NULL,
    message_id   text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    handled      boolean NOT NULL DEFAULT false,
    claimed_until timestamptz,
    effect       text,
    PRIMARY KEY (channel, message_id)
);

-- Per-user quotas (gateway/quotas.py): threads created in the last minute, runs in flight.
CREATE INDEX threads_owner_created ON threads (tenant, owner, created_at);
CREATE INDEX runs_owner_running ON runs (tenant, owner) WHERE status = 'running';

-- Which live process serves which app (runtime/presence.py): gateways and workers of one
-- app agree on its tools; a worker hands a run to one that serves the card's tool.
CREATE TABLE app_processes (
    id           text PRIMARY KEY,
    app          text NOT NULL,
    fingerprint  text NOT NULL,
    tools        jsonb NOT NULL,
    roles        text[] NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    seen_at      timestamptz NOT NULL DEFAULT now(),
    bus          text NOT NULL DEFAULT ''  -- Redis location and key prefix (migration 0013)
);

-- This database's own random id (migration 0014): what an app's processes claim their
-- Redis key prefix with (runtime/prefix_owner.py).
CREATE TABLE signoff_installation (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    one         boolean NOT NULL DEFAULT true UNIQUE CHECK (one),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The WhatsApp channel (migration 0006, gateway/channels/whatsapp).
CREATE TABLE wa_contacts (
    tenant           text NOT NULL,
    wa_id            text NOT NULL,
    thread_id        uuid NOT NULL UNIQUE REFERENCES threads (id) ON DELETE CASCADE,
    last_inbound_at  timestamptz,
    sent_seq         bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- Meta's second of the newest text of the number passed on as a message (0019)
    last_text_sent   bigint,
    -- ... and of its last 20 such texts, newest last (0020)
    text_seconds     bigint[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant, wa_id)
);

CREATE TABLE wa_outbound (
    key         text PRIMARY KEY,
    tenant      text NOT NULL,
    wa_id       text NOT NULL,
    thread_id   uuid,
    seq         bigint,
    kind        text NOT NULL,
    status      text NOT NULL DEFAULT 'claimed' CHECK (status IN ('claimed', 'sent', 'failed', 'skipped')),
    claimed_by  text NOT NULL,
    attempts    integer NOT NULL DEFAULT 0,
    error       text,
    wa_message  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz,
    claimed_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX wa_outbound_failed ON wa_outbound (created_at) WHERE status = 'failed';
CREATE INDEX wa_outbound_claimed ON wa_outbound (claimed_at) WHERE status = 'claimed';

CREATE TABLE card_refusals (
    id       bigserial PRIMARY KEY,
    card_id  uuid NOT NULL REFERENCES cards (id) ON DELETE CASCADE,
    actor    text NOT NULL,
    channel  text NOT NULL,
    reason   text NOT NULL,
    detail   jsonb NOT NULL DEFAULT '{}'::jsonb,
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX card_refusals_card ON card_refusals (card_id, id);

-- Durable workflows (0008, design note 26): runs, their interrupts (gates), early events.
CREATE TABLE workflow_runs (
    id          uuid PRIMARY KEY,
    tenant      text NOT NULL,
    owner       text NOT NULL,
    app         text NOT NULL,
    workflow    text NOT NULL,
    status      text NOT NULL CHECK (status IN ('running', 'awaiting_human', 'awaiting_event', 'completed', 'failed', 'cancelled')),
    step        integer NOT NULL DEFAULT 0,
    state       jsonb NOT NULL DEFAULT '{}'::jsonb,
    input       jsonb,
    steps       jsonb NOT NULL DEFAULT '[]'::jsonb,
    worker_id   text,
    error       text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflow_runs_running ON workflow_runs (worker_id) WHERE status = 'running';
CREATE INDEX workflow_runs_owner ON workflow_runs (tenant, owner, created_at DESC);
CREATE INDEX workflow_runs_recent ON workflow_runs (updated_at DESC);

CREATE TABLE interrupts (
    id                uuid PRIMARY KEY,
    run_id            uuid NOT NULL REFERENCES workflow_runs (id) ON DELETE CASCADE,
    step              integer NOT NULL,
    step_name         text NOT NULL,
    kind              text NOT NULL CHECK (kind IN ('human', 'event')),
    reason            text,
    schema            jsonb NOT NULL,
    event             text,
    deadline          timestamptz,
    timeout_response  jsonb,
    status            text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved', 'timed_out', 'cancelled')),
    payload           jsonb,
    resolved_by       text,
    resolved_at       timestamptz,
    automatic         boolean NOT NULL DEFAULT false,
    detail            jsonb,
    reenter           boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX interrupts_one_open ON interrupts (run_id) WHERE status = 'open';
CREATE INDEX interrupts_of_run ON interrupts (run_id, created_at);
CREATE INDEX interrupts_deadline ON interrupts (deadline) WHERE status = 'open' AND deadline IS NOT NULL;

-- Events delivered before their run reached a gate with a lookback: kept, consumed (once)
-- by the gate if they arrived within its window.
CREATE TABLE workflow_events (
    id            uuid PRIMARY KEY,
    run_id        uuid NOT NULL REFERENCES workflow_runs (id) ON DELETE CASCADE,
    name          text NOT NULL,
    payload       jsonb NOT NULL,
    delivered_by  text NOT NULL,
    delivered_at  timestamptz NOT NULL DEFAULT now(),
    consumed_at   timestamptz
);
CREATE INDEX workflow_events_waiting ON workflow_events (run_id, name, delivered_at) WHERE consumed_at IS NULL;
-- An event's own id (its sender's), with what its delivery did (passed a gate, or kept):
-- the same id again applies nothing (design note 65).
CREATE TABLE workflow_event_ids (
    run_id        uuid NOT NULL REFERENCES workflow_runs (id) ON DELETE CASCADE,
    event_id      text NOT NULL,
    name          text NOT NULL,
    kept          boolean NOT NULL,
    delivered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, event_id)
);
-- Retention (migration 0009, `signoff prune`): ON DELETE CASCADE needs an index on every
-- referencing column; threads are picked oldest first.
CREATE INDEX threads_created ON threads (created_at);
CREATE INDEX runs_thread ON runs (thread_id);
CREATE INDEX cards_thread ON cards (thread_id);
CREATE INDEX cards_superseded_by ON cards (superseded_by) WHERE superseded_by IS NOT NULL;
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
-- Retention of the WhatsApp bookkeeping (migration 0010): deliveries by age, finished
-- outbound rows by age, oldest first.
CREATE INDEX deliveries_received ON deliveries (received_at);
CREATE INDEX wa_outbound_finished ON wa_outbound (created_at)
    WHERE status IN ('sent', 'failed', 'skipped');
-- The sweeps read indexes, not tables (migration 0011, tests/integration/test_query_plans.py):
-- cards stuck in `executing` by how long they have been there.
CREATE INDEX cards_executing ON cards (executing_since)
    WHERE status = 'executing' AND NOT needs_reconciliation;
-- The WhatsApp courier's work list (migration 0012, design note 37): threads bound to a
-- number are flagged, and their appends record the thread's last seq in `wa_due`.
ALTER TABLE threads ADD COLUMN wa boolean NOT NULL DEFAULT false;
CREATE TABLE wa_due (
    thread_id  uuid PRIMARY KEY REFERENCES threads (id) ON DELETE CASCADE,
    seq        bigint NOT NULL
);
CREATE FUNCTION signoff_wa_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO wa_due (thread_id, seq) VALUES (NEW.id, NEW.last_seq)
    ON CONFLICT (thread_id) DO UPDATE SET seq = greatest(wa_due.seq, EXCLUDED.seq);
    RETURN NULL;
END
$$;
CREATE TRIGGER threads_wa_due AFTER UPDATE OF last_seq ON threads
    FOR EACH ROW WHEN (NEW.wa AND NEW.last_seq > OLD.last_seq) EXECUTE FUNCTION signoff_wa_due();
