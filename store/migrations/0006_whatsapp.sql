-- 0006: the WhatsApp channel (gateway/channels/whatsapp). A WhatsApp number (wa_id) is a
-- principal with one thread per tenant; its thread log is sent out by whichever gateway
-- claims each entry first (wa_outbound, design note 24). Refused button clicks are kept
-- apart from card_events, which records transitions only.
CREATE TABLE wa_contacts (
    tenant           text NOT NULL,
    wa_id            text NOT NULL,
    thread_id        uuid NOT NULL UNIQUE REFERENCES threads (id) ON DELETE CASCADE,
    last_inbound_at  timestamptz,
    sent_seq         bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, wa_id)
);

CREATE TABLE wa_outbound (
    key         text PRIMARY KEY,
    tenant      text NOT NULL,
    wa_id       text NOT NULL,
    thread_id   uuid,
    seq         bigint,
    kind        text NOT NULL,
    status      text NOT NULL DEFAULT 'claimed' CHECK (status IN ('claimed', 'sent', 'failed', 'skipped')),
    claimed_by  text NOT NULL,
    attempts    integer NOT NULL DEFAULT 0,
    error       text,
    wa_message  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz
);
CREATE INDEX wa_outbound_failed ON wa_outbound (created_at) WHERE status = 'failed';

CREATE TABLE card_refusals (
    id       bigserial PRIMARY KEY,
    card_id  uuid NOT NULL REFERENCES cards (id) ON DELETE CASCADE,
    actor    text NOT NULL,
    channel  text NOT NULL,
    reason   text NOT NULL,
    detail   jsonb NOT NULL DEFAULT '{}'::jsonb,
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX card_refusals_card ON card_refusals (card_id, id);
