DROP INDEX payments_agent_signed_at;
ALTER TABLE payments DROP COLUMN signed_at;
