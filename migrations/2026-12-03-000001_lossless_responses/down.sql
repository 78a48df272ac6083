ALTER TABLE payments DROP COLUMN requirement_json, DROP COLUMN context_json;

-- Responses JSONB cannot hold (NUL characters) are dropped; their rows keep status and code.
CREATE FUNCTION pg_temp.response_jsonb(b BYTEA) RETURNS JSONB LANGUAGE plpgsql AS $$
BEGIN
    RETURN convert_from(b, 'UTF8')::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;
ALTER TABLE idempotency_keys
    ALTER COLUMN response_body TYPE JSONB USING pg_temp.response_jsonb(response_body);
