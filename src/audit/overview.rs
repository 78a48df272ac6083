//! `GET /audit/overview`: what the operator console's overview draws, aggregated in SQL so
//! that the page never pages through the ledger. Read-only.
//!
//! Buckets are whole UTC hours (the last 24, the current one last) and whole UTC days (the
//! last 30); every bucket is present, empty ones as zeros. "Calls" are receipts (calls that
//! reached an upstream), "paid calls" the receipts with a payment; "payments" are intents
//! signed in the bucket, "settled" those of them whose money moved, "paid_not_served" and
//! "stuck" those of them in that queue now, and "moved" the amount settled per asset.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use super::DEFAULT_STUCK_SECS;
use super::store::{PAID_NOT_SERVED, PAYMENT_FROM};
use crate::payments::{self, PaymentStatus};

/// One time bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = OverviewBucket)]
pub struct Bucket {
    /// Start of the UTC hour or day.
    pub start: DateTime<Utc>,
    /// Receipts (calls that reached an upstream).
    pub calls: i64,
    /// Receipts with a payment.
    pub paid_calls: i64,
    /// Payment intents signed in the bucket.
    pub payments: i64,
    /// Of those, the ones whose money moved.
    pub settled: i64,
    /// Payment intents signed in the bucket that are paid-not-served now.
    pub paid_not_served: i64,
    /// Payment intents signed in the bucket that are stuck now (signed, untouched for 120 s).
    pub stuck: i64,
    /// The amount settled per (network, asset) of the payments signed in the bucket; only
    /// assets that moved.
    pub moved: Vec<BucketMoved>,
}

/// The amount of one asset settled in one bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = OverviewBucketMoved)]
pub struct BucketMoved {
    pub network: String,
    pub asset: String,
    /// Atomic units, a decimal string.
    pub amount: String,
}

#[derive(QueryableByName)]
struct BucketRow {
    #[diesel(sql_type = Timestamptz)]
    start: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    calls: i64,
    #[diesel(sql_type = BigInt)]
    paid_calls: i64,
    #[diesel(sql_type = BigInt)]
    payments: i64,
    #[diesel(sql_type = BigInt)]
    settled: i64,
    #[diesel(sql_type = BigInt)]
    paid_not_served: i64,
    #[diesel(sql_type = BigInt)]
    stuck: i64,
}

#[derive(QueryableByName)]
struct MovedRow {
    #[diesel(sql_type = Timestamptz)]
    start: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    network: String,
    #[diesel(sql_type = Text)]
    asset: String,
    #[diesel(sql_type = Text)]
    amount: String,
}

/// Money moved per (network, asset), atomic units as decimal strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, QueryableByName, utoipa::ToSchema)]
#[schema(as = OverviewMoved)]
pub struct Moved {
    #[diesel(sql_type = Text)]
    pub network: String,
    #[diesel(sql_type = Text)]
    pub asset: String,
    #[diesel(sql_type = Text)]
    pub settled_24h: String,
    #[diesel(sql_type = Text)]
    pub settled_30d: String,
}

