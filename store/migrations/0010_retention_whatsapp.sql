-- 0010: retention also prunes the WhatsApp channel's bookkeeping (design note 28):
-- `deliveries` (inbound message ids kept for dedup) by when they were received, and the
-- finished rows of `wa_outbound` (sent, failed, skipped; never 'claimed') by when they
-- were made, both oldest first.
CREATE INDEX deliveries_received ON deliveries (received_at);
CREATE INDEX wa_outbound_finished ON wa_outbound (created_at)
    WHERE status IN ('sent', 'failed', 'skipped');
