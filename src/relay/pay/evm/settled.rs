//! What the chain proves about a used authorization: the transaction that consumed it and,
//! for `upto`, the amount its `Transfer` logs show moved. Every ending of a paid call that
//! finds the authorization used (an answer, a paid 402 or 412, a lost answer, a
//! `settlement_pending` claim, a takeover) records the charge from here, never from the
//! upstream's word; what cannot be read now is left to `reconcile` (the intent's charge stays
//! unproven, its maximum reserved, until a run reads it).

use alloy::primitives::{B256, U256};
use uuid::Uuid;

use crate::money::Amount;
use crate::state::AppState;
use crate::x402::SignedPayment;

/// The proof, as far as the chain gave it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Proven {
    /// The transaction that used the authorization (None: not found, or unreadable).
    pub tx_hash: Option<B256>,
    /// `upto`: what it moved to the payee (None: unknown, or not `upto`).
    pub charged: Option<U256>,
    /// Why the proof is missing, when it is.
    pub missing: Option<String>,
}

/// Finds the settling transaction of `signed` (used on-chain), trying `claimed` first, and
/// lowers an `upto` intent's amount to what it moved.
pub(super) async fn prove(
    state: &AppState,
    agent_id: Uuid,
    id: Uuid,
    signed: &SignedPayment,
    claimed: Option<B256>,
) -> Proven {
    let started = std::time::Instant::now();
    let found = signed.settlement_on(&state.chain, claimed).await;
    state.metrics.rpc_seconds.with_label_values(&["settlement"]).observe(started.elapsed().as_secs_f64());
    let proven = match found {
        Ok(Some(p)) => Proven { tx_hash: Some(p.tx_hash), charged: p.transferred, missing: None },
        Ok(None) => Proven {
            missing: Some("the transaction that used the authorization was not found".into()),
            ..Proven::default()
        },
        Err(e) => {
            Proven { missing: Some(format!("the settling transaction could not be found: {e}")), ..Proven::default() }
        }
    };
    lower_upto(state, agent_id, id, signed, &proven).await;
    proven
}

/// The proof from the upstream's claimed transaction alone (one receipt read), if it shows
/// this payment settled by it: the common case, without asking `authorizationState` first.
pub(super) async fn prove_claimed(
    state: &AppState,
    agent_id: Uuid,
    id: Uuid,
    signed: &SignedPayment,
    claimed: B256,
) -> Option<Proven> {
    let started = std::time::Instant::now();
    let found = signed.settled_by(&state.chain, claimed).await;
    state.metrics.rpc_seconds.with_label_values(&["settlement"]).observe(started.elapsed().as_secs_f64());
    let found = found.ok().flatten()?;
    let proven = Proven { tx_hash: Some(found.tx_hash), charged: found.transferred, missing: None };
    lower_upto(state, agent_id, id, signed, &proven).await;
    Some(proven)
}

/// Lowers an `upto` intent's amount to what its settling transaction moved.
async fn lower_upto(state: &AppState, agent_id: Uuid, id: Uuid, signed: &SignedPayment, proven: &Proven) {
    if let Some(charged) = proven.charged.filter(|_| signed.is_upto()) {
        crate::relay::pay::reserve::record_charge(state, agent_id, id, charged).await;
    }
}

/// What the settling transaction of a used authorization whose charge is unproven moved, if it
/// can be found (`reconcile`): Permit2 from the transaction's logs; EIP-3009 signed again for
/// changed terms, what it moved out of the wallet. Unknown: the maximum stays charged.
pub(super) async fn proven_charge(chain: &crate::x402::Chain, signed: &SignedPayment, id: Uuid) -> Option<Amount> {
    match signed.settlement_on(chain, None).await {
        Ok(Some(p)) => match p.transferred {
            Some(moved) => Some(Amount::from_u256(moved)),
            None => match chain.transferred_from(signed.network(), signed.asset(), signed.payer(), p.tx_hash).await {
                Ok(moved) => moved.map(Amount::from_u256),
                Err(e) => {
                    tracing::warn!(payment.id = %id, error = %e, "settling transaction unreadable: the maximum stays charged");
                    None
                }
            },
        },
        Ok(None) => {
            tracing::warn!(payment.id = %id,
                "upto authorization used on-chain, its transaction not found: the maximum stays charged");
            None
        }
        Err(e) => {
            tracing::warn!(payment.id = %id, error = %e,
                "upto authorization used on-chain, its transaction unreadable: the maximum stays charged");
            None
        }
    }
}
