//! Secrets at rest (issue 38; docs/DESIGN.md §10, docs/operations.md "Secrets at rest").
//!
//! What an agent forwards to an upstream (every header: the router cannot tell which one is
//! a credential; the full URL; the body) and what repeats it (the 402's `resource`, the
//! payment header) are needed after the call only to re-send or re-sign a paid request
//! (a takeover, recovery of a lost answer, SIWX re-access). So they are:
//!
//! - written only sealed ([`keyring`]: AES-256-GCM under `SECRETS_KEY_FILE`'s first key, or
//!   a key derived from the wallet key), bound to their ledger row ([`intent`]);
//! - dropped once nothing can need them: when the payment is `settled` (its answer served or
//!   recovered), and by `gc` past `SECRETS_RETENTION_HOURS` whatever its state;
//! - shown only redacted ([`redact`]): a URL's secret query parameters (`REDACT_QUERY_PARAMS`)
//!   in receipts (signed as shown), the ledger's clear columns, the audit API and its CSV,
//!   the recovery log. The upstream always gets the real request;
//! - and rows written before this version are sealed or dropped, and their URLs redacted, by
//!   [`sweep`] when `serve` starts.
//!
//! Logs never carry them: the router logs an upstream's host and method only, reqwest
//! errors are stripped of their URL, and the libraries that log requests (HTTP, MCP) are
//! held at `info` whatever `RUST_LOG` says (`telemetry`).

pub mod intent;
pub mod keyring;
pub mod redact;
pub mod sweep;

pub use keyring::{DERIVED_KEY_ID, Keyring, KeyringError, SealError, Unsealed};
pub use redact::Redaction;
