-- Budgets across assets of different decimals (issue 42, item 5; docs/DESIGN.md §6). With a
-- budget currency (BUDGET_CURRENCY), each intent records how many budget units one atomic unit
-- of its asset counts, an exact fraction budget_num / budget_den fixed when it was reserved;
-- what it counts against every budget is ceil(amount * budget_num / budget_den) (rounded up,
-- against the spender), whatever its amount later becomes (an upto charge, a reprice).
-- NULL (every intent of a router without a budget currency): it counts its amount, as before.
ALTER TABLE payments
    ADD COLUMN budget_num NUMERIC(78, 0) CHECK (budget_num > 0),
    ADD COLUMN budget_den NUMERIC(78, 0) CHECK (budget_den > 0),
    ADD CONSTRAINT payments_budget_rate_whole CHECK ((budget_num IS NULL) = (budget_den IS NULL));
