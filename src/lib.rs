//! x402-router: AI agents call `POST /route`; the router calls the upstream, pays x402
//! payment requests at most once per (agent, Idempotency-Key), and records a signed receipt.
//!
//! Map (start at `routes/mod.rs`, the route table; docs/ARCHITECTURE.md has the data flow).
//! Every module is listed (checked by `structure::the_lib_map_lists_every_module`).
//!
//! Entry points and HTTP:
//! * `routes/`       HTTP adaptation only (the route table, the OpenAPI document).
//! * `mcp/`          the MCP server (rmcp): five tools (fetch, call_tool, get_receipt, get_budget, discover), stdio and `/mcp`.
//! * `commands/`     the command line: one file per sub-command, its flags and its `run`.
//! * `error/`        the one mapping of errors to HTTP (`error/problem.rs`: RFC 9457 bodies by content negotiation).
//! * `codes`         the machine-readable error codes of every error body.
//! * `console/`      the operator console's static files.
//!
//! Use cases:
//! * `relay/`        the `/route` use case: idempotency, the payment walk and its schemes (`relay/pay/`), recording.
//! * `admin/`        the control plane: agents' limits, settings, pause, the approval queue, the two-person rule, channels.
//! * `approvals/`    payments held for an operator's approval: the gate's decision and its table.
//! * `audit/`        operator queries, exports, gauges (`audit/balance.rs`: the wallet's balance) and `reconcile`.
//! * `recovery`      getting back a paid answer that was lost, by a byte-identical re-send; cannot sign.
//! * `self_service`  what an agent reads about itself: limits, spend, its receipts.
//! * `discovery/`    what agents can buy: facilitators' Bazaar catalogues and the 402s seen, bounded, judged per agent.
//! * `operators/`    operator tokens and roles, the append-only operator events.
//!
//! Domain and storage:
//! * `idempotency/`  key, request fingerprint (JCS), Postgres ledger (the lock), Redis hint, `gc`.
//! * `payments/`     the payment intent ledger: statuses, spend, limits, storage.
//! * `receipts/`     signed receipts and their table.
//! * `secrets/`      what agents forward: sealed at rest, dropped when no longer needed, URLs redacted.
//! * `auth/`         the agents table, the operator token, extractors; `keys`: agent API keys
//!   (generate, hash), issued by `admin`; `auth_throttle`: failed
//!   operator authentications per client address (429 past a limit).
//! * `upstream/`     the HTTP client, its SSRF guard and limits, the known terms upstreams asked (`known_terms`).
//! * `chains/`       the EVM chain index (`X402_WS_URLS`) and the Solana wallet and endpoints.
//! * `x402`          (crates/x402, re-exported) wire types, selection, signing, chain reads, Sign-In-With-X.
//! * `money`, `clock` amounts in atomic units (`x402::money`, re-exported), the wall clock.
//! * `schema_doc`    OpenAPI member schemas shared by the types handlers serialize.
//!
//! Process plumbing:
//! * `config/`       typed settings, one concern per file; `startup` builds the application, `state` is
//!   what handlers share; `db/` pool, schema, migrations, TLS; `metrics`, `telemetry/` (logs, traces,
//!   progress of long commands);
//!   `faults` deterministic fault points for tests (no hook in production).

pub mod admin;
pub mod approvals;
pub mod audit;
pub mod auth;
pub mod auth_throttle;
pub mod chains;
pub mod clock;
pub mod codes;
pub mod commands;
pub mod config;
pub mod console;
pub mod db;
pub mod discovery;
pub mod error;
pub mod faults;
pub mod idempotency;
pub mod keys;
pub mod mcp;
pub mod metrics;
pub mod operators;
pub mod payments;
pub mod receipts;
pub mod recovery;
pub mod relay;
pub mod routes;
pub mod schema_doc;
pub mod secrets;
pub mod self_service;
pub mod startup;
pub mod state;
pub mod telemetry;
pub mod upstream;
// The x402 protocol is its own crate (crates/x402); the amount is the protocol's.
pub use ::x402;
pub use ::x402::money;
