-- 0012: the WhatsApp courier reads the threads that have something to send, not every
-- contact. Each gateway polls every `whatsapp_poll_seconds` (0.3 s); its claim joined every
-- contact with its log, 0.8 s of Postgres per poll at 200k idle contacts. Now a thread
-- bound to a number is flagged (`threads.wa`, set once, never indexed: the log's appends
-- stay HOT updates), and a trigger on the appends of flagged threads alone (its WHEN
-- reads the new row; other threads never call it) records the thread's last seq in
-- `wa_due`, in the append's own transaction. The claim reads `wa_due` and deletes a row
-- once the contact's cursor has passed its seq (design note 37).
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

UPDATE threads SET wa = true WHERE id IN (SELECT thread_id FROM wa_contacts);
INSERT INTO wa_due (thread_id, seq)
SELECT c.thread_id, t.last_seq FROM wa_contacts c JOIN threads t ON t.id = c.thread_id
WHERE t.last_seq > c.sent_seq;
