-- x402 batch-settlement channels the router pays with (issue 40; docs/DESIGN.md, "Payment
-- schemes"). One row per lane: a channel of its own (its own salt, so its own id) among those
-- of one (wallet, payTo, network, asset, receiverAuthorizer, withdrawDelay); parallel calls to
-- one upstream use separate lanes, never one in-flight voucher.
--   signed_ceiling  the highest voucher ceiling ever signed on the channel (cumulative, atomic
--                   units): never lowered, never signed again with another voucher
--   voucher         that voucher {channelId, maxClaimableAmount, signature}
--   charged         what the server's state, checked, says it charged (claimed <= charged <= signed)
--   deposited       deposits whose authorization was recorded (the wallet's money locked)
--   deposit         the last deposit's authorization {amount, salt, validBefore, nonce, signature}
--   in_flight       the payment (payments.id) whose voucher is out; NULL: the lane is free.
--                   Set before the payment is recorded: a lane held by an id with no payment
--                   after in_flight_at + 1 minute is free again (nothing of it left)
--   stopped         why the router stopped signing on the channel (its server contradicted it)
CREATE TABLE batch_lanes (
    id                  UUID PRIMARY KEY,
    wallet              TEXT NOT NULL,
    pay_to              TEXT NOT NULL,
    network             TEXT NOT NULL,
    asset               TEXT NOT NULL,
    receiver_authorizer TEXT NOT NULL,
    withdraw_delay      BIGINT NOT NULL CHECK (withdraw_delay >= 0),
    salt                TEXT NOT NULL,
    channel_id          TEXT NOT NULL UNIQUE,
    signed_ceiling      NUMERIC(78, 0) NOT NULL DEFAULT 0 CHECK (signed_ceiling >= 0),
    voucher             JSONB,
    charged             NUMERIC(78, 0) NOT NULL DEFAULT 0 CHECK (charged >= 0 AND charged <= signed_ceiling),
    deposited           NUMERIC(78, 0) NOT NULL DEFAULT 0 CHECK (deposited >= 0),
    deposit             JSONB,
    in_flight           UUID,
    in_flight_at        TIMESTAMPTZ,
    stopped             TEXT,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX batch_lanes_channel_idx
    ON batch_lanes (wallet, pay_to, network, asset, receiver_authorizer, withdraw_delay);
