//! Every RPC endpoint of one Solana network, and the one verdict on a payment that a payer may
//! act on ([`SvmEndpoints::fate`]).
//!
//! Invariants:
//! - The first endpoint (the primary) is the one read to sign, send and follow a payment; the
//!   others (witnesses) are asked only for a payment's fate. Every one serves the network's
//!   genesis hash before it is believed ([`SvmRpc`]).
//! - "Can never land" — what lets a payer sign the same payment again, or release what it
//!   reserved for it — is never one endpoint's word: a lagging, pruned or lying signature index
//!   looks exactly like a transaction that never landed, and nothing on that endpoint tells
//!   them apart (the transaction's id is the fee payer's signature, which the payer never
//!   learns, so its status cannot be read by id). It is believed only when the primary and
//!   every witness, at least one, each say so by their own reads; otherwise
//!   [`SvmRpcError::NoSecondOpinion`] (no witness) or [`SvmRpcError::Disagreement`] or the
//!   failed read: nothing is decided.
//! - A landing any endpoint shows is believed ([`TransferState::Settled`]): it names a
//!   transaction carrying the payer's signature, and believing it can only keep the payer from
//!   paying again.

use super::record::SignedSvmTransfer;
use super::rpc::{SvmRpc, SvmRpcError, TransferState};

/// The endpoints of one network: a primary and its witnesses.
#[derive(Debug)]
pub struct SvmEndpoints {
    primary: SvmRpc,
    witnesses: Vec<SvmRpc>,
}

impl SvmEndpoints {
    /// `primary` and `witnesses`, which must serve the same network.
    ///
    /// # Errors
    /// [`SvmRpcError::Malformed`] when a witness is of another network than the primary.
    pub fn new(primary: SvmRpc, witnesses: Vec<SvmRpc>) -> Result<Self, SvmRpcError> {
        if witnesses.iter().any(|w| w.network() != primary.network()) {
            return Err(SvmRpcError::Malformed("a witness endpoint of another network"));
        }
        Ok(Self { primary, witnesses })
    }

    /// The endpoint read to sign, send and follow payments.
    pub fn primary(&self) -> &SvmRpc {
        &self.primary
    }

    /// How many endpoints confirm a verdict besides the primary.
    pub fn witnesses(&self) -> usize {
        self.witnesses.len()
    }

    /// What the network says of `transfer`, by every endpoint: see the module's invariants.
    ///
    /// # Errors
    /// A failed read, [`SvmRpcError::NoSecondOpinion`] or [`SvmRpcError::Disagreement`]:
    /// nothing is decided then.
    pub async fn fate(&self, transfer: &SignedSvmTransfer) -> Result<TransferState, SvmRpcError> {
        let primary = self.primary.transfer_state(transfer).await;
        if matches!(primary, Ok(TransferState::Settled { .. })) {
            return primary;
        }
        let mut witnesses = Vec::with_capacity(self.witnesses.len());
        for witness in &self.witnesses {
            witnesses.push(witness.transfer_state(transfer).await);
        }
        combine(primary, witnesses)
    }
}

/// The verdict of the primary's and the witnesses' answers.
fn combine(
    primary: Result<TransferState, SvmRpcError>,
    witnesses: Vec<Result<TransferState, SvmRpcError>>,
) -> Result<TransferState, SvmRpcError> {
    if let Some(settled) = witnesses.iter().find_map(|w| w.as_ref().ok().filter(|s| is_settled(s))) {
        return Ok(settled.clone());
    }
    // The primary decides whether the transaction can still land or has landed and failed (its
    // fate then is known without signing anything); "never" needs every witness.
    let primary = primary?;
    if !primary.may_sign_again() {
        return Ok(primary);
    }
    if witnesses.is_empty() {
        return Err(SvmRpcError::NoSecondOpinion);
    }
    for witness in witnesses {
        if !witness?.may_sign_again() {
            return Err(SvmRpcError::Disagreement);
        }
    }
    Ok(primary)
}

fn is_settled(state: &TransferState) -> bool {
    matches!(state, TransferState::Settled { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expired() -> Result<TransferState, SvmRpcError> {
        Ok(TransferState::Expired { block_height: 200 })
    }
    fn pending() -> Result<TransferState, SvmRpcError> {
        Ok(TransferState::Pending { block_height: 100 })
    }
    fn settled() -> Result<TransferState, SvmRpcError> {
        Ok(TransferState::Settled { tx_id: "t".into(), slot: 5, finalized: true })
    }
    fn failed(finalized: bool) -> Result<TransferState, SvmRpcError> {
        Ok(TransferState::Failed { tx_id: "f".into(), slot: 5, finalized, error: "e".into() })
    }
    fn unreadable() -> Result<TransferState, SvmRpcError> {
        Err(SvmRpcError::Transport("down".into()))
    }

    #[test]
    fn never_lands_only_when_every_endpoint_says_so_and_there_are_two() {
        assert!(matches!(combine(expired(), vec![]), Err(SvmRpcError::NoSecondOpinion)));
        assert!(matches!(combine(failed(true), vec![]), Err(SvmRpcError::NoSecondOpinion)));
        assert!(matches!(combine(expired(), vec![expired()]), Ok(TransferState::Expired { .. })));
        assert!(matches!(combine(expired(), vec![failed(true)]), Ok(TransferState::Expired { .. })));
        assert!(matches!(combine(expired(), vec![expired(), pending()]), Err(SvmRpcError::Disagreement)));
        assert!(matches!(combine(expired(), vec![failed(false)]), Err(SvmRpcError::Disagreement)));
        assert!(matches!(combine(expired(), vec![unreadable()]), Err(SvmRpcError::Transport(_))));
        assert!(matches!(combine(expired(), vec![expired(), unreadable()]), Err(SvmRpcError::Transport(_))));
    }

    #[test]
    fn a_landing_any_endpoint_shows_wins_and_the_primary_decides_the_rest() {
        // A lagging primary index: the witness shows the landing.
        assert!(matches!(combine(expired(), vec![settled()]), Ok(TransferState::Settled { .. })));
        assert!(matches!(combine(unreadable(), vec![settled()]), Ok(TransferState::Settled { .. })));
        assert!(matches!(combine(pending(), vec![unreadable(), settled()]), Ok(TransferState::Settled { .. })));
        // Nothing is signed on these: the primary's word is enough.
        assert!(matches!(combine(pending(), vec![]), Ok(TransferState::Pending { .. })));
        assert!(matches!(combine(pending(), vec![expired()]), Ok(TransferState::Pending { .. })));
        assert!(matches!(combine(failed(false), vec![]), Ok(TransferState::Failed { finalized: false, .. })));
        assert!(matches!(combine(unreadable(), vec![expired()]), Err(SvmRpcError::Transport(_))));
    }
}
