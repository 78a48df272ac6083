//! Integration tests: one binary, real services. See helpers/ for the harness.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod helpers;

mod admin;
mod agents;
mod approvals;
mod audit;
mod auth;
mod batch;
mod batch_settlement;
mod caps;
mod chain_index;
mod cli;
mod concurrency;
mod console;
mod deployment;
mod discovery;
mod failover;
mod fault_points;
mod faults;
mod gas_sponsoring;
mod gc;
mod hostile;
mod idempotency;
mod limits;
mod mcp_paid;
mod money;
mod networks;
mod openapi;
mod operations;
mod operators;
mod payments;
mod pending;
mod permit2;
mod properties;
mod recovery;
mod rpc;
mod secrets;
mod solana;
mod stalls;
mod stops;
mod structure;
mod terms;
mod traces;
mod validation;
