-- 0020: the seconds of a WhatsApp number's recent texts passed on as messages (the last
-- 20, newest last), beside the newest (0019). A "sim" is not about a card sent before a
-- text written *before the "sim"*; the newest alone could not say that: a text written
-- after the "sim" (delivered during its settle wait) turned a genuine approval into a
-- message (a review).
ALTER TABLE wa_contacts ADD COLUMN text_seconds bigint[] NOT NULL DEFAULT '{}';
