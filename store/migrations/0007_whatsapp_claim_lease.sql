-- 0007: a WhatsApp outbound claim has a lease (design note 24). A gateway that died
-- between claiming an entry and sending it leaves the row 'claimed'; once claimed_at is
-- older than SIGNOFF_WHATSAPP_CLAIM_LEASE_SECONDS a live gateway takes it over and sends.
ALTER TABLE wa_outbound ADD COLUMN claimed_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX wa_outbound_claimed ON wa_outbound (claimed_at) WHERE status = 'claimed';
