-- The payment intent ledger: one row per (agent, idempotency key) that the router
-- signed a payment for. Written (status 'signed') BEFORE the paid request leaves, so a
-- takeover always knows what was signed; finalised in the same transaction as the
-- receipt and the idempotency transition.
CREATE TABLE payments (
    id                UUID PRIMARY KEY,
    agent_id          UUID NOT NULL REFERENCES agents (id),
    idempotency_key   TEXT NOT NULL,
    x402_version      SMALLINT NOT NULL CHECK (x402_version IN (1, 2)),
    scheme            TEXT NOT NULL,
    network           TEXT NOT NULL,
    asset             TEXT NOT NULL,
    amount            NUMERIC(78, 0) NOT NULL CHECK (amount > 0),
    pay_to            TEXT NOT NULL,
    payer             TEXT NOT NULL,
    nonce             TEXT NOT NULL,
    valid_after       BIGINT NOT NULL,
    valid_before      BIGINT NOT NULL,
    -- The chosen requirement verbatim and the 402's context (resource, extensions).
    requirement       JSONB NOT NULL,
    context           JSONB NOT NULL,
    -- The signed authorization and the exact header sent (a bearer instrument until
    -- valid_before: never logged, never served by the API).
    signed_authorization JSONB NOT NULL,
    header_name       TEXT NOT NULL,
    header_value      TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN (
                          'signed', 'settled', 'unconfirmed', 'not_settled', 'rejected',
                          'settled_response_lost', 'unknown')),
    tx_hash           TEXT,
    error             TEXT,
    attempts          INTEGER NOT NULL DEFAULT 1,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (agent_id, idempotency_key),
    -- The token allows one use of a nonce per payer; so does the ledger.
    UNIQUE (network, asset, payer, nonce)
);
CREATE INDEX payments_status_idx ON payments (status, updated_at);
