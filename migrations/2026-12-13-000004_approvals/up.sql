-- A human in the loop (issue 42, item 1; docs/DESIGN.md §8):
--   agents.approval_above   a paid call whose price is above it waits for an operator's
--                           decision (atomic units; NULL: never)
--   approvals               one row per payment held for a decision, tied to the call's
--                           (agent, Idempotency-Key, request): the terms asked (network,
--                           asset, amount, payTo, the upstream URL as shown), its state and
--                           who decided. 'pending' past expires_at reads as expired (the
--                           database's clock decides, on every router alike).
ALTER TABLE agents
    ADD COLUMN approval_above NUMERIC(78, 0) CHECK (approval_above >= 0);

CREATE TABLE approvals (
    id UUID PRIMARY KEY,
    agent_id UUID NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    idempotency_key TEXT NOT NULL CHECK (char_length(idempotency_key) <= 128),
    request_hash TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'denied')),
    network TEXT NOT NULL,
    asset TEXT NOT NULL,
    amount NUMERIC(78, 0) NOT NULL CHECK (amount >= 0),
    pay_to TEXT NOT NULL,
    upstream_url TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL,
    decided_at TIMESTAMPTZ,
    decided_by TEXT,
    decided_by_id UUID,
    CHECK ((state = 'pending') = (decided_at IS NULL))
);
-- At most one open request per key: two attempts of one call cannot open two.
CREATE UNIQUE INDEX approvals_open ON approvals (agent_id, idempotency_key) WHERE state = 'pending';
CREATE INDEX approvals_key ON approvals (agent_id, idempotency_key, created_at);
CREATE INDEX approvals_queue ON approvals (state, created_at);
