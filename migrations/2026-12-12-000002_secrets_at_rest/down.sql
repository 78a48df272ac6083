-- Sealed parts cannot be put back in the clear without the key: a downgrade loses them (a
-- takeover or recovery of an intent written by this version then finds nothing to re-send).
DROP TABLE secrets_sweep;
DROP INDEX payments_plaintext;
DROP INDEX payments_sealed;
UPDATE payments SET header_value = '' WHERE header_value IS NULL;
ALTER TABLE payments ALTER COLUMN header_value SET NOT NULL;
ALTER TABLE payments
    DROP CONSTRAINT payments_sealed_key,
    DROP COLUMN sealed_key_id,
    DROP COLUMN sealed;
