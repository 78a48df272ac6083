-- Reconciling and closing batch-settlement channels (issue 40, item 4; docs/DESIGN.md,
-- "Closing a channel").
--   state           open: vouchers are signed on it; closing: the operator asked to close it, no
--                   voucher or deposit is signed on it again (a cooperative refund or the
--                   wallet's timed withdrawal is under way); closed: nothing unclaimed is left
--                   in it on-chain and it is never used again
--   claimed         the channel's totalClaimed on-chain at the last reconcile or close (NULL:
--                   never read)
--   balance         the channel's balance on-chain then (deposits less refunds and withdrawals)
--   refunded        what came back to the wallet from the channel (cooperative refund or
--                   withdrawal): the money of `deposited` no longer locked in it
--   url             where the channel's server was last paid (scheme, host, port, path: no
--                   query), asked for the cooperative refund
--   withdraw_after  unix time (the chain's) from which the wallet's pending withdrawal may be
--                   finalized; NULL: none pending
ALTER TABLE batch_lanes
    ADD COLUMN state          TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closing', 'closed')),
    ADD COLUMN claimed        NUMERIC(78, 0) CHECK (claimed >= 0),
    ADD COLUMN balance        NUMERIC(78, 0) CHECK (balance >= 0),
    ADD COLUMN refunded       NUMERIC(78, 0) NOT NULL DEFAULT 0 CHECK (refunded >= 0 AND refunded <= deposited),
    ADD COLUMN url            TEXT,
    ADD COLUMN withdraw_after BIGINT;
