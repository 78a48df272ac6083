//! An agent's spend read from the ledger: its limits and what it spent and reserved, plain or
//! under the agent's row lock for a reservation ([`lock_for_reservation`]).

use std::sync::LazyLock;

use diesel::prelude::*;
use diesel::sql_types::{Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::Spend;
use super::limits::Refusal;
use crate::db::PrepareExt;

/// An agent's limits and usage for a call to the upstream host `$2` (NULL: none): [`spend_sql`]
/// for one agent (`$1`).
static SPEND_SQL: LazyLock<String> = LazyLock::new(|| format!("{} WHERE a.id = $1", spend_sql("$2::text")));

/// Every agent's limits and usage (the budget arithmetic of [`super::usage`]), one row per
/// agent: the operators' list of agents reads them all in one statement.
pub static SPEND_OF_EVERY_AGENT: LazyLock<String> = LazyLock::new(|| spend_sql("NULL::text"));

/// The spend query, `host` the SQL of the upstream host it is read for. The lifetime sum and
/// the per-host sums are read only for an agent with such a budget (a one-time filter on the
/// agent's column: nothing scanned without one).
fn spend_sql(host: &str) -> String {
    use super::usage::{
        counted, in_day, in_week, reserved, spent_ever, spent_in_day, spent_in_month, spent_in_week, sum_where,
    };
    // The week, lifetime and host budgets (issue 42), beside the others.
    let more = format!(
        "a.week_budget::text AS week_budget, u.settled_week::text AS settled_7d, \
         CASE WHEN a.week_budget IS NULL THEN NULL \
              ELSE GREATEST(a.week_budget - u.settled_week - u.reserved, 0)::text END AS remaining_7d, \
         a.lifetime_budget::text AS lifetime_budget, \
         CASE WHEN a.lifetime_budget IS NULL THEN NULL ELSE l.settled::text END AS settled_lifetime, \
         CASE WHEN a.lifetime_budget IS NULL THEN NULL \
              ELSE GREATEST(a.lifetime_budget - l.settled - u.reserved, 0)::text END AS remaining_lifetime, \
         a.host_budgets, h.used AS host_used_24h, {host} AS upstream_host, a.blocked_pay_to, \
         a.approval_above::text AS approval_above, \
         (SELECT s.blocked_pay_to FROM router_settings s WHERE s.id) AS wallet_blocked_pay_to"
    );
    let more_from = format!(
        "LATERAL (SELECT COALESCE(sum({charge}), 0) AS settled FROM payments p \
                   WHERE a.lifetime_budget IS NOT NULL AND p.agent_id = a.id AND {spent_ever}) l, \
         LATERAL (SELECT jsonb_object_agg(g.host, g.used::text) AS used \
                    FROM (SELECT COALESCE(p.upstream_host, '') AS host, sum({charge}) AS used FROM payments p \
                           WHERE a.host_budgets IS NOT NULL AND p.agent_id = a.id AND {in_day} \
                           GROUP BY 1) g) h",
        spent_ever = spent_ever(),
        in_day = in_day(),
        charge = super::usage::CHARGE,
    );
    format!(
        "SELECT a.id AS agent_id, a.disabled, a.max_per_call::text AS max_per_call, a.daily_budget::text AS daily_budget, \
                u.settled::text AS settled_24h, u.reserved::text AS reserved_24h, \
                CASE WHEN a.daily_budget IS NULL THEN NULL \
                     ELSE GREATEST(a.daily_budget - u.settled - u.reserved, 0)::text END AS remaining_24h, \
                a.month_budget::text AS month_budget, u.settled_month::text AS settled_month, \
                CASE WHEN a.month_budget IS NULL THEN NULL \
                     ELSE GREATEST(a.month_budget - u.settled_month - u.reserved, 0)::text END AS remaining_month, \
                a.allowed_hosts, a.allowed_pay_to, a.calls_per_minute, a.payments_per_minute, {more} \
           FROM agents a, LATERAL ( \
                SELECT {settled} AS settled, {settled_month} AS settled_month, {reserved} AS reserved, \
                       {settled_week} AS settled_week \
                  FROM payments p WHERE p.agent_id = a.id AND ({counted} OR {in_week})) u, {more_from}",
        settled = sum_where(&spent_in_day()),
        settled_month = sum_where(&spent_in_month()),
        reserved = sum_where(&reserved()),
        settled_week = sum_where(&spent_in_week()),
        counted = counted(),
        in_week = in_week(),
    )
}

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
    agent_spend_at(conn, agent_id, None, lock).await
}

/// [`agent_spend`] for a call to the upstream host `host` (`payments.upstream_host`'s form):
/// what the agent's budgets for that host have left is in its [`Spend::limits`].
///
/// # Errors
/// Database errors.
pub async fn agent_spend_at(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    host: Option<&str>,
    lock: bool,
) -> QueryResult<Option<Spend>> {
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
    diesel::sql_query(SPEND_SQL.as_str())
        .bind::<SqlUuid, _>(agent_id)
        .bind::<Nullable<Text>, _>(host)
        .prepared()
        .get_result(conn)
        .await
        .optional()
}

/// The spend of `agent_id` read under its row lock (see [`agent_spend`]), for a call that
/// authenticated with the key whose sha256 is `credential`; or why nothing may be reserved for
/// it: the agent is gone, disabled, or its key is no longer `credential` (rotated). `host`: the
/// upstream host of the payment (its host budgets apply). Operators'
/// changes of an agent take the same lock, so a disable (or a rotation) is a line in time: a
/// reservation either committed before it, or sees it and reserves nothing.
///
/// # Errors
/// Database errors.
pub async fn lock_for_reservation(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    credential: &str,
    host: Option<&str>,
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
    Ok(agent_spend_at(conn, agent_id, host, false).await?.ok_or_else(|| Refusal::OverBudget("unknown agent".into())))
}
