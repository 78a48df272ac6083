-- When the intent's current authorization was signed (issue 22): set on insert and on every
-- re-signing. The rolling 24 h budget counts a spent payment by this time (and by its
-- validBefore, the last moment it could move money), never by the row's creation: a
-- payment first signed long ago, expired unused and re-signed now, is spent now.
-- Rows written before this column: a re-signed row (attempts > 1) takes its last write, an
-- upper bound of its last signing (counting longer is the safe side); the others their creation.
ALTER TABLE payments ADD COLUMN signed_at TIMESTAMPTZ;
UPDATE payments SET signed_at = CASE WHEN attempts > 1 THEN updated_at ELSE created_at END;
ALTER TABLE payments ALTER COLUMN signed_at SET NOT NULL, ALTER COLUMN signed_at SET DEFAULT now();
CREATE INDEX payments_agent_signed_at ON payments (agent_id, signed_at);
