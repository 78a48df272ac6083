-- Agents: callers of POST /route. Only the sha256 of the API key is stored.
CREATE TABLE agents (
    id            UUID PRIMARY KEY,
    name          TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    api_key_hash  TEXT NOT NULL UNIQUE,
    disabled      BOOLEAN NOT NULL DEFAULT false,
    -- Spend limits in the asset's atomic units (NULL = no limit).
    max_per_call  NUMERIC(78, 0) CHECK (max_per_call >= 0),
    daily_budget  NUMERIC(78, 0) CHECK (daily_budget >= 0),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Receipts: one per routed call that reached the upstream. Kept forever (no FK to the
-- idempotency row, which the GC deletes after 24 h).
CREATE TABLE receipts (
    id                    UUID PRIMARY KEY,
    agent_id              UUID NOT NULL REFERENCES agents (id),
    idempotency_key       TEXT NOT NULL,
    request_hash          TEXT NOT NULL,
    method                TEXT NOT NULL,
    url                   TEXT NOT NULL,
    -- NULL when the upstream's answer never arrived (e.g. paid, then the connection dropped).
    upstream_status       INTEGER,
    upstream_body_sha256  TEXT NOT NULL,
    payment               JSONB,
    outcome               TEXT NOT NULL,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    signer                TEXT NOT NULL,
    signature             TEXT NOT NULL
);
CREATE INDEX receipts_agent_created_idx ON receipts (agent_id, created_at, id);
CREATE INDEX receipts_created_idx ON receipts (created_at, id);

-- The idempotency ledger: the lock for at-most-once execution per (agent, key).
CREATE TABLE idempotency_keys (
    agent_id              UUID NOT NULL REFERENCES agents (id),
    key                   TEXT NOT NULL CHECK (length(key) BETWEEN 16 AND 128),
    request_hash          TEXT NOT NULL,
    status                TEXT NOT NULL CHECK (status IN ('in_flight', 'completed', 'errored')),
    -- Fencing token of the current owner; only the owner's final UPDATE applies.
    lease                 UUID NOT NULL,
    response_status_code  INTEGER,
    response_body         JSONB,
    receipt_id            UUID REFERENCES receipts (id) ON DELETE SET NULL,
    -- Refreshed by the owner's heartbeat and on takeover; the abandonment clock.
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    first_seen_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at          TIMESTAMPTZ,
    takeovers             INTEGER NOT NULL DEFAULT 0,
    expires_at            TIMESTAMPTZ NOT NULL DEFAULT now() + interval '24 hours',
    PRIMARY KEY (agent_id, key),
    CHECK ((status = 'in_flight') = (response_status_code IS NULL))
);
CREATE INDEX idempotency_keys_expires_idx ON idempotency_keys (expires_at);
