-- 0014: one random id per database, written once: what the processes of an app claim a
-- Redis key prefix with (runtime/prefix_owner.py). A database's URL does not name it:
-- one database is reached through PgBouncer by some processes and directly by others,
-- as localhost or 127.0.0.1, on a port that changes (signoff dev's embedded Postgres).
CREATE TABLE signoff_installation (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    one boolean NOT NULL DEFAULT true UNIQUE CHECK (one),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO signoff_installation DEFAULT VALUES;
