//! What the chain says about a payment: whether its nonce is used (EIP-3009
//! `authorizationState`, Permit2 `nonceBitmap`), on any configured token before signing, and,
//! after a paid answer, whether and by which transaction it settled.

use std::time::Instant;

use alloy::primitives::{Address, B256};
use uuid::Uuid;

use crate::payments::PaymentStatus;
use crate::relay::pay::{SETTLEMENT_POLL_INTERVAL, SETTLEMENT_POLLS};
use crate::relay::remaining;
use crate::state::AppState;
use crate::x402::{self, Network, SignedPayment};

/// What [`confirm`] found: the status, the proven transaction, a note for the ledger, and
/// (Permit2) the amount the chain shows moved.
pub(super) type Confirmed = (PaymentStatus, Option<String>, Option<String>, Option<alloy::primitives::U256>);

/// Asks the chain whether the authorization was consumed. A claimed success is given a
/// moment to appear; a claimed transaction must exist and have succeeded to be recorded.
/// An `upto` answer whose claim charges nothing is not waited for: nothing is expected to
/// move, and the authorization stays reserved until the chain shows it used or expired.
pub(super) async fn confirm(
    state: &AppState,
    (agent_id, id): (Uuid, Uuid),
    s: &SignedPayment,
    claim: Option<&x402::SettlementResponse>,
    deadline: Instant,
) -> Confirmed {
    let claimed = claim.is_some_and(|c| c.success);
    let claims_nothing = s.is_upto() && claim.and_then(|c| c.amount).is_some_and(|a| a.is_zero());
    // `settlement_pending` beside an answer: broadcast, maybe not mined yet; watch it until the
    // deadline (then `unknown`, for reconcile), never call it unsettled after one look.
    let pending = claim.is_some_and(x402::SettlementResponse::is_pending);
    let polls = if pending {
        u32::MAX
    } else if claimed && !claims_nothing {
        SETTLEMENT_POLLS
    } else {
        1
    };
    let unknown = || {
        (
            PaymentStatus::Unknown,
            None,
            Some("settlement not confirmed before the route deadline; reconcile decides from the chain".into()),
            None,
        )
    };
    // The chain index saw the settlement: proven without a read (a claimed hash that is not
    // the transaction that used the nonce is noted, never recorded).
    if claimed
        && !pending
        && let Some(used) = super::index::settlement(state, s, remaining(deadline)).await
    {
        let proven = super::settled::Proven { tx_hash: Some(used.tx), charged: None, missing: None };
        return settled_as(claim, proven);
    }
    // A claimed transaction whose receipt shows this payment settled proves it in one read.
    if claimed
        && !pending
        && let Some(hash) = claim.and_then(|c| c.tx_hash)
        && let Some(proven) = super::settled::prove_claimed(state, agent_id, id, s, hash).await
    {
        return settled_as(claim, proven);
    }
    let mut used = Ok(false);
    for i in 0..polls {
        if i > 0 {
            tokio::time::sleep(SETTLEMENT_POLL_INTERVAL).await;
        }
        if remaining(deadline).is_zero() {
            return unknown();
        }
        used = chain_used(state, s).await;
        if matches!(used, Ok(true)) {
            break;
        }
        if i + 1 < polls && remaining(deadline) < SETTLEMENT_POLL_INTERVAL {
            return unknown();
        }
    }
    match used {
        Ok(true) => settled(state, (agent_id, id), s, claim).await,
        Ok(false) if claims_nothing => (
            PaymentStatus::NotSettled,
            None,
            Some("upto: the upstream charged nothing; the authorization stays reserved until its deadline".into()),
            None,
        ),
        Ok(false) if claimed => (
            PaymentStatus::Unconfirmed,
            None,
            Some("the upstream claimed settlement, but the authorization is unused on-chain".into()),
            None,
        ),
        Ok(false) => (PaymentStatus::NotSettled, None, None, None),
        Err(e) => (PaymentStatus::Unknown, None, Some(format!("settlement could not be checked: {e}")), None),
    }
}

/// The authorization is used: record only the transaction the chain shows consuming this
/// nonce, whatever the upstream claims, and (Permit2) the amount its logs show moving.
async fn settled(
    state: &AppState,
    (agent_id, id): (Uuid, Uuid),
    s: &SignedPayment,
    claim: Option<&x402::SettlementResponse>,
) -> Confirmed {
    let claimed_hash = claim.and_then(|c| c.tx_hash);
    let proven = super::settled::prove(state, agent_id, id, s, claimed_hash).await;
    settled_as(claim, proven)
}

