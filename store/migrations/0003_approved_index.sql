-- 0003: the sweeper looks for approved cards nobody started (runtime.worker.sweep_approved).
-- Approved is a state a card leaves within milliseconds: the partial index stays tiny.
CREATE INDEX cards_approved ON cards (decided_at) WHERE status = 'approved';
