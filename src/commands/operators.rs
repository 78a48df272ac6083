//! `operators create|list|revoke`: operator tokens from the command line.

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use uuid::Uuid;

use crate::config::{DatabaseArgs, DatabaseConfig};

#[derive(Debug, Args)]
pub struct OperatorsArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(subcommand)]
    pub command: OperatorsCommand,
}

#[derive(Debug, Subcommand)]
pub enum OperatorsCommand {
    /// Create an operator and print `{"operator_id", "name", "role", "token"}` (the only time
    /// the token is shown).
    Create {
        /// A name (it appears in the operator events).
        #[arg(long)]
        name: String,
        /// `viewer` (audit, receipts, exports, metrics) or `admin` (also changes).
        #[arg(long)]
        role: String,
    },
    /// List operators as JSON lines (never the tokens).
    List,
    /// Revoke an operator: its token is refused (401) from then on.
    Revoke {
        /// The operator's id.
        id: String,
    },
}

/// `operators create|list|revoke`: the same calls, validation and operator events (actor
/// `cli`) as `/admin/operators`. The command line has no bootstrap token: the last live admin
/// is not revoked (create another first).
///
/// # Errors
/// Configuration, validation or database errors.
pub async fn run(args: &OperatorsArgs) -> anyhow::Result<()> {
    use crate::operators::Actor;
    use crate::operators::manage::{self, Bootstrap, NewOperator};
    let db = DatabaseConfig::from_args(&args.db)?;
    let pool = db.pool();
    let mut conn = pool.get().await.context("connecting to Postgres")?;
    let actor = Actor::cli();
    match &args.command {
        OperatorsCommand::Create { name, role } => {
            let new = NewOperator::new(name, role.trim())?;
            let (created, token) = manage::create(&mut conn, &actor, &new).await.context("creating the operator")?;
            println!(
                "{}",
                json!({ "operator_id": created.id, "name": created.name, "role": created.role, "token": token })
            );
        }
        OperatorsCommand::List => {
            for o in manage::list(&mut conn).await.context("listing operators")? {
                println!("{}", serde_json::to_string(&o)?);
            }
        }
        OperatorsCommand::Revoke { id } => {
            let id = Uuid::parse_str(id.trim()).context("ID must be an operator uuid")?;
            let revoked = match manage::revoke(&mut conn, &actor, id, Bootstrap::Absent).await {
                Err(manage::OperatorError::NotFound) => anyhow::bail!("no operator {id}"),
                other => other?,
            };
            println!("{}", json!({ "operator_id": id, "revoked_at": revoked.revoked_at }));
        }
    }
    Ok(())
}
