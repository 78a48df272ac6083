-- Secrets at rest (issue 38; docs/DESIGN.md §10). What an agent forwards (every header, the
-- full URL, the body) and what repeats it (the 402's terms and context, whose `resource`
-- echoes the URL, and the payment header built from them) are written only sealed:
--   sealed         AES-256-GCM of the intent's exact parts (src/secrets/intent.rs), bound to
--                  the row (agent_id, id); NULL once dropped (the payment settled, or older
--                  than SECRETS_RETENTION_HOURS: `gc`);
--   sealed_key_id  the id of the key that sealed it (SECRETS_KEY_FILE, or `wallet`: the key
--                  derived from the wallet key). A key may leave the file once no row names it.
-- Beside them the row keeps what may be shown: request_method, request_url (secret query
-- parameters redacted), and redacted copies in requirement, context, advertised_extensions.
-- The clear columns of earlier versions (request_headers, request_body, header_value,
-- requirement_json, context_json) are written NULL from now on; rows that still hold them
-- are sealed and emptied when `serve` starts (src/secrets/sweep.rs), and emptied by `gc`
-- once nothing can need them.
ALTER TABLE payments
    ADD COLUMN sealed BYTEA,
    ADD COLUMN sealed_key_id TEXT,
    ADD CONSTRAINT payments_sealed_key CHECK ((sealed IS NULL) = (sealed_key_id IS NULL));
ALTER TABLE payments ALTER COLUMN header_value DROP NOT NULL;

-- `gc` finds what to drop, `serve` what to seal, without reading the whole ledger.
CREATE INDEX payments_sealed ON payments (created_at) WHERE sealed IS NOT NULL;
CREATE INDEX payments_plaintext ON payments (created_at, id)
    WHERE request_headers IS NOT NULL OR request_body IS NOT NULL OR header_value IS NOT NULL
       OR requirement_json IS NOT NULL OR context_json IS NOT NULL;

-- The last start-up sweep that redacted shown URLs (receipts, the ledger's copies): with the
-- names it redacted and when it began. A sweep with the same names covers only rows created
-- since (a little before) then; other names redact every row again.
CREATE TABLE secrets_sweep (
    id BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    redacted_names TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL
);
