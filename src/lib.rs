//! x402-router: AI agents call `POST /route`; the router calls the upstream, pays x402
//! payment requests at most once per (agent, Idempotency-Key), and records a signed receipt.
//!
//! Map (start at `routes/mod.rs`, the route table; docs/ARCHITECTURE.md has the data flow):
//! * `routes/`       HTTP adaptation only (the route table), and `error` maps errors to HTTP.
//! * `relay/`        the `/route` use case: idempotency, the payment flow (`relay/pay/`), recording.
//! * `idempotency/`  key, request fingerprint (JCS), Postgres ledger (the lock), Redis hint.
//! * `payments/`     the payment intent ledger: statuses, spend, storage.
//! * `x402`          (crates/x402, re-exported) x402 wire types (v1, v2), requirement selection, EIP-3009 and Permit2 signing, chain reads,
//!   Sign-In-With-X sign-in messages (`x402::siwx`, used by `relay/reaccess.rs`).
//! * `money`, `clock` amounts in atomic units (one parser; `x402::money`, re-exported), the wall clock.
//! * `upstream/`     the HTTP client, its SSRF guard and limits.
//! * `receipts/`     signed receipts and their table.
//! * `recovery`      getting back a paid answer that was lost, by a byte-identical re-send; cannot sign.
//! * `secrets/`      what agents forward: sealed at rest, dropped when no longer needed, URLs redacted.
//! * `auth/`         agent API keys, the operator token, the `agents` table.
//! * `auth_throttle` failed operator authentications per client address (429 past a limit).
//! * `mcp/`          the MCP server (rmcp): tools fetch/get_receipt/get_budget/discover, stdio and `/mcp`.
//! * `discovery/`    what agents can buy: facilitators' Bazaar catalogues and the 402s seen, bounded, judged per agent.
//! * `self_service`  what an agent reads about itself: limits, spend, its receipts.
//! * `audit/`        operator queries (receipts, idempotency, payments, spend) and `reconcile`.
//! * `db/`           pool, schema, embedded migrations (under an advisory lock), TLS (`db/tls.rs`).
//! * `gc`            deletion of expired idempotency rows (and, by the command, of old sealed requests).
//! * `faults`        deterministic fault points for tests (no hook in production).
//! * `wallet`        the paying wallet's balance gauge.
//! * `chain_index`   per EVM network, the live index of the wallet's payments (`X402_WS_URLS`): the paid path's chain reads.
//! * `solana`        the Solana wallet, networks and RPC endpoints (the walk is `relay/pay/svm/`).
//! * `approve`       `wallet approve-permit2`: the one transaction the router's wallet sends itself.
//! * `problem`       RFC 9457 problem+json error bodies, by content negotiation.
//! * `codes`         the machine-readable error codes of every error body.
//! * `config`, `cli`, `commands`, `startup`, `state`, `error`, `metrics`, `telemetry`: plumbing.

pub mod admin;
pub mod approvals;
pub mod approve;
pub mod audit;
pub mod auth;
pub mod auth_throttle;
pub mod chain_index;
pub mod cli;
pub mod clock;
pub mod codes;
pub mod commands;
pub mod config;
pub mod console;
pub mod db;
pub mod discovery;
pub mod error;
pub mod faults;
pub mod gc;
pub mod idempotency;
pub mod keys;
pub mod mcp;
pub mod metrics;
pub mod operators;
pub mod payments;
pub mod problem;
pub mod receipts;
pub mod recovery;
pub mod relay;
pub mod routes;
pub mod schema_doc;
pub mod secrets;
pub mod self_service;
pub mod solana;
pub mod startup;
pub mod state;
pub mod telemetry;
pub mod terms;
pub mod upstream;
pub mod wallet;
// The x402 protocol is its own crate (crates/x402); the amount is the protocol's.
pub use ::x402;
pub use ::x402::money;
