-- 0015: the token of a begin that must not commit any more (design note 53). A worker
-- whose begin got no answer reads the card back under its thread's lock; finding it
-- still approved, it writes its begin's token here in the same transaction, so that
-- statement, if it is still on its way or waiting on the lock, changes nothing when it
-- runs: "not committed" is then final, not a guess.
ALTER TABLE cards ADD COLUMN fenced_attempt text;
