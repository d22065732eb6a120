-- 0008: durable workflows (design note 26). A run is a row; a gate is an interrupt row;
-- a parked run holds nothing in a worker's memory. workflow_runs.step is the index of the
-- next step to run (or of the gate the run waits at): a step's completion (its state
-- merge and step + 1) is one UPDATE, so a completed step never runs again. Locks: the
-- run row first, then its interrupts and buffered events.
-- The placeholder interrupts table of 0001 (on agent runs, never written) gives way to
-- the workflow gates'.
DROP TABLE interrupts;

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
