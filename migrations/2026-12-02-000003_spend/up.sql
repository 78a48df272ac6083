-- Spend control: a payment intent is the agent's reservation. It counts against the
-- rolling 24 h budget from the moment it is committed (before the signature leaves the
-- router) unless its final state says no money can move: not_settled, rejected, or
-- expired (unused past validBefore, found by `x402-router reconcile`).
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check CHECK (status IN (
    'signed', 'settled', 'unconfirmed', 'not_settled', 'rejected',
    'settled_response_lost', 'unknown', 'expired'));
CREATE INDEX payments_agent_created_idx ON payments (agent_id, created_at);
