DROP INDEX payments_agent_created_idx;
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check CHECK (status IN (
    'signed', 'settled', 'unconfirmed', 'not_settled', 'rejected',
    'settled_response_lost', 'unknown'));
