-- Money safety: the payment ledger is keyed by (agent, idempotency key, request hash), the
-- inputs of the deterministic nonce. A key reused after it expired, for another request, is
-- a new payment with its own intent; the old intents stay as history.
ALTER TABLE payments ADD COLUMN request_hash TEXT;
UPDATE payments p SET request_hash = k.request_hash
  FROM idempotency_keys k WHERE k.agent_id = p.agent_id AND k.key = p.idempotency_key;
UPDATE payments p SET request_hash = r.request_hash
  FROM receipts r
 WHERE p.request_hash IS NULL AND r.agent_id = p.agent_id AND r.idempotency_key = p.idempotency_key;
UPDATE payments SET request_hash = '' WHERE request_hash IS NULL;
ALTER TABLE payments ALTER COLUMN request_hash SET NOT NULL;
ALTER TABLE payments DROP CONSTRAINT payments_agent_id_idempotency_key_key;
ALTER TABLE payments ADD CONSTRAINT payments_agent_key_request_key UNIQUE (agent_id, idempotency_key, request_hash);
-- An authorization counts against the budget until it provably cannot move money, however
-- old it is: the open intents of an agent are summed without a time window.
CREATE INDEX payments_agent_open_idx ON payments (agent_id)
 WHERE status NOT IN ('settled', 'settled_response_lost', 'expired');
