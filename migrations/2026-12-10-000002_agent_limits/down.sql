DROP TABLE router_settings;
DROP TABLE agent_rate_windows;
ALTER TABLE agents
    DROP COLUMN month_budget,
    DROP COLUMN allowed_hosts,
    DROP COLUMN allowed_pay_to,
    DROP COLUMN calls_per_minute,
    DROP COLUMN payments_per_minute;
