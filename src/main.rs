//! `x402-router`: parse the command line and dispatch. No logic lives here.

use clap::Parser;
use x402_router::cli::{Cli, Command};
use x402_router::commands;

#[actix_web::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Serve(args) => commands::serve(args).await,
        Command::Migrate(args) => commands::migrate(args).await,
        Command::Gc(args) => commands::gc(args).await,
        Command::Agents(args) => commands::agents(args).await,
        Command::Operators(args) => commands::operators(args).await,
        Command::Reconcile(args) => commands::reconcile(args).await,
        Command::Mcp(args) => commands::mcp(args).await,
        Command::Wallet(args) => commands::wallet(args).await,
        Command::Openapi => {
            print!("{}", x402_router::routes::openapi::json());
            Ok(())
        }
        // Prints its own verdict and chooses its exit code (0 valid, 1 invalid, 2 unreadable).
        Command::Receipts(args) => return commands::receipts(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
