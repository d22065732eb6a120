-- 0018: a workflow event's own id (`event_id`, chosen by its sender), recorded with what
-- its delivery did in the same transaction: the same id sent again (a provider retrying
-- after a lost answer) is answered what the first did and applies nothing. Without it a
-- retried payment confirmation passed two gates of a loop (a hostile probe).
CREATE TABLE workflow_event_ids (
    run_id        uuid NOT NULL REFERENCES workflow_runs (id) ON DELETE CASCADE,
    event_id      text NOT NULL,
    name          text NOT NULL,
    kept          boolean NOT NULL,
    delivered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, event_id)
);
