-- 0005: which live process serves which app (runtime/presence.py). A gateway or worker
-- registers at start and renews its row; one whose row is older than a few beats is gone.
CREATE TABLE app_processes (
    id           text PRIMARY KEY,
    app          text NOT NULL,
    fingerprint  text NOT NULL,
    tools        jsonb NOT NULL,
    roles        text[] NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    seen_at      timestamptz NOT NULL DEFAULT now()
);
