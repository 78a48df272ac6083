//! An agent's spend read from the ledger: its limits and what it spent and reserved, plain or
//! under the agent's row lock for a reservation ([`lock_for_reservation`]).

use std::sync::LazyLock;

use diesel::prelude::*;
use diesel::sql_types::{Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::Spend;
use super::limits::Refusal;
use crate::db::PrepareExt;

/// An agent's limits and usage: [`SPEND_OF_EVERY_AGENT`] for one agent (`$1`).
static SPEND_SQL: LazyLock<String> = LazyLock::new(|| format!("{} WHERE a.id = $1", *SPEND_OF_EVERY_AGENT));

/// Every agent's limits and usage (the budget arithmetic of [`super::usage`]), one row per
/// agent: the operators' list of agents reads them all in one statement.
pub static SPEND_OF_EVERY_AGENT: LazyLock<String> = LazyLock::new(|| {
    use super::usage::{counted, reserved, spent_in_day, spent_in_month, sum_where};
    format!(
        "SELECT a.id AS agent_id, a.disabled, a.max_per_call::text AS max_per_call, a.daily_budget::text AS daily_budget, \
                u.settled::text AS settled_24h, u.reserved::text AS reserved_24h, \
                CASE WHEN a.daily_budget IS NULL THEN NULL \
                     ELSE GREATEST(a.daily_budget - u.settled - u.reserved, 0)::text END AS remaining_24h, \
                a.month_budget::text AS month_budget, u.settled_month::text AS settled_month, \
                CASE WHEN a.month_budget IS NULL THEN NULL \
                     ELSE GREATEST(a.month_budget - u.settled_month - u.reserved, 0)::text END AS remaining_month, \
                a.allowed_hosts, a.allowed_pay_to, a.calls_per_minute, a.payments_per_minute \
           FROM agents a, LATERAL ( \
                SELECT {settled} AS settled, {settled_month} AS settled_month, {reserved} AS reserved \
                  FROM payments p WHERE p.agent_id = a.id AND {counted}) u",
        settled = sum_where(&spent_in_day()),
        settled_month = sum_where(&spent_in_month()),
        reserved = sum_where(&reserved()),
        counted = counted(),
    )
});

/// The spend of `agent_id`. With `lock`, first locks the agent row in a statement of its
/// own, so that (under READ COMMITTED) the sums are read from a snapshot taken after every
/// earlier reservation of this agent committed: concurrent payments of one agent reserve
/// strictly one after another. The lock is `FOR NO KEY UPDATE`: it serializes reservations
/// just as well, but, unlike `FOR UPDATE`, does not conflict with the `FOR KEY SHARE` lock
/// that every foreign-key check on the agent row takes (each claim, intent and receipt insert
/// of the agent), so a reservation neither waits for nor blocks those. (Locking inside the summing statement would not do: after
/// waiting for the lock, Postgres re-checks the locked row but keeps the statement's old
/// snapshot for the sums.) `None`: no such agent.
///
/// # Errors
/// Database errors.
pub async fn agent_spend(conn: &mut AsyncPgConnection, agent_id: Uuid, lock: bool) -> QueryResult<Option<Spend>> {
    if lock {
        let locked = diesel::sql_query("SELECT 1 FROM agents WHERE id = $1 FOR NO KEY UPDATE")
            .bind::<SqlUuid, _>(agent_id)
            .prepared()
            .execute(conn)
            .await?;
        if locked == 0 {
            return Ok(None);
        }
    }
    diesel::sql_query(SPEND_SQL.as_str()).bind::<SqlUuid, _>(agent_id).prepared().get_result(conn).await.optional()
}

/// The spend of `agent_id` read under its row lock (see [`agent_spend`]), for a call that
/// authenticated with the key whose sha256 is `credential`; or why nothing may be reserved for
/// it: the agent is gone, disabled, or its key is no longer `credential` (rotated). Operators'
/// changes of an agent take the same lock, so a disable (or a rotation) is a line in time: a
/// reservation either committed before it, or sees it and reserves nothing.
///
/// # Errors
/// Database errors.
pub async fn lock_for_reservation(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    credential: &str,
) -> QueryResult<Result<Spend, Refusal>> {
    #[derive(QueryableByName)]
    struct Locked {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        disabled: bool,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        current_key: bool,
    }
    let locked: Option<Locked> = diesel::sql_query(
        "SELECT disabled, api_key_hash = $2 AS current_key FROM agents WHERE id = $1 FOR NO KEY UPDATE",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(credential)
    .prepared()
    .get_result(conn)
    .await
    .optional()?;
    match locked {
        None => return Ok(Err(Refusal::OverBudget("unknown agent".into()))),
        Some(l) if l.disabled => return Ok(Err(Refusal::Disabled)),
        Some(l) if !l.current_key => return Ok(Err(Refusal::KeyRotated)),
        Some(_) => {}
    }
    // The sums in a statement of their own: a snapshot taken after the lock was granted.
    Ok(agent_spend(conn, agent_id, false).await?.ok_or_else(|| Refusal::OverBudget("unknown agent".into())))
}
