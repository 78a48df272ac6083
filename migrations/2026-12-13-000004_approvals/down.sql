DROP TABLE approvals;
ALTER TABLE agents DROP COLUMN approval_above;
