CREATE TABLE agent_rate_windows (
    agent_id     UUID NOT NULL REFERENCES agents (id),
    kind         TEXT NOT NULL CHECK (kind IN ('call', 'payment')),
    window_start TIMESTAMPTZ NOT NULL,
    count        INTEGER NOT NULL CHECK (count > 0),
    PRIMARY KEY (agent_id, kind, window_start)
);
DROP TABLE agent_rate_events;
