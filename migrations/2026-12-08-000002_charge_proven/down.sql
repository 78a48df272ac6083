ALTER TABLE payments DROP COLUMN charge_proven;
