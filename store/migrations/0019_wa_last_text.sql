-- 0019: the second (Meta's `timestamp`) of the newest text a WhatsApp number wrote that
-- went on to its agent as a message. Under text confirmation a bare "sim" written after
-- such a text answers what came after it, not a card shown before it: the text
-- supersedes that card once a worker takes it, and until then a "sim" approved the old
-- card (a R$ 25 charge ran for a person who had just asked for another: a hostile probe).
ALTER TABLE wa_contacts ADD COLUMN last_text_sent bigint;
