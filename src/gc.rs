//! Garbage collection of expired idempotency rows. The CLI (`x402-router gc`), the
//! scheduled GitHub Action and the tests all call [`run_once`].
//!
//! Deletes in bounded batches (never one giant DELETE holding locks on millions of
//! rows). Receipts are kept forever; `idempotency_keys.receipt_id` is the only link.

use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// Deletes every row whose `expires_at` has passed, `batch` rows per statement.
/// Returns how many were deleted.
///
/// # Errors
/// Database errors (rows deleted by earlier batches stay deleted).
pub async fn run_once(conn: &mut AsyncPgConnection, batch: i64) -> diesel::QueryResult<u64> {
    let mut total = 0u64;
    loop {
        let n = diesel::sql_query(
            "DELETE FROM idempotency_keys WHERE (agent_id, key) IN ( \
                 SELECT agent_id, key FROM idempotency_keys \
                  WHERE expires_at < now() \
                  LIMIT $1 FOR UPDATE SKIP LOCKED)",
        )
        .bind::<BigInt, _>(batch)
        .execute(conn)
        .await?;
        total += n as u64;
        if (n as i64) < batch {
            return Ok(total);
        }
    }
}
