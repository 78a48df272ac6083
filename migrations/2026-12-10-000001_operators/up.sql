-- Operators (issue 23): named bearer tokens with a role. `viewer` reads (audit, receipts,
-- exports, metrics); `admin` also changes settings. Only the sha256 of a token is stored.
-- A revoked operator stays listed (its events name it) but its token is refused.
CREATE TABLE operators (
    id UUID PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('viewer', 'admin')),
    token_hash TEXT NOT NULL UNIQUE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at TIMESTAMPTZ NULL
);

-- Who changed what: one row per operator change, written in the change's own transaction.
-- Append-only: the trigger below refuses UPDATE, DELETE and TRUNCATE.
CREATE TABLE operator_events (
    id BIGSERIAL PRIMARY KEY,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- NULL: the bootstrap OPERATOR_TOKEN or the command line.
    operator_id UUID NULL,
    operator_name TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NULL,
    before JSONB NULL,
    after JSONB NULL,
    remote_addr TEXT NULL
);

CREATE INDEX operator_events_operator ON operator_events (operator_id, id);
CREATE INDEX operator_events_action ON operator_events (action, id);
CREATE INDEX operator_events_at ON operator_events (at);

CREATE FUNCTION operator_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'operator_events is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER operator_events_no_update_delete
    BEFORE UPDATE OR DELETE ON operator_events
    FOR EACH ROW EXECUTE FUNCTION operator_events_append_only();

CREATE TRIGGER operator_events_no_truncate
    BEFORE TRUNCATE ON operator_events
    FOR EACH STATEMENT EXECUTE FUNCTION operator_events_append_only();
