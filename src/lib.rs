//! x402-router: AI agents call `POST /route`; the router calls the upstream, pays x402
//! payment requests at most once per (agent, Idempotency-Key), and records a signed receipt.
//!
//! Map (start at `routes/mod.rs`, the route table):
//! * `routes/`       HTTP adaptation only.
//! * `routing/`      the `/route` use case: idempotency around the upstream call, recording.
//! * `idempotency/`  key, request fingerprint (JCS), Postgres ledger (the lock), Redis hint.
//! * `payments/`     the x402 flow: selection, signing, the payment ledger, settlement checks.
//! * `x402/`         x402 wire types (v1, v2), requirement selection, EIP-3009 signing, chain reads.
//! * `upstream/`     the HTTP client, its SSRF guard and limits.
//! * `receipts/`     signed receipts and their table.
//! * `auth/`         agent API keys, the operator token, the `agents` table.
//! * `mcp/`          the MCP server (rmcp): tools fetch/get_receipt/get_budget, stdio and `/mcp`.
//! * `self_service`  what an agent reads about itself: limits, spend, its receipts.
//! * `audit/`        operator queries (receipts, idempotency, payments, spend) and `reconcile`.
//! * `db/`           pool, schema, embedded migrations.
//! * `gc`            deletion of expired idempotency rows.
//! * `problem`       RFC 9457 problem+json error bodies, by content negotiation.
//! * `codes`         the machine-readable error codes of every error body.
//! * `config`, `cli`, `commands`, `startup`, `state`, `error`, `metrics`, `telemetry`: plumbing.

pub mod audit;
pub mod auth;
pub mod cli;
pub mod codes;
pub mod commands;
pub mod config;
pub mod db;
pub mod error;
pub mod gc;
pub mod idempotency;
pub mod mcp;
pub mod metrics;
pub mod payments;
pub mod problem;
pub mod receipts;
pub mod routes;
pub mod routing;
pub mod self_service;
pub mod startup;
pub mod state;
pub mod telemetry;
pub mod upstream;
pub mod x402;
