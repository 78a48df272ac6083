//! `gc`: delete expired idempotency rows (`idempotency::gc`) and drop the secrets no payment
//! can need any more, in bounded batches.

use anyhow::Context;
use clap::Args;
use serde_json::json;

use crate::config::{self, DatabaseArgs, DatabaseConfig};
use crate::telemetry::progress::Progress;

#[derive(Debug, Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Rows deleted per statement.
    #[arg(long, env = "GC_BATCH_SIZE", default_value = "1000")]
    pub gc_batch_size: String,
    /// Average deletion rate limit, rows per second (0: no limit).
    #[arg(long, env = "GC_MAX_ROWS_PER_SECOND", default_value = "10000")]
    pub gc_max_rows_per_second: String,
    /// What agents forwarded (sealed) is dropped from payments older than this, in hours
    /// (the routers' setting).
    #[arg(long, env = "SECRETS_RETENTION_HOURS", default_value = "48")]
    pub secrets_retention_hours: String,
}

/// `gc`: delete expired idempotency rows, then drop the secrets no payment can need any more
/// (`payments::kept::drop_secrets`); prints `{"deleted": N, "secrets_dropped": M}`. The
/// deletion shows its progress on standard error, one step per batch
/// (`telemetry::progress`).
///
/// # Errors
/// Configuration or database errors (non-zero exit).
pub async fn run(args: &GcArgs) -> anyhow::Result<()> {
    let db = DatabaseConfig::from_args(&args.db)?;
    let batch: i64 = args
        .gc_batch_size
        .trim()
        .parse()
        .ok()
        .filter(|b| *b > 0)
        .context("invalid setting GC_BATCH_SIZE (--gc-batch-size): expected a positive integer")?;
    let rate: u64 = args.gc_max_rows_per_second.trim().parse().ok().context(
        "invalid setting GC_MAX_ROWS_PER_SECOND (--gc-max-rows-per-second): expected a non-negative integer",
    )?;
    let retention = config::secrets::retention_hours(&args.secrets_retention_hours)?;
    let pool = db.pool();
    let mut conn = pool.get().await.context("connecting to Postgres")?;
    crate::telemetry::init(false);
    let expired = crate::idempotency::gc::count_expired(&mut conn).await.context("counting expired rows")?;
    let progress = Progress::start("gc", "rows", Some(expired));
    let deleted =
        crate::idempotency::gc::run_reporting(&mut conn, batch, std::num::NonZeroU64::new(rate), Some(&progress))
            .await
            .context("deleting expired rows")?;
    drop(progress);
    let dropped = crate::payments::kept::drop_secrets(&mut conn, retention, batch)
        .await
        .context("dropping the secrets of final or old payments")?;
    println!("{}", json!({ "deleted": deleted, "secrets_dropped": dropped }));
    Ok(())
}
