-- 0002: card transitions in one statement.
-- The thread log's card entries are built by Postgres, in the same statement that moves
-- the card (UPDATE + audit row + log entry), with the JSON a client sees from
-- runtime.cards.Card.public(): the same keys and the same timestamp format
-- (RFC 3339 in UTC, "Z", microseconds only when not zero, as msgspec writes them).

CREATE FUNCTION signoff_ts(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN t IS NULL THEN NULL
        WHEN date_part('microseconds', t)::bigint % 1000000 = 0
            THEN to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
        ELSE to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
    END
$$;

CREATE FUNCTION signoff_card_json(c cards) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object(
        'id', c.id, 'thread_id', c.thread_id, 'run_id', c.run_id, 'tenant', c.tenant,
        'owner', c.owner, 'tool', c.tool, 'risk', c.risk, 'args_snapshot', c.args_snapshot,
        'summary', c.summary, 'impact', c.impact, 'snapshot_hash', c.snapshot_hash,
        'request_key', c.request_key, 'operation_id', c.operation_id, 'status', c.status,
        'expires_at', signoff_ts(c.expires_at), 'created_at', signoff_ts(c.created_at),
        'tool_use_id', c.tool_use_id, 'input', c.input, 'editable', to_jsonb(c.editable),
        'decided_at', signoff_ts(c.decided_at), 'decided_by', c.decided_by,
        'channel', c.channel, 'reason', c.reason, 'superseded_by', c.superseded_by,
        'result', c.result, 'needs_reconciliation', c.needs_reconciliation
    )
$$;
