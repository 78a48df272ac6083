-- An answer that `x402-router reconcile` got back for a payment whose key had already been
-- answered "settled, response lost" (issue 16). The key's first final answer is never
-- rewritten (replays stay byte-identical); the recovered answer is kept here, one per
-- payment at most (the primary key), and served to the agent by GET /payments.
--   kind        recovered (the upstream's original answer); reaccessed is reserved for a
--               new execution reached by signing in as the payer (SIWX);
--   receipt_id  the signed receipt written in the same transaction;
--   http_status, body: the /route answer the agent would have had (status and envelope).
CREATE TABLE recovered_answers (
    agent_id    UUID NOT NULL,
    payment_id  UUID NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('recovered', 'reaccessed')),
    receipt_id  UUID NOT NULL,
    http_status INTEGER NOT NULL,
    body        BYTEA NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, payment_id),
    FOREIGN KEY (agent_id, payment_id) REFERENCES payments (agent_id, id) ON DELETE CASCADE,
    FOREIGN KEY (agent_id, receipt_id) REFERENCES receipts (agent_id, id)
);
