-- Limits an operator sets per agent (issue 23), beside max_per_call and daily_budget:
--   month_budget         spent + reserved in the current calendar month (UTC), atomic units
--   allowed_hosts        upstream hosts the agent may call ('api.example.com' or
--                        '*.example.com'); NULL: any host the SSRF guard allows
--   allowed_pay_to       payTo addresses the agent may pay (lowercase hex); NULL: any
--   calls_per_minute     /route calls per minute (paid or not); NULL: no limit
--   payments_per_minute  payments signed per minute; NULL: no limit
ALTER TABLE agents
    ADD COLUMN month_budget NUMERIC(78, 0) CHECK (month_budget >= 0),
    ADD COLUMN allowed_hosts TEXT[] CHECK (cardinality(allowed_hosts) <= 100),
    ADD COLUMN allowed_pay_to TEXT[] CHECK (cardinality(allowed_pay_to) <= 100),
    ADD COLUMN calls_per_minute INTEGER CHECK (calls_per_minute > 0),
    ADD COLUMN payments_per_minute INTEGER CHECK (payments_per_minute > 0);

-- Fixed one-minute windows of counted calls and payments, per agent. A refused call writes
-- nothing here (the increment is conditional); `gc` deletes windows older than an hour.
CREATE TABLE agent_rate_windows (
    agent_id     UUID NOT NULL REFERENCES agents (id),
    kind         TEXT NOT NULL CHECK (kind IN ('call', 'payment')),
    window_start TIMESTAMPTZ NOT NULL,
    count        INTEGER NOT NULL CHECK (count > 0),
    PRIMARY KEY (agent_id, kind, window_start)
);

-- The wallet-wide settings: one row. `paused` refuses every new payment (and, with
-- `pause_unpaid`, every new call); `wallet_daily_cap` bounds what all agents together may
-- spend and reserve in a rolling 24 h (the same window as an agent's daily budget).
CREATE TABLE router_settings (
    id               BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    paused           BOOLEAN NOT NULL DEFAULT FALSE,
    pause_unpaid     BOOLEAN NOT NULL DEFAULT FALSE,
    wallet_daily_cap NUMERIC(78, 0) CHECK (wallet_daily_cap >= 0),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO router_settings (id) VALUES (TRUE);
