DROP INDEX payments_nonce_idx;
ALTER TABLE payments DROP CONSTRAINT payments_agent_nonce_key;
ALTER TABLE payments ADD CONSTRAINT payments_network_asset_payer_nonce_key UNIQUE (network, asset, payer, nonce);
ALTER TABLE payments DROP CONSTRAINT payments_pkey;
ALTER TABLE payments ADD CONSTRAINT payments_pkey PRIMARY KEY (id);

ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_receipt_fkey;
ALTER TABLE receipts DROP CONSTRAINT receipts_pkey;
ALTER TABLE receipts ADD CONSTRAINT receipts_pkey PRIMARY KEY (id);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_receipt_id_fkey
    FOREIGN KEY (receipt_id) REFERENCES receipts (id) ON DELETE SET NULL;
