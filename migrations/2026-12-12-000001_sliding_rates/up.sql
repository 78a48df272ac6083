-- Rate limits over a sliding 60 s window (issue 38): one row per counted call or payment.
-- A call or payment is counted only when fewer than the limit were counted in the 60 s
-- before it, decided under a transaction-level advisory lock per (agent, kind), so that
-- routers counting at once count one after another. The calendar-minute windows let a burst
-- straddling a minute boundary pass twice the limit. `gc` deletes events older than the window.
CREATE TABLE agent_rate_events (
    agent_id UUID NOT NULL REFERENCES agents (id),
    kind     TEXT NOT NULL CHECK (kind IN ('call', 'payment')),
    at       TIMESTAMPTZ NOT NULL
);
CREATE INDEX agent_rate_events_recent ON agent_rate_events (agent_id, kind, at DESC);

DROP TABLE agent_rate_windows;
