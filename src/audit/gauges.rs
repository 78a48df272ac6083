//! The payment ledger as Prometheus gauges, for the alert rules in `deploy/prometheus/`:
//! paid-not-served payments, stuck intents, how recovery of lost answers ended, and how much
//! of each agent's daily budget is used. A background task of every router reads them every
//! [`REFRESH`] on one pooled connection (six read-only statements over the last 24 h of the
//! ledger); a failed read keeps the last values and is logged at debug. The gauges only
//! report.

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::store::{PAID_NOT_SERVED, PAYMENT_FROM};
use crate::metrics::Metrics;
use crate::payments::{self, PaymentStatus, RecoveryKind};
use crate::state::AppState;

/// How often the ledger is read.
pub const REFRESH: Duration = Duration::from_secs(60);

/// An intent still undecided this long after its last update is stuck: `reconcile` (every
/// 5 minutes) should have decided it, so it is not running or cannot read the chain.
pub const STUCK_AFTER_SECS: i64 = 900;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct BudgetUse {
    #[diesel(sql_type = Text)]
    agent_id: String,
    /// `24h`, `month`, `7d`, `lifetime` or `wallet` (the wallet-wide cap, `agent_id` empty).
    #[diesel(sql_type = Text)]
    budget: String,
    #[diesel(sql_type = Double)]
    ratio: f64,
}

/// Reads the ledger once and sets the gauges.
///
/// # Errors
/// Database errors (the gauges keep their previous values).
pub async fn refresh(conn: &mut AsyncPgConnection, metrics: &Metrics) -> diesel::QueryResult<()> {
    let paid_not_served: Count = diesel::sql_query(format!(
        "SELECT count(*) AS n FROM ({PAYMENT_FROM} \
          WHERE p.updated_at > now() - interval '24 hours' AND {PAID_NOT_SERVED}) x"
    ))
    .get_result(conn)
    .await?;
    let stuck: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM payments \
          WHERE status IN ('signed', 'unknown', 'unconfirmed') \
            AND updated_at < now() - make_interval(secs => $1::float8)",
    )
    .bind::<BigInt, _>(STUCK_AFTER_SECS)
    .get_result(conn)
    .await?;
    let stopped: Count =
        diesel::sql_query("SELECT count(*) AS n FROM batch_lanes WHERE stopped IS NOT NULL").get_result(conn).await?;
    let budgets = budget_uses(conn).await?;
    let mut recoveries = Vec::new();
    for kind in [RecoveryKind::Recovered, RecoveryKind::Reaccessed, RecoveryKind::Lost] {
        let n: Count = diesel::sql_query(
            "SELECT count(*) AS n FROM payments \
              WHERE recovery->>'outcome' = $1 AND updated_at > now() - interval '24 hours'",
        )
        .bind::<Text, _>(kind.as_str())
        .get_result(conn)
        .await?;
        recoveries.push((kind, n.n));
    }
    // One indexed count per status (every status reported, 0 included).
    let mut by_status = Vec::new();
    for st in PaymentStatus::ALL {
        let n: Count = diesel::sql_query("SELECT count(*) AS n FROM payments WHERE status = $1")
            .bind::<Text, _>(st.as_str())
            .get_result(conn)
            .await?;
        by_status.push((st, n.n));
    }
    for (st, n) in by_status {
        metrics.payments_by_status.with_label_values(&[st.as_str()]).set(n);
    }
    metrics.paid_not_served.set(paid_not_served.n as f64);
    // Every outcome is reported, 0 included, so that a rate or an alert has a series.
    for (kind, n) in recoveries {
        metrics.recovery_outcomes.with_label_values(&[kind.as_str()]).set(n);
    }
    metrics.stuck_intents.set(stuck.n as f64);
    metrics.channels_stopped.set(stopped.n as f64);
    set_budgets(metrics, budgets);
    Ok(())
}

/// Each agent's budgets and the wallet-wide cap, as the share used.
async fn budget_uses(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Vec<BudgetUse>> {
    // The same arithmetic as the budget the router enforces (`payments::usage`): spent in the
    // window plus every reservation that may still move money.
    use payments::usage::{in_day, in_lifetime, in_month, in_week, sum_where};
    diesel::sql_query(format!(
        "SELECT a.id::text AS agent_id, b.budget, b.ratio \
           FROM agents a, LATERAL ( \
                SELECT {day} AS day, {month} AS month, {week} AS week, {lifetime} AS lifetime \
                  FROM payments p WHERE p.agent_id = a.id) u, \
                LATERAL (VALUES ('24h', (u.day / NULLIF(a.daily_budget, 0))::float8), \
                                ('month', (u.month / NULLIF(a.month_budget, 0))::float8), \
                                ('7d', (u.week / NULLIF(a.week_budget, 0))::float8), \
                                ('lifetime', (u.lifetime / NULLIF(a.lifetime_budget, 0))::float8)) b(budget, ratio) \
          WHERE NOT a.disabled AND b.ratio IS NOT NULL \
         UNION ALL \
         SELECT '' AS agent_id, 'wallet' AS budget, ((w.used + l.locked) / s.wallet_daily_cap)::float8 AS ratio \
           FROM router_settings s, LATERAL (SELECT {day} AS used FROM payments p) w, ({locked}) l \
          WHERE s.wallet_daily_cap > 0",
        day = sum_where(&in_day()),
        month = sum_where(&in_month()),
        week = sum_where(&in_week()),
        lifetime = sum_where(&in_lifetime()),
        locked = payments::lanes::LOCKED_SQL,
    ))
    .load(conn)
    .await
}

/// Sets the budget gauges, logging each budget that crossed a level since the last refresh.
fn set_budgets(metrics: &Metrics, budgets: Vec<BudgetUse>) {
    // Spend alerts: a warning in the log when a budget crosses 80 % and when it is used up
    // (once per crossing seen by this process; Prometheus alerts on the gauge itself).
    let before: std::collections::HashMap<(String, String), f64> = budgets
        .iter()
        .filter_map(|b| {
            let g = metrics.budget_used.get_metric_with_label_values(&[b.agent_id.as_str(), b.budget.as_str()]).ok()?;
            Some(((b.agent_id.clone(), b.budget.clone()), g.get()))
        })
        .collect();
    metrics.budget_used.reset();
    for b in budgets {
        let was = before.get(&(b.agent_id.clone(), b.budget.clone())).copied().unwrap_or(0.0);
        for (level, what) in [(1.0, "used up"), (0.8, "80% used")] {
            if was < level && b.ratio >= level {
                tracing::warn!(agent_id = %b.agent_id, budget = %b.budget, ratio = b.ratio, "spend alert: budget {what}");
                break;
            }
        }
        metrics.budget_used.with_label_values(&[b.agent_id.as_str(), b.budget.as_str()]).set(b.ratio);
    }
}

/// Starts the refresh task on the current runtime. Returns at once.
pub fn spawn_refresh(state: &AppState) {
    let (pool, metrics) = (state.pool.clone(), std::sync::Arc::clone(&state.metrics));
    tokio::spawn(async move {
        loop {
            match pool.get().await {
                Ok(mut conn) => {
                    if let Err(e) = refresh(&mut conn, &metrics).await {
                        tracing::debug!(error = %e, "ledger gauges not refreshed");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "ledger gauges not refreshed"),
            }
            tokio::time::sleep(REFRESH).await;
        }
    });
}
