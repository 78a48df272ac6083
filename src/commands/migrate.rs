//! `migrate`: apply the pending embedded migrations and exit.

use serde_json::json;

use crate::config::{DatabaseArgs, DatabaseConfig};
use crate::telemetry::progress::Progress;

/// `migrate`: apply pending migrations, one at a time, with their progress on standard error
/// (`telemetry::progress`).
///
/// # Errors
/// Configuration or migration errors.
pub async fn run(args: &DatabaseArgs) -> anyhow::Result<()> {
    let db = DatabaseConfig::from_args(args)?;
    crate::telemetry::init(false);
    // The bar or log lines, made once the number of pending migrations is known; dropped
    // (the bar cleared) with the closure when the last one is applied.
    let mut progress: Option<Progress> = None;
    let applied = crate::db::run_migrations_reporting(db.url.expose(), move |done, pending| {
        let p = progress.get_or_insert_with(|| Progress::start("migrate", "migrations", Some(pending as u64)));
        if done > 0 {
            p.step(1);
        }
    })
    .await?;
    println!("{}", json!({ "applied": applied }));
    Ok(())
}
