-- 0004: the per-user quotas' counts (gateway/quotas.py) read indexes, not tables.
-- Threads a user created in the last minute; runs of a user that are `running`.
CREATE INDEX threads_owner_created ON threads (tenant, owner, created_at);
CREATE INDEX runs_owner_running ON runs (tenant, owner) WHERE status = 'running';
