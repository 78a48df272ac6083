-- Indexes for the operator surface: the receipt of a payment's key (paid-not-served),
-- and ledger-wide keyset pages of payments.
CREATE INDEX receipts_agent_key_idx ON receipts (agent_id, idempotency_key);
CREATE INDEX payments_created_idx ON payments (created_at, id);