/// The console's overview (`GET /audit/overview`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Overview {
    /// 24 hourly buckets, oldest first.
    pub hourly: Vec<Bucket>,
    /// 30 daily buckets, oldest first.
    pub daily: Vec<Bucket>,
    /// Per (network, asset) with money moved in the last 30 days (by signing time).
    pub moved: Vec<Moved>,
    /// As `GET /audit/payments?status=paid_not_served` (all time).
    pub paid_not_served: i64,
    /// As `GET /audit/payments?status=stuck` (signed, untouched for 120 s).
    pub stuck: i64,
    /// `unconfirmed` or `unknown`: the chain has not told yet (e.g. an upstream answered
    /// `settlement_pending`); `reconcile` resolves them.
    pub settlement_pending: i64,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn buckets(conn: &mut AsyncPgConnection, unit: &str, count: i32) -> diesel::QueryResult<Vec<Bucket>> {
    let spent = payments::sql_list(PaymentStatus::ALL.into_iter().filter(|s| s.is_spent()));
    let signed = PaymentStatus::Signed.as_str();
    let first = "date_trunc($1, now(), 'UTC') - ($2 - 1) * ('1 ' || $1)::interval";
    let rows: Vec<BucketRow> = diesel::sql_query(format!(
        "WITH b AS ( \
              SELECT generate_series({first}, date_trunc($1, now(), 'UTC'), ('1 ' || $1)::interval) AS start), \
              r AS ( \
              SELECT date_trunc($1, created_at, 'UTC') AS start, count(*) AS calls, \
                     count(*) FILTER (WHERE payment IS NOT NULL) AS paid_calls \
                FROM receipts WHERE created_at >= (SELECT min(start) FROM b) GROUP BY 1), \
              p AS ( \
              SELECT date_trunc($1, p.created_at, 'UTC') AS start, count(*) AS payments, \
                     count(*) FILTER (WHERE p.status IN {spent}) AS settled, \
                     count(*) FILTER (WHERE {PAID_NOT_SERVED}) AS paid_not_served, \
                     count(*) FILTER (WHERE p.status = '{signed}' \
                                        AND p.updated_at < now() - make_interval(secs => {DEFAULT_STUCK_SECS})) AS stuck \
                FROM payments p \
                LEFT JOIN idempotency_keys k ON k.agent_id = p.agent_id AND k.key = p.idempotency_key \
               WHERE p.created_at >= (SELECT min(start) FROM b) GROUP BY 1) \
         SELECT b.start, COALESCE(r.calls, 0) AS calls, COALESCE(r.paid_calls, 0) AS paid_calls, \
                COALESCE(p.payments, 0) AS payments, COALESCE(p.settled, 0) AS settled, \
                COALESCE(p.paid_not_served, 0) AS paid_not_served, COALESCE(p.stuck, 0) AS stuck \
           FROM b LEFT JOIN r ON r.start = b.start LEFT JOIN p ON p.start = b.start \
          ORDER BY b.start"
    ))
    .bind::<Text, _>(unit)
    .bind::<Integer, _>(count)
    .load(conn)
    .await?;
    let moved: Vec<MovedRow> = diesel::sql_query(format!(
        "SELECT date_trunc($1, created_at, 'UTC') AS start, network, asset, sum(amount)::text AS amount \
           FROM payments WHERE status IN {spent} AND created_at >= {first} \
          GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    ))
    .bind::<Text, _>(unit)
    .bind::<Integer, _>(count)
    .load(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Bucket {
            moved: moved
                .iter()
                .filter(|m| m.start == r.start)
                .map(|m| BucketMoved { network: m.network.clone(), asset: m.asset.clone(), amount: m.amount.clone() })
                .collect(),
            start: r.start,
            calls: r.calls,
            paid_calls: r.paid_calls,
            payments: r.payments,
            settled: r.settled,
            paid_not_served: r.paid_not_served,
            stuck: r.stuck,
        })
        .collect())
}

/// The overview, now.
///
/// # Errors
/// Database errors.
pub async fn overview(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Overview> {
    let hourly = buckets(conn, "hour", 24).await?;
    let daily = buckets(conn, "day", 30).await?;
    let spent = payments::sql_list(PaymentStatus::ALL.into_iter().filter(|s| s.is_spent()));
    let moved: Vec<Moved> = diesel::sql_query(format!(
        "SELECT network, asset, \
                COALESCE(sum(amount) FILTER (WHERE created_at > now() - interval '24 hours'), 0)::text AS settled_24h, \
                sum(amount)::text AS settled_30d \
           FROM payments WHERE status IN {spent} AND created_at > now() - interval '30 days' \
          GROUP BY network, asset ORDER BY network, asset"
    ))
    .load(conn)
    .await?;
    let paid_not_served: Count =
        diesel::sql_query(format!("SELECT count(*) AS n FROM ({PAYMENT_FROM} WHERE {PAID_NOT_SERVED}) x"))
            .get_result(conn)
            .await?;
    let stuck: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM payments WHERE status = $1 \
            AND updated_at < now() - make_interval(secs => $2::float8)",
    )
    .bind::<Text, _>(PaymentStatus::Signed.as_str())
    .bind::<BigInt, _>(DEFAULT_STUCK_SECS)
    .get_result(conn)
    .await?;
    let pending = payments::sql_list([PaymentStatus::Unconfirmed, PaymentStatus::Unknown]);
    let settlement_pending: Count =
        diesel::sql_query(format!("SELECT count(*) AS n FROM payments WHERE status IN {pending}"))
            .get_result(conn)
            .await?;
    Ok(Overview {
        hourly,
        daily,
        moved,
        paid_not_served: paid_not_served.n,
        stuck: stuck.n,
        settlement_pending: settlement_pending.n,
    })
}
