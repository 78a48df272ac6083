//! The command line: `serve`, `migrate`, `gc`, `agents …`, `operators …`, `reconcile`,
//! `receipts verify`, `wallet approve-permit2`, `mcp`, `openapi`. One [`Command`] enum, one
//! `match` ([`run`]); each sub-command is a file here holding its own flags and its `run`.
//!
//! Every setting can come from a flag or from the environment variable named in its
//! help. Values arrive as raw strings on purpose: `config` turns them into typed settings
//! (the flags of settings shared by several commands live there, beside what they become) and
//! reports a missing or malformed one in a single line that names it.

use clap::{Parser, Subcommand};

pub mod agents;
pub mod gc;
pub mod mcp;
pub mod migrate;
pub mod operators;
pub mod receipts;
pub mod reconcile;
pub mod serve;
pub mod wallet;

#[derive(Debug, Parser)]
#[command(name = "x402-router", version, about = "Pays x402 APIs for AI agents, at most once per Idempotency-Key")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service (runs pending migrations first unless --no-migrate).
    Serve(Box<crate::config::ServeArgs>),
    /// Apply pending database migrations and exit.
    Migrate(crate::config::DatabaseArgs),
    /// Delete expired idempotency rows in bounded batches; prints how many were removed.
    Gc(gc::GcArgs),
    /// Manage agents (the callers of POST /route).
    Agents(Box<agents::AgentsArgs>),
    /// Manage operator tokens (the callers of /audit/*, the exports and /metrics).
    Operators(operators::OperatorsArgs),
    /// Re-check stale payment intents against the chain (safe to run from cron, idempotent);
    /// prints one JSON line of counts, exits non-zero if any intent could not be checked.
    Reconcile(Box<reconcile::ReconcileArgs>),
    /// Offline receipt tools.
    Receipts(receipts::ReceiptsArgs),
    /// Transactions from the router's own wallet (ROUTER_PRIVATE_KEY).
    Wallet(wallet::WalletArgs),
    /// Serve the MCP tools (fetch, call_tool, get_receipt, get_budget, discover) on stdin/stdout, as a client of
    /// a running router (no database access).
    Mcp(mcp::McpArgs),
    /// Print the OpenAPI 3.1 document (the one served at GET /openapi.json) on stdout.
    Openapi,
}

/// Runs one parsed command line; errors are printed as one line and exit non-zero.
pub async fn run(cli: &Cli) -> std::process::ExitCode {
    let result = match &cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Migrate(args) => migrate::run(args).await,
        Command::Gc(args) => gc::run(args).await,
        Command::Agents(args) => agents::run(args).await,
        Command::Operators(args) => operators::run(args).await,
        Command::Reconcile(args) => reconcile::run(args).await,
        Command::Mcp(args) => mcp::run(args).await,
        Command::Wallet(args) => wallet::run(args).await,
        Command::Openapi => {
            print!("{}", crate::routes::openapi::json());
            Ok(())
        }
        // Prints its own verdict and chooses its exit code (0 valid, 1 invalid, 2 unreadable).
        Command::Receipts(args) => return receipts::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
