//! The chain index's answers for EVM payments (`crate::chains::evm_index`): what it knows of a
//! payment's nonce, and the wait for the settlement of a payment that just left. Every
//! `Unknown` is read from the chain by the caller, as without an index.

use std::time::Duration;

use alloy::primitives::{Address, B256, U256};

use crate::state::AppState;
use crate::x402::chain::watch::{Seen, Used};
use crate::x402::{Network, SignedPayment};

/// The longest wait for a claimed settlement to reach the index before the chain is read.
const PROOF_WAIT: Duration = Duration::from_millis(300);

/// Counts an answer of the index.
fn count(state: &AppState, answer: &str) {
    state.metrics.chain_index_answers.with_label_values(&[answer]).inc();
}

/// Counts `seen` and passes it on.
fn counted(state: &AppState, seen: Seen) -> Seen {
    count(
        state,
        match seen {
            Seen::Used(_) => "used",
            Seen::Unused => "unused",
            Seen::Unknown => "unknown",
        },
    );
    seen
}

/// What the index says of the payer's EIP-3009 `nonce` on `token` of `network`.
pub(super) fn eip3009(state: &AppState, network: Network, token: Address, nonce: B256) -> Seen {
    let seen = state.indexes.of(network).map_or(Seen::Unknown, |w| w.eip3009(token, nonce));
    counted(state, seen)
}

/// What the index says of the payer's Permit2 `nonce` on `network`.
pub(super) fn permit2(state: &AppState, network: Network, nonce: U256) -> Seen {
    let seen = state.indexes.of(network).map_or(Seen::Unknown, |w| w.permit2(nonce));
    counted(state, seen)
}

/// What the index says of a signed payment's nonce.
pub(super) fn of(state: &AppState, s: &SignedPayment) -> Seen {
    match s {
        SignedPayment::Eip3009(_) => eip3009(state, s.network(), s.asset(), s.nonce()),
        SignedPayment::Permit2(p) => permit2(state, s.network(), p.nonce()),
    }
}

/// The settlement of an EIP-3009 payment that just left, as soon as the index sees it, for at
/// most [`PROOF_WAIT`] (and never past `left`). `None`: read the chain.
pub(super) async fn settlement(state: &AppState, s: &SignedPayment, left: Duration) -> Option<Used> {
    let SignedPayment::Eip3009(_) = s else { return None };
    let watch = state.indexes.of(s.network())?;
    let found = watch.wait_eip3009(s.asset(), s.nonce(), PROOF_WAIT.min(left)).await;
    count(state, if found.is_some() { "proof" } else { "no_proof" });
    found
}
