DROP TABLE idempotency_keys;
DROP TABLE receipts;
DROP TABLE agents;
