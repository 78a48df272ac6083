ALTER TABLE payments DROP COLUMN upstream_host;
ALTER TABLE router_settings DROP COLUMN blocked_pay_to;
ALTER TABLE agents
    DROP COLUMN week_budget,
    DROP COLUMN lifetime_budget,
    DROP COLUMN host_budgets,
    DROP COLUMN blocked_pay_to;
