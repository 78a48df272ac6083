//! The sub-commands behind the CLI. Each returns an error for `main` to print as one line.

use anyhow::Context;
use serde_json::json;
use uuid::Uuid;

use crate::auth::{agents, generate_api_key, hash_api_key};
use crate::cli::{AgentsArgs, AgentsCommand, DatabaseArgs, GcArgs, ServeArgs};
use crate::config::{Config, DatabaseConfig};
use crate::routing::request::parse_decimal_amount;
use crate::startup::{Application, Hooks};

/// `serve`: migrate (unless disabled) and run the HTTP service.
///
/// # Errors
/// Configuration, migration or server errors.
pub async fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let config = Config::from_args(args)?;
    crate::telemetry::init(config.json_logs);
    if config.run_migrations {
        let applied = crate::db::run_migrations(config.database.url.expose())
            .await
            .context("running migrations")?;
        if !applied.is_empty() {
            tracing::info!(migrations = ?applied, "applied migrations");
        }
    }
    let app = Application::build(config, Hooks::default())?;
    tracing::info!(port = app.port(), payer = %app.state().config.signer.address(), "x402-router listening");
    app.run_until_stopped().await?;
    Ok(())
}

/// `migrate`: apply pending migrations.
///
/// # Errors
/// Configuration or migration errors.
pub async fn migrate(args: &DatabaseArgs) -> anyhow::Result<()> {
    let db = DatabaseConfig::from_args(args)?;
    let applied = crate::db::run_migrations(db.url.expose()).await?;
    println!("{}", json!({ "applied": applied }));
    Ok(())
}

/// `gc`: delete expired idempotency rows; prints `{"deleted": N}`.
///
/// # Errors
/// Configuration or database errors (non-zero exit).
pub async fn gc(args: &GcArgs) -> anyhow::Result<()> {
    let db = DatabaseConfig::from_args(&args.db)?;
    let batch: i64 = args
        .gc_batch_size
        .trim()
        .parse()
        .ok()
        .filter(|b| *b > 0)
        .context("invalid setting GC_BATCH_SIZE (--gc-batch-size): expected a positive integer")?;
    let pool = crate::db::pool(&db);
    let mut conn = pool.get().await.context("connecting to Postgres")?;
    let deleted = crate::gc::run_once(&mut conn, batch)
        .await
        .context("deleting expired rows")?;
    println!("{}", json!({ "deleted": deleted }));
    Ok(())
}

/// `agents create|list|disable`.
///
/// # Errors
/// Configuration, validation or database errors.
pub async fn agents(args: &AgentsArgs) -> anyhow::Result<()> {
    let db = DatabaseConfig::from_args(&args.db)?;
    let pool = crate::db::pool(&db);
    let mut conn = pool.get().await.context("connecting to Postgres")?;
    match &args.command {
        AgentsCommand::Create {
            name,
            max_per_call,
            daily_budget,
        } => {
            let name = name.trim();
            anyhow::ensure!(
                !name.is_empty() && name.len() <= 200,
                "--name must be 1 to 200 characters"
            );
            for (flag, v) in [
                ("--max-per-call", max_per_call),
                ("--daily-budget", daily_budget),
            ] {
                if let Some(v) = v {
                    anyhow::ensure!(
                        parse_decimal_amount(v).is_some(),
                        "{flag} must be a decimal integer of atomic units"
                    );
                }
            }
            let id = Uuid::new_v4();
            let key = generate_api_key().map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
            agents::insert(
                &mut conn,
                id,
                name,
                &hash_api_key(&key),
                max_per_call.as_deref(),
                daily_budget.as_deref(),
            )
            .await
            .context("creating the agent")?;
            println!("{}", json!({ "agent_id": id, "api_key": key }));
        }
        AgentsCommand::Update {
            id,
            name,
            max_per_call,
            daily_budget,
        } => {
            let id = Uuid::parse_str(id).context("ID must be an agent uuid")?;
            let limit = |flag: &str,
                         v: &Option<String>|
             -> anyhow::Result<Option<Option<String>>> {
                match v.as_deref() {
                    None => Ok(None),
                    Some("none") => Ok(Some(None)),
                    Some(a) if parse_decimal_amount(a).is_some() => Ok(Some(Some(a.to_owned()))),
                    Some(_) => {
                        anyhow::bail!("{flag} must be a decimal integer of atomic units, or `none`")
                    }
                }
            };
            let max_per_call = limit("--max-per-call", max_per_call)?;
            let daily_budget = limit("--daily-budget", daily_budget)?;
            if let Some(n) = name {
                anyhow::ensure!(
                    !n.trim().is_empty() && n.trim().len() <= 200,
                    "--name must be 1 to 200 characters"
                );
            }
            let found = agents::update(
                &mut conn,
                id,
                name.as_deref().map(str::trim),
                max_per_call,
                daily_budget,
            )
            .await
            .context("updating the agent")?;
            anyhow::ensure!(found, "no agent {id}");
            for a in agents::list(&mut conn)
                .await?
                .into_iter()
                .filter(|a| a.id == id)
            {
                println!("{}", serde_json::to_string(&a)?);
            }
        }
        AgentsCommand::List => {
            for a in agents::list(&mut conn).await.context("listing agents")? {
                println!("{}", serde_json::to_string(&a)?);
            }
        }
        AgentsCommand::Disable { id } => {
            let id = Uuid::parse_str(id).context("ID must be an agent uuid")?;
            anyhow::ensure!(agents::disable(&mut conn, id).await?, "no agent {id}");
            println!("{}", json!({ "agent_id": id, "disabled": true }));
        }
    }
    Ok(())
}
