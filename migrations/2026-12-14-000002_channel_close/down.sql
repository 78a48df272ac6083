ALTER TABLE batch_lanes
    DROP COLUMN state, DROP COLUMN claimed, DROP COLUMN balance, DROP COLUMN refunded, DROP COLUMN url,
    DROP COLUMN withdraw_after;
