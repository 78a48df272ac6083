ALTER TABLE payments DROP CONSTRAINT payments_budget_rate_whole, DROP COLUMN budget_num, DROP COLUMN budget_den;
