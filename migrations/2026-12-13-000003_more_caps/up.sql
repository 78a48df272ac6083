-- More limits an operator sets (issue 42, item 3; docs/DESIGN.md §6), beside the others:
--   agents.week_budget      spent in a rolling 7 days (the 24 h budget's counting rule) plus
--                           every reservation, atomic units; NULL: none
--   agents.lifetime_budget  spent ever plus every reservation, atomic units; NULL: none
--   agents.host_budgets     a rolling 24 h budget per upstream host pattern (as allowed_hosts:
--                           'api.example.com', '*.example.org', either with ':port'), a JSON
--                           object {"pattern": "atomic units"}; NULL: none
--   agents.blocked_pay_to   payTo addresses the agent may never pay (as allowed_pay_to:
--                           EVM lowercase, Solana as written); NULL: none
--   router_settings.blocked_pay_to  the same for every agent
--   payments.upstream_host  the host of the paid call, lowercase, with ':port' when the URL
--                           names one (what a host budget counts); written at reservation.
ALTER TABLE agents
    ADD COLUMN week_budget NUMERIC(78, 0) CHECK (week_budget >= 0),
    ADD COLUMN lifetime_budget NUMERIC(78, 0) CHECK (lifetime_budget >= 0),
    ADD COLUMN host_budgets JSONB CHECK (jsonb_typeof(host_budgets) = 'object'),
    ADD COLUMN blocked_pay_to TEXT[] CHECK (cardinality(blocked_pay_to) <= 100);
ALTER TABLE router_settings
    ADD COLUMN blocked_pay_to TEXT[] CHECK (cardinality(blocked_pay_to) <= 100);
ALTER TABLE payments
    ADD COLUMN upstream_host TEXT CHECK (char_length(upstream_host) <= 300);

-- Intents written before this column: the host from the shown URL (its authority as the
-- router serialized it: lowercase, the port only when not the scheme's default), for the
-- rows a host budget can count (every reservation, and what was spent in the last 24 h;
-- two days to be safe). A row left NULL counts against every host budget of its agent.
UPDATE payments
   SET upstream_host = lower(substring(request_url FROM '^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]+)'))
 WHERE upstream_host IS NULL AND request_url IS NOT NULL
   AND status <> 'expired'
   AND (status NOT IN ('settled', 'settled_response_lost')
        OR GREATEST(signed_at, to_timestamp(valid_before)) > now() - interval '2 days');
