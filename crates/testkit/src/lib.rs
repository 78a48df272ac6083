//! Test support shared by the router's tests (`tests/api`), the chaos harness and the
//! benchmarks (`examples/`): child processes killed on drop, free ports, waiting with a
//! deadline instead of sleeping, a TCP fault proxy, test databases, the ledger's money
//! invariants, and the local Solana chain with the official x402 SVM servers ([`solana`]).
//!
//! The one place allowed to pause: [`wait`]. Everything else waits for an event through it.

pub mod db;
pub mod invariants;
pub mod ports;
pub mod proc;
pub mod proxy;
pub mod solana;
pub mod wait;

pub use ports::{free_port, wait_port};
pub use proc::Proc;
pub use proxy::Proxy;
pub use wait::{Deadline, TimedOut, wait_for, wait_until};
