-- 0015: the tokens of begins that must not commit any more (design note 53). A worker
-- whose begin got no answer reads the card back under its thread's lock; finding it
-- still approved, it adds its begin's token here in the same transaction, so that
-- statement, if it is still on its way or waiting on the lock, changes nothing when it
-- runs: "not committed" is then final, not a guess. Every such token is kept (a later
-- lost begin's read-back must not lift an earlier one's fence).
ALTER TABLE cards ADD COLUMN fenced_attempts text[] NOT NULL DEFAULT '{}';
