-- 0017: what a delivery's first handling chose to do with it, when that depends on the
-- moment (a WhatsApp text "sim" under SIGNOFF_WHATSAPP_TEXT_CONFIRM: approve the card
-- shown, or pass it on as a message), written before the effect. A redelivery after
-- the claim lapsed does the same again (design note 64): handled a second time, a
-- "sim" whose card its first handling had approved became a message that superseded the
-- person's newer card (a hostile probe).
ALTER TABLE deliveries ADD COLUMN effect text;
