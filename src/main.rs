//! `x402-router`: parse the command line and dispatch (`commands::run`). No logic lives here.

use clap::Parser;
use x402_router::commands::{self, Cli};

#[actix_web::main]
async fn main() -> std::process::ExitCode {
    commands::run(&Cli::parse()).await
}
