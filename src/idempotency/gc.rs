//! Garbage collection of expired idempotency rows. The CLI (`x402-router gc`), the
//! scheduled GitHub Action and the tests all call [`run`].
//!
//! Deletes in bounded batches (never one giant DELETE holding locks on millions of
//! rows), optionally paced to a rows-per-second budget: every batch is a commit and
//! WAL on the disk that the routers commit to, so an unpaced run of a million rows raises
//! their latency for its whole duration (BENCHMARKS.md). Receipts are kept forever;
//! `idempotency_keys.receipt_id` is the only link.
//!
//! Only terminal rows are deleted. A row in flight has an owner, or will get one by
//! takeover: deleting it would let a retry claim the key afresh and execute the call a
//! second time beside the running owner (whose result would then be fenced off and lost).
//! A takeover moves `expires_at` 24 h ahead, so its result is kept as long as a fresh call's.
//! An in-flight row whose caller never retries stays (with its payment intent, which
//! `reconcile` settles) until a retry takes it over.
//!
//! The `gc` command then drops the sealed requests of payments past `SECRETS_RETENTION_HOURS`
//! (`payments::kept::drop_secrets`; docs/DESIGN.md §10).

use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Nullable, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::telemetry::progress::Progress;

/// Deletes every terminal row whose `expires_at` has passed, `batch` rows per statement, and at
/// most `max_rows_per_second` on average (`None`: as fast as Postgres goes). Returns how
/// many were deleted.
///
/// Each batch walks `idempotency_keys_expires_idx` forward from where the last one stopped
/// (a cursor on `expires_at`: no batch walks again over the index entries of the rows the
/// batches before it deleted, which stay in the index until vacuum) and deletes the rows it
/// found by their tuple ids (a TID scan; no row lock taken first, so one WAL record per row,
/// not two). The conditions are checked again on the row being deleted: a row taken over or
/// claimed since it was found (a new version, `in_flight`, `expires_at` moved) is left alone.
/// Paced after every batch, so the deletes and their WAL come as an even trickle, not bursts.
///
/// # Errors
/// Database errors (rows deleted by earlier batches stay deleted).
pub async fn run(
    conn: &mut AsyncPgConnection,
    batch: i64,
    max_rows_per_second: Option<NonZeroU64>,
) -> diesel::QueryResult<u64> {
    run_reporting(conn, batch, max_rows_per_second, None).await
}

/// [`run`], each batch a step of `progress` (the `gc` command's bar or log lines).
///
/// # Errors
/// Database errors (rows deleted by earlier batches stay deleted).
pub async fn run_reporting(
    conn: &mut AsyncPgConnection,
    batch: i64,
    max_rows_per_second: Option<NonZeroU64>,
    progress: Option<&Progress>,
) -> diesel::QueryResult<u64> {
    let started = Instant::now();
    let mut total = 0u64;
    // The cursor: every expired row before it has been seen.
    let mut from: Option<chrono::DateTime<chrono::Utc>> = None;
    loop {
        let deleted: Vec<Deleted> = diesel::sql_query(
            "DELETE FROM idempotency_keys \
              WHERE ctid = ANY(ARRAY( \
                      SELECT ctid FROM idempotency_keys \
                       WHERE expires_at < now() AND ($1::timestamptz IS NULL OR expires_at >= $1) \
                         AND status <> 'in_flight' \
                       ORDER BY expires_at LIMIT $2)) \
                AND expires_at < now() AND status <> 'in_flight' \
              RETURNING expires_at",
        )
        .bind::<Nullable<Timestamptz>, _>(from)
        .bind::<BigInt, _>(batch)
        .load(conn)
        .await?;
        let n = deleted.len();
        total += n as u64;
        if let Some(p) = progress {
            p.step(n as u64);
        }
        if (n as i64) < batch {
            // The counted calls and payments that left the rate limits' sliding window.
            crate::payments::limits::delete_old_rate_events(conn).await?;
            return Ok(total);
        }
        // Rows at the cursor's instant that this batch did not reach are found again (`>=`).
        from = deleted.iter().map(|d| d.expires_at).max().or(from);
        if let Some(rate) = max_rows_per_second {
            let due = Duration::from_millis(total.saturating_mul(1000) / rate.get());
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// How many rows [`run`] would delete now (the `gc` command's total, for its time left).
///
/// # Errors
/// Database errors.
pub async fn count_expired(conn: &mut AsyncPgConnection) -> diesel::QueryResult<u64> {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let c: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM idempotency_keys WHERE expires_at < now() AND status <> 'in_flight'",
    )
    .get_result(conn)
    .await?;
    Ok(u64::try_from(c.n).unwrap_or(0))
}

/// A deleted row's expiry (the cursor of the next batch).
#[derive(diesel::QueryableByName)]
struct Deleted {
    #[diesel(sql_type = Timestamptz)]
    expires_at: chrono::DateTime<chrono::Utc>,
}
