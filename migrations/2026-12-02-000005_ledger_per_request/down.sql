DROP INDEX payments_agent_open_idx;
ALTER TABLE payments DROP CONSTRAINT payments_agent_key_request_key;
-- Only the newest intent of a key survives the way back (the old schema kept one per key).
DELETE FROM payments p USING payments q
 WHERE p.agent_id = q.agent_id AND p.idempotency_key = q.idempotency_key
   AND (p.created_at, p.id) < (q.created_at, q.id);
ALTER TABLE payments ADD CONSTRAINT payments_agent_id_idempotency_key_key UNIQUE (agent_id, idempotency_key);
ALTER TABLE payments DROP COLUMN request_hash;
