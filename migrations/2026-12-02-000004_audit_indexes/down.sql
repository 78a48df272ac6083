DROP INDEX payments_created_idx;
DROP INDEX receipts_agent_key_idx;
