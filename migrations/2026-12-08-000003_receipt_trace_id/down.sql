ALTER TABLE receipts DROP COLUMN trace_id;
