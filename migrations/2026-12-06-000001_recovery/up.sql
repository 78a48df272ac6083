-- Recovering a paid answer that was lost (issue 16). Everything a takeover or `reconcile`
-- needs to ask the upstream again, without signing anything, is committed with the intent,
-- before the paid request leaves:
--   the request exactly as sent (method, full URL, the agent's headers as a JSON array of
--   [name, value] pairs, the body bytes; NULL body: none was sent), and
--   the extensions the 402 advertised, as the exact JSON bytes (NULL: none advertised).
-- All NULL for intents written before this migration: they are never re-sent.
ALTER TABLE payments
    ADD COLUMN request_method TEXT,
    ADD COLUMN request_url TEXT,
    ADD COLUMN request_headers BYTEA,
    ADD COLUMN request_body BYTEA,
    ADD COLUMN advertised_extensions BYTEA;

-- What recovery did for a payment the chain shows used while its answer was lost, as
-- {"outcome": …, "attempts": [ … ]}: outcome
--   recovered  - the upstream gave back the original answer (payment-identifier cache);
--   reaccessed - a new execution reached with the payer's sign-in (SIWX);
--   lost       - nothing could be recovered (settled, response lost);
-- attempts lists what was sent and what came back, for operators. One column (the table
-- stays within diesel's 32 columns).
ALTER TABLE payments
    ADD COLUMN recovery JSONB
        CHECK (recovery IS NULL OR recovery->>'outcome' IN ('recovered', 'reaccessed', 'lost'));