/// `Settled`, with the transaction the chain shows and a note where the claim disagrees.
fn settled_as(claim: Option<&x402::SettlementResponse>, proven: super::settled::Proven) -> Confirmed {
    let claimed_hash = claim.and_then(|c| c.tx_hash);
    let charged = proven.charged;
    let claimed_amount = claim.and_then(|c| c.amount);
    let (tx, mut note) = match proven.tx_hash {
        Some(h) if Some(h) == claimed_hash || claimed_hash.is_none() => (Some(h.to_string()), None),
        Some(h) => (
            Some(h.to_string()),
            claimed_hash.map(|c| format!("the claimed transaction {c} did not use this authorization")),
        ),
        None => (None, proven.missing),
    };
    if let (Some(moved), Some(said)) = (charged, claimed_amount)
        && moved != said.as_u256()
        && note.is_none()
    {
        note = Some(format!("the upstream claimed it charged {said}; the chain shows {moved} moved"));
    }
    (PaymentStatus::Settled, tx, note, charged)
}

/// The first configured `(network, asset)` on which the request's EIP-3009 nonce, or its
/// Permit2 nonce (asset: Permit2), is used, if any. Any unreadable chain is an error: nothing
/// is signed without every answer. A network without Permit2 code has used no Permit2 nonce;
/// a token configured without EIP-3009 (`+permit2`) has no EIP-3009 nonce to ask.
pub(super) async fn used_anywhere(
    state: &AppState,
    payer: Address,
    eip3009_nonce: B256,
    permit2_nonce: alloy::primitives::U256,
) -> Result<Option<(Network, Address)>, x402::ChainError> {
    use x402::chain::watch::Seen;
    // The chain index answers first; only what it cannot say is read, every question at once
    // (independent reads); the answers are taken in configuration order, EIP-3009 tokens
    // first, as a sequential walk would.
    let tokens: Vec<(Network, Address)> =
        state.supported.payable_assets().filter(|(n, a)| !state.supported.is_permit2_only(*n, *a)).collect();
    let mut networks: Vec<Network> = state.supported.payable_assets().map(|(n, _)| n).collect();
    networks.dedup();
    let indexed_tokens: Vec<Seen> =
        tokens.iter().map(|(n, a)| super::index::eip3009(state, *n, *a, eip3009_nonce)).collect();
    let indexed_permit2: Vec<Seen> = networks.iter().map(|n| super::index::permit2(state, *n, permit2_nonce)).collect();
    let (token_answers, permit2_answers) = futures_util::future::join(
        futures_util::future::join_all(tokens.iter().zip(&indexed_tokens).map(|((n, a), seen)| async move {
            match seen {
                Seen::Used(_) => Ok(true),
                Seen::Unused => Ok(false),
                Seen::Unknown => eip3009_used(state, *n, *a, payer, eip3009_nonce).await,
            }
        })),
        futures_util::future::join_all(networks.iter().zip(&indexed_permit2).map(|(n, seen)| async move {
            match seen {
                Seen::Used(_) => Ok(true),
                Seen::Unused => Ok(false),
                Seen::Unknown => permit2_used(state, *n, payer, permit2_nonce).await,
            }
        })),
    )
    .await;
    for (found, answer) in tokens.iter().zip(token_answers) {
        if answer? {
            return Ok(Some(*found));
        }
    }
    for (network, answer) in networks.iter().zip(permit2_answers) {
        if answer? {
            return Ok(Some((*network, x402::permit2::PERMIT2)));
        }
    }
    Ok(None)
}

/// Whether Permit2 on `network` shows the nonce used (a network without Permit2 code has
/// used none).
async fn permit2_used(
    state: &AppState,
    network: Network,
    payer: Address,
    nonce: alloy::primitives::U256,
) -> Result<bool, x402::ChainError> {
    let started = Instant::now();
    let r = state.chain.permit2_nonce_used(network, payer, nonce).await;
    state.metrics.rpc_seconds.with_label_values(&["nonceBitmap"]).observe(started.elapsed().as_secs_f64());
    match r {
        Ok(used) => Ok(used),
        Err(x402::ChainError::NoContract { .. }) => Ok(false),
        Err(e) => {
            state.metrics.rpc_errors.with_label_values(&["nonceBitmap"]).inc();
            Err(e)
        }
    }
}
/// Whether the signed payment's nonce is used on-chain (EIP-3009 `authorizationState`,
/// Permit2 `nonceBitmap`).
pub(super) async fn chain_used(state: &AppState, signed: &SignedPayment) -> Result<bool, x402::ChainError> {
    let method = match signed {
        SignedPayment::Eip3009(_) => "authorizationState",
        SignedPayment::Permit2(_) => "nonceBitmap",
    };
    let started = Instant::now();
    let r = signed.used_on(&state.chain).await;
    state.metrics.rpc_seconds.with_label_values(&[method]).observe(started.elapsed().as_secs_f64());
    if r.is_err() {
        state.metrics.rpc_errors.with_label_values(&[method]).inc();
    }
    r
}
async fn eip3009_used(
    state: &AppState,
    network: Network,
    asset: Address,
    payer: Address,
    nonce: B256,
) -> Result<bool, x402::ChainError> {
    let started = Instant::now();
    let r = state.chain.authorization_state(network, asset, payer, nonce).await;
    state.metrics.rpc_seconds.with_label_values(&["authorizationState"]).observe(started.elapsed().as_secs_f64());
    if r.is_err() {
        state.metrics.rpc_errors.with_label_values(&["authorizationState"]).inc();
    }
    r
}
