//! A paid request answered with a settlement claim and no answer: `settlement_pending`.
//!
//! The official facilitator broadcasts the transfer, waits for its receipt, and when that
//! wait fails the resource server answers **402 with a `PAYMENT-RESPONSE`** (`success: false`,
//! `errorReason: "settlement_pending"`, `transaction`: the broadcast hash) instead of the
//! handler's answer. The transfer may still be mined. So a 402 that carries a settlement
//! header is never a refusal here:
//!
//! - the intent stays reserved (it is never `rejected` on the upstream's word);
//! - the chain is watched until the route deadline: the authorization's own state
//!   (`authorizationState(payer, nonce)`, Permit2 `nonceBitmap`) decides; the claimed hash is only a hint, recorded as
//!   `tx_hash` only when its receipt shows this authorization used;
//! - used ⇒ `settled_response_lost` with the proven transaction (paid; the upstream withheld
//!   its answer, so the call was not served); the key is final and never paid again;
//! - the claimed transaction mined without using the authorization ⇒ `rejected` (still
//!   reserved: the upstream holds the signed authorization until `validBefore`);
//! - nothing decided by the deadline ⇒ `unknown`, the claimed hash kept in the ledger's `error`
//!   and shown as `claimed_tx_hash`; `x402-router reconcile` settles or expires it later.
//!
//! Nothing here signs: a retry of the key replays the recorded outcome, and a takeover or a
//! re-sent request resumes the one recorded intent (same nonce: the token accepts it once).

use std::time::{Duration, Instant};

use alloy::primitives::B256;

use super::Evm;
use crate::codes::Code;
use crate::payments::{Final, PaymentStatus};
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{Attempt, Scheme};
use crate::relay::{Failure, Outcome, PaymentNote, remaining};
use crate::state::AppState;
use crate::upstream::UpstreamResponse;
use crate::x402::{self, SignedPayment};

/// First and longest pause between two looks at the chain.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// True when the answer carries a settlement header (`PAYMENT-RESPONSE` or
/// `X-PAYMENT-RESPONSE`), readable or not: the upstream says it acted on the payment.
pub(super) fn claims_settlement(resp: &UpstreamResponse) -> bool {
    [x402::wire::PAYMENT_RESPONSE_HEADER, x402::wire::X_PAYMENT_RESPONSE_HEADER]
        .iter()
        .any(|h| resp.headers.contains_key(*h))
}

/// What the chain said while it was watched.
enum Watched {
    /// The authorization is used.
    Used,
    /// The claimed transaction was mined and the authorization is still unused.
    ClaimFailed(B256),
    /// Nothing decided by the deadline (the last read error, if the chain did not answer).
    Deadline(Option<String>),
}

/// Watches the authorization until it is used, the claimed transaction is mined without
/// using it, or the deadline leaves no time for another look.
async fn watch<U, F>(state: &AppState, s: &SignedPayment, used: &U, hint: Option<B256>, deadline: Instant) -> Watched
where
    U: Fn() -> F,
    F: Future<Output = Result<bool, x402::ChainError>>,
{
    let mut pause = FIRST_PAUSE;
    loop {
        let last_error = match used().await {
            Ok(true) => return Watched::Used,
            Ok(false) => {
                if let Some(hash) = hint
                    && let Ok(Some(_)) = state.chain.transaction_status(s.network(), hash).await
                {
                    // Mined: it either used the authorization (read again: it may have been
                    // mined between the two reads) or it never will.
                    return match used().await {
                        Ok(true) => Watched::Used,
                        Ok(false) => Watched::ClaimFailed(hash),
                        Err(e) => Watched::Deadline(Some(e.to_string())),
                    };
                }
                None
            }
            Err(e) => Some(e.to_string()),
        };
        if remaining(deadline) <= pause {
            return Watched::Deadline(last_error);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// The outcome of a 402 that carries a settlement claim.
pub(super) async fn unanswered(pc: &PaidCall<'_>, attempt: &Attempt<SignedPayment>, resp: UpstreamResponse) -> Outcome {
    let (state, own, deadline) = (pc.state, pc.own, pc.deadline);
    let claim = x402::wire::parse_settlement(&resp.headers).ok().flatten();
    let hint = claim.as_ref().and_then(|c| c.tx_hash);
    let reason = claim.as_ref().and_then(|c| c.error_reason.clone());
    let said = reason.as_deref().unwrap_or("no errorReason");
    let s = &attempt.signed;
    tracing::warn!(agent_id = %own.agent_id, upstream.status = resp.status, payment.claimed_tx = ?hint,
        "the upstream answered the paid request with a settlement claim and no answer; watching the chain");
    let used = || super::confirm::chain_used(state, s);
    let watched = watch(state, s, &used, hint, deadline).await;
    let mut charged = None;
    let (status, code, tx_hash, msg, error) = match watched {
        Watched::Used => {
            // What the chain proves moved (upto: charged that, never the upstream's word).
            let proven = super::settled::prove(state, own.agent_id, attempt.id, s, hint).await;
            charged = proven.charged;
            let tx = proven.tx_hash.map(|h| h.to_string());
            let named = tx.as_deref().unwrap_or("not found in the recent logs");
            let msg = format!(
                "the upstream answered {} ({said}) instead of its answer; the payment settled on-chain (transaction \
                 {named}): paid, not served. The router will not pay again for this call",
                resp.status
            );
            let mut error =
                format!("{said}: settled on-chain; the upstream answered {} without its answer", resp.status);
            if let Some(h) = hint.filter(|h| tx.as_deref() != Some(h.to_string().as_str())) {
                error.push_str(&format!("; the claimed transaction {h} is not the one that used the authorization"));
            }
            (PaymentStatus::SettledResponseLost, Code::SettledResponseLost, tx, msg, error)
        }
        Watched::ClaimFailed(hash) => {
            let msg = format!(
                "the upstream answered {} ({said}), but its transaction {hash} was mined without using this \
                 authorization; nothing moved (the upstream still holds the signed authorization until it expires)",
                resp.status
            );
            let error = format!("{said}: the claimed transaction {hash} did not use the authorization");
            (PaymentStatus::Rejected, Code::PaymentRejected, None, msg, error)
        }
        Watched::Deadline(read_error) => {
            let claimed = hint.map_or_else(|| "no transaction".to_owned(), |h| format!("transaction {h}"));
            let why = read_error.map_or_else(|| "not seen on-chain".to_owned(), |e| format!("chain unreadable: {e}"));
            let msg = format!(
                "the upstream answered {} ({said}, {claimed}) instead of its answer, and the payment was {why} \
                 before the route deadline; it may still settle until the authorization expires (reconcile decides)",
                resp.status
            );
            let error = format!("{said}: the upstream named {claimed}; {why} before the route deadline");
            (PaymentStatus::Unknown, Code::PaymentUnknown, None, msg, error)
        }
    };
    pc.count(status.as_str());
    pc.count_paid(&Evm, s, status, charged);
    tracing::info!(agent_id = %own.agent_id, payment.status = status.as_str(), "settlement claim decided");
    let shown =
        Evm.view(attempt.version, &attempt.nonce, s, (status, tx_hash.as_deref(), charged)).claimed_tx_hash(hint);
    let ledger = Final { id: attempt.id, status, tx_hash, error: Some(error), recovery: None };
    Outcome::Failed(
        Failure::new(code, msg)
            .upstream(resp)
            .payment(Some(PaymentNote { shown, ledger: Some(ledger) }))
            .reason("errorReason", reason),
    )
}
