//! `x402-test-upstream` — a development fixture: a local x402 resource server and the tool that
//! puts its token on a local chain.
//!
//! * `deploy` deploys `contracts/TestToken.sol` (bytecode embedded from
//!   `tests/fixtures/TestToken.json`), installs the Multicall fixture's runtime code at
//!   Multicall3's canonical address, our own Permit2 and x402 Permit2 proxies
//!   (`contracts/Permit2.sol`, `contracts/X402*Permit2Proxy.sol`) and x402 batch-settlement
//!   channel contract and deposit collectors (`contracts/X402BatchSettlement.sol`,
//!   `contracts/*DepositCollector.sol`) at their canonical addresses,
//!   mints, approves Permit2 from the `--approve-permit2` keys, and prints `{"token": "0x…", "chain_id": N}`.
//! * `serve` runs an actix-web x402 server (v1 and v2 wire formats) that verifies payments
//!   itself, settles them on chain with `transferWithAuthorization` from a facilitator key, and
//!   misbehaves on purpose on some routes (`server::ROUTES` is the table); `/v2/permit2` and
//!   `/v2/upto` take Permit2 payments and settle them through the proxies (`permit2.rs`). It prints
//!   `{"listening": "127.0.0.1:PORT"}` once bound.
//!
//! * `serve-svm` serves SVM `exact` routes (`svm.rs`) over a Solana RPC (e.g. tools/solana-chain):
//!   it checks each payment transaction itself, co-signs it as the fee payer and submits it, and
//!   misbehaves on purpose on some routes.
//!
//! This crate deliberately shares no code with the `x402` crate (crates/x402) nor the router: a fixture
//! that reused the code under test would agree with its bugs. Everything here (wire types,
//! EIP-712 recovery, settlement) is written against the protocol, not against the router.

mod chain;
mod cli;
mod deploy;
mod fixtures;
mod payment;
mod permit2;
mod server;
mod stats;
mod svm;
mod wire;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // Logs go to stderr: stdout carries exactly one JSON line for the caller to parse.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();

    let cli = cli::Cli::parse();
    let system = actix_rt::System::new();
    let result = match cli.command {
        cli::Command::Deploy(args) => system.block_on(deploy::run(args)),
        cli::Command::Serve(args) => system.block_on(server::run(*args)),
        cli::Command::ServeSvm(args) => system.block_on(svm::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("x402-test-upstream: {err:#}");
            ExitCode::FAILURE
        }
    }
}
