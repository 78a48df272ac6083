//! `migrate`: apply the pending embedded migrations and exit.

use serde_json::json;

use crate::config::{DatabaseArgs, DatabaseConfig};

/// `migrate`: apply pending migrations.
///
/// # Errors
/// Configuration or migration errors.
pub async fn run(args: &DatabaseArgs) -> anyhow::Result<()> {
    let db = DatabaseConfig::from_args(args)?;
    let applied = crate::db::run_migrations(db.url.expose()).await?;
    println!("{}", json!({ "applied": applied }));
    Ok(())
}
