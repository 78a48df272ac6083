-- Every primary, unique and foreign key of the per-agent tables (idempotency_keys, receipts,
-- payments) leads with agent_id, the distribution column of a Citus-style sharded Postgres:
-- each key can then be enforced inside one shard, and one agent's rows live together.
-- (agents itself is keyed by id = agent_id; sharded, it would be a reference table, so its
-- unique api_key_hash stays.)

-- receipts: (agent_id, id). Receipt ids are random UUIDs, unique on their own; the key now
-- also says whose receipt it is.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_receipt_id_fkey;
ALTER TABLE receipts DROP CONSTRAINT receipts_pkey;
ALTER TABLE receipts ADD CONSTRAINT receipts_pkey PRIMARY KEY (agent_id, id);
-- An idempotency row points at a receipt of the same agent. Deleting a receipt clears only
-- the pointer (Postgres 15+ column list), as before.
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_receipt_fkey
    FOREIGN KEY (agent_id, receipt_id) REFERENCES receipts (agent_id, id) ON DELETE SET NULL (receipt_id);

-- payments: (agent_id, id).
ALTER TABLE payments DROP CONSTRAINT payments_pkey;
ALTER TABLE payments ADD CONSTRAINT payments_pkey PRIMARY KEY (agent_id, id);
-- One intent per (payer, nonce) and token, per agent. The nonce is an HMAC over the agent id,
-- the key and the request hash, so two agents never share one; across agents the token
-- contract itself refuses a second use of a nonce. The lookup index stays for reconcile and
-- operators.
ALTER TABLE payments DROP CONSTRAINT payments_network_asset_payer_nonce_key;
ALTER TABLE payments ADD CONSTRAINT payments_agent_nonce_key UNIQUE (agent_id, network, asset, payer, nonce);
CREATE INDEX payments_nonce_idx ON payments (network, asset, payer, nonce);
