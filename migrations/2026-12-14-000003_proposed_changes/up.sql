-- The two-person rule (issue 42, item 2; docs/DESIGN.md §3): with REQUIRE_SECOND_ADMIN, an
-- admin change that raises spending power is recorded here as proposed and applied only when
-- a different admin confirms it.
--   kind        agent.update | agent.enable | settings.update | payments.resume | operator.create
--   target      the agent's id, 'settings', or 'operators' (a new admin operator)
--   change      the proposed values, in the request's wire form (applied exactly at confirm)
--   fields      what would change, field by field: [{field, before, after}]
--   base        the target's limits when proposed; a confirm that finds them changed refuses
--               (stale) rather than overwriting the change that landed in between
--   'pending' past expires_at reads as expired (the database's clock decides).
CREATE TABLE proposed_changes (
    id UUID PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('agent.update', 'agent.enable', 'settings.update', 'payments.resume', 'operator.create')),
    target TEXT NOT NULL,
    change JSONB NOT NULL,
    fields JSONB NOT NULL,
    base JSONB NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'confirmed', 'rejected')),
    proposed_by TEXT NOT NULL,
    proposed_by_id UUID,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL,
    decided_at TIMESTAMPTZ,
    decided_by TEXT,
    decided_by_id UUID,
    CHECK ((state = 'pending') = (decided_at IS NULL))
);
CREATE INDEX proposed_changes_queue ON proposed_changes (state, created_at);
