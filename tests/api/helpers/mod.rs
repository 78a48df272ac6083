//! Test harness: real Postgres (a database per test), real Redis (a key prefix per
//! test, or a private server), a real HTTP upstream, and the router in-process or as
//! real processes.

#![allow(dead_code)]

pub mod app;
pub mod chain;
pub mod db;
pub mod freeze;
pub mod ledger;
pub mod mcp_upstream;
pub mod official;
pub mod pg_replication;
pub mod services;
pub mod solana;
pub mod tls_services;
pub mod upstream;

pub use app::*;
pub use chain::{
    BareAnvil, Devnet, PAY_TO, PRICE, ROUTER_ADDRESS, SecondUpstream, crash_after_signing, paid_app_with,
    reconcile_now, router_nonce, settle_kept,
};
pub use db::TestDb;
pub use freeze::{freeze_at, hold_at};
pub use ledger::Seed;
pub use mcp_upstream::McpUpstream;
pub use official::Official;
pub use services::PrivateRedis;
pub use solana::{SVM_PRICE, SolanaRig};
pub use upstream::TestUpstream;
pub use x402_router_testkit::Proxy as TcpProxy;
pub use x402_router_testkit::invariants;
