-- 0016: a channel delivery is claimed for a lease, then marked handled once its effect
-- has committed (design note 64). It was marked seen by its first statement, before it
-- was handled: a gateway killed in between left it seen, and every redelivery of it was
-- answered 200 and dropped (a WhatsApp approval or message lost for good). A claim whose
-- lease lapsed unhandled is taken again by the next redelivery; one still held is
-- answered 503, so Meta sends it again later. Rows from before were handled.
ALTER TABLE deliveries ADD COLUMN handled boolean NOT NULL DEFAULT true;
ALTER TABLE deliveries ALTER COLUMN handled SET DEFAULT false;
ALTER TABLE deliveries ADD COLUMN claimed_until timestamptz;
