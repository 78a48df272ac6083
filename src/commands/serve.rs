//! `serve`: migrate (unless disabled) and run the HTTP service. Its flags are the router's
//! settings (`config::ServeArgs`).

use anyhow::Context;

use crate::config::{Config, ServeArgs};
use crate::startup::{Application, Hooks};

/// `serve`: migrate (unless disabled) and run the HTTP service.
///
/// # Errors
/// Configuration, migration or server errors.
pub async fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let mut config = Config::from_args(args)?;
    // Kept until the server stops: dropping it flushes the traces not yet exported.
    let _traces = crate::telemetry::init_serving(config.json_logs)?;
    crate::startup::preflight(&mut config).await?;
    if config.run_migrations {
        let applied = crate::db::run_migrations(config.database.url.expose()).await.context("running migrations")?;
        if !applied.is_empty() {
            tracing::info!(migrations = ?applied, "applied migrations");
        }
    }
    let app = Application::build(config, Hooks::default())?;
    sweep_secrets(app.state()).await?;
    tracing::info!(port = app.port(), payer = %app.state().config.signer.address(), "x402-router listening");
    app.run_until_stopped().await?;
    Ok(())
}

/// Before serving: says which key seals (warning when it is the one derived from the wallet
/// key), and seals or redacts what earlier versions kept in the clear (`secrets::sweep`).
async fn sweep_secrets(state: &crate::state::AppState) -> anyhow::Result<()> {
    let secrets = &state.config.secrets;
    let keys: Vec<&str> = secrets.keyring.ids().collect();
    if secrets.keyring.current_id() == crate::secrets::DERIVED_KEY_ID {
        tracing::warn!(
            "SECRETS_KEY_FILE is not set: what agents forward is sealed with a key derived from the wallet key \
             (set SECRETS_KEY_FILE to keep it under a key of its own; docs/operations.md, \"Secrets at rest\")"
        );
    }
    let mut conn = state.pool.get().await.context("connecting to Postgres")?;
    let sweep = crate::secrets::sweep::Sweep {
        keyring: &secrets.keyring,
        redaction: &secrets.redaction,
        retention_hours: secrets.retention_hours,
        receipt_signer: &state.receipt_signer,
    };
    let swept = crate::secrets::sweep::run(&mut conn, &sweep).await.context("sealing the secrets of earlier rows")?;
    tracing::info!(secrets.keys = ?keys, secrets.sealing_key = secrets.keyring.current_id(), sealed = swept.sealed,
        dropped = swept.dropped, redacted_payments = swept.redacted_payments,
        redacted_receipts = swept.redacted_receipts, "secrets at rest: earlier rows swept");
    Ok(())
}
