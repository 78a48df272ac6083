-- Whether `amount` is what the chain showed moved (issue 22). An `upto` intent reserves its
-- signed maximum until the settling transaction's Transfer logs are read: until then this is
-- false, and `reconcile` keeps looking for that transaction after the payment is spent (an
-- ending that could not read it leaves the maximum charged only until a run finds it).
-- Other intents sign an exact amount: true from the start.
ALTER TABLE payments ADD COLUMN charge_proven BOOLEAN NOT NULL DEFAULT true;
UPDATE payments SET charge_proven = false WHERE scheme = 'upto';
