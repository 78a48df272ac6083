-- What upstreams send is stored exactly (issue 11): JSONB refuses NUL (\u0000), and a parsed
-- JSON value rounds integers beyond 2^53 and loses key order and duplicates.
--
-- The idempotency row keeps the rendered /route response as the bytes first sent (a JSON
-- document), so a replay is byte-identical to the first answer.
ALTER TABLE idempotency_keys
    ALTER COLUMN response_body TYPE BYTEA USING convert_to(response_body::text, 'UTF8');

-- The chosen requirement and the 402's context, exactly as the router signed them (the
-- JSONB columns beside them keep a NUL-free copy for queries). NULL for intents written
-- before this migration: their JSONB columns are exact.
ALTER TABLE payments ADD COLUMN requirement_json BYTEA, ADD COLUMN context_json BYTEA;
