//! The x402 payment flow of a routed call (docs/DESIGN.md §6): select, sign, commit the intent,
//! send, confirm on-chain; and, on a takeover, resume what a previous owner signed.
//!
//! At most one payment per (agent, Idempotency-Key, asset), guaranteed in layers:
//! 1. the idempotency ledger lets one owner at a time run a key;
//! 2. the EIP-3009 nonce is derived from (agent, key, request hash)
//!    ([`x402::deterministic_nonce`]), so every signature ever made for a request under a key
//!    carries the same nonce and the token contract itself accepts at most one of them, even
//!    if Postgres and Redis lost all state; before signing, every configured token is asked;
//! 3. the signed intent is committed to `payments` *before* the paid request leaves, so a
//!    takeover knows exactly what was signed and asks the chain before doing anything:
//!    used → never pay again ("settled, response lost"); unused and valid → resend the
//!    same signed payload; unused and expired → re-sign with the same nonce.
//!
//! After a paid answer the chain is asked whether the authorization was consumed before
//! the receipt says `settled`; an upstream's unconfirmed claim is recorded as such.
//!
//! The walk, top-down: [`pay`] reads the 402 → [`select`] chooses within the agent's limits →
//! [`sign`] signs (nonces checked unused first) → [`reserve`] commits the intent → [`exchange`]
//! sends and [`confirm`]s on-chain. [`resume`] picks up a recorded intent (takeover).
//! [`pay_ahead`] pays known terms with the first request (no unpaid probe), and pays once
//! more, with the same nonce, terms that changed. [`svm`] is the same walk on Solana, taken
//! when no EVM option may be paid and the 402 offers a Solana one.

mod ahead;
mod confirm;
mod exchange;
mod reserve;
mod resume;
mod select;
mod sign;
mod svm;

use std::time::{Duration, Instant};

use alloy::primitives::B256;
use reqwest::StatusCode;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;
use uuid::Uuid;

pub use self::ahead::pay_ahead;
pub use self::resume::resume;
use super::request::RouteCall;
use super::view::{PaymentView, StoredIntent};
use super::{Error, Failure, Outcome, PaymentNote};
use crate::codes::Code;
use crate::faults::{self, Point};
use crate::idempotency::Ownership;
use crate::payments::limits;
use crate::payments::store;
use crate::payments::{Final, PaymentStatus};
use crate::state::AppState;
use crate::upstream::UpstreamResponse;
use crate::x402::{self, SignedPayment, X402Version};

/// Why a payment could not be signed or described (nothing was signed or sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PayError(pub String);

impl From<String> for PayError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for PayError {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}
/// A stored authorization with less validity left than this is re-signed, not resent
/// (the official facilitator wants `validBefore ≥ now + 6 s`).
const MIN_VALIDITY_SECS: u64 = 30;
/// Least time before the route deadline for recovering, within the call, an answer lost in
/// transit.
const MIN_RECOVERY_TIME: Duration = Duration::from_secs(1);
/// How long to wait for a claimed settlement to become visible on-chain.
const SETTLEMENT_POLLS: u32 = 10;
const SETTLEMENT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Why an existing intent of this request is picked up again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// A takeover after the previous owner of the key was abandoned (crashed or frozen).
    Takeover,
    /// The key expired and was reused for the same request.
    KeyReused,
}

/// An authorization ready to send: the ledger row id, the signed message and its header.
struct Attempt {
    id: Uuid,
    version: X402Version,
    signed: SignedPayment,
    header: (HeaderName, HeaderValue),
}
impl Attempt {
    /// The envelope's `payment` object (upto: `amount` is what the chain shows moved, when known).
    fn view(
        &self,
        status: PaymentStatus,
        tx_hash: Option<&str>,
        charged: Option<alloy::primitives::U256>,
    ) -> PaymentView {
        PaymentView::of(self.version, &self.signed, status, tx_hash).charged(charged)
    }
}

/// Handles an upstream's 402 to a fresh (unpaid) request: select, sign, commit the
/// intent, pay, verify.
///
/// # Errors
/// [`Error`] when nothing may be recorded (database gone, lease lost).
pub async fn pay(
    state: &AppState,
    own: &Ownership,
    (call, terms): (&RouteCall, &crate::terms::TermsKey),
    first: UpstreamResponse,
    deadline: Instant,
) -> Result<Outcome, Error> {
    faults::at(state.faults.as_ref(), Point::PaymentRequired).await;
    let required = match x402::wire::parse_payment_required(StatusCode::PAYMENT_REQUIRED, &first.headers, &first.body) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("invalid 402 from upstream: {e}");
            return Ok(Stop::new("invalid_402", Code::UpstreamInvalid402, msg).outcome(state, first));
        }
    };
    state.terms.put(terms.clone(), &required, &first.headers);
    state.discovery.saw(&call.upstream.url, &required);
    let accepts = || Value::Array(required.raw_accepts.clone());
    // The agent's limits, an intent of an earlier attempt and the chain's nonces: read at once.
    let (chosen, existing, nonces) = tokio::join!(
        select::choose(state, own.agent_id, call, &required),
        earlier_intent(state, own),
        sign::check_nonces(state, own)
    );
    let chosen = match chosen? {
        Ok(chosen) => chosen,
        // No EVM option may be paid: a Solana one, when the router pays there (the intent of an
        // earlier attempt first, as below).
        Err(_) if svm::offers(state, &required) => {
            if let Some(intent) = existing? {
                return resume(state, own, call, intent, deadline, Resume::KeyReused).await;
            }
            return svm::pay(state, own, call, &required, first, deadline).await;
        }
        Err((code, why)) => return Ok(declined(state, code, Some(first), &why, accepts())),
    };
    // This very request was paid for under this key before (the key expired and was reused
    // for the same request): never a second payment; resume the recorded intent instead.
    if let Some(intent) = existing? {
        return resume(state, own, call, intent, deadline, Resume::KeyReused).await;
    }
    let signing = match sign::sign_new(state, own, call, (&required, &chosen), nonces)? {
        Ok(signing) => signing,
        Err(stop) => return Ok(stop.outcome(state, first)),
    };
    if let Some(refusal) = reserve::reserve(state, own, &required, &chosen, &signing).await? {
        // An operator's limit refuses it (a concurrent payment may have taken the budget
        // first). This signature is dropped here: it was never stored nor sent.
        return refused(state, refusal, Some(first), accepts());
    }
    tracing::info!(
        agent_id = %own.agent_id, payment.network = %chosen.network(), payment.amount = %chosen.amount(),
        payment.nonce = %short(&signing.nonce), "payment signed and recorded; sending the paid request"
    );
    exchange::exchange(state, own, call, &signing.attempt, deadline).await
}

/// The intent recorded for this very request under this key by an earlier attempt, if any.
async fn earlier_intent(state: &AppState, own: &Ownership) -> Result<Option<store::PaymentRow>, Error> {
    let mut conn = super::error::conn(&state.pool).await?;
    Ok(store::find(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash).await?)
}

/// An unused earlier payment of this request that can no longer be sent or signed again: the
/// terms it was signed for were dropped (past `SECRETS_RETENTION_HOURS`) or cannot be opened.
/// Nothing is signed or paid; the call ends (a new key buys afresh).
fn not_resumable(why: &crate::payments::sealed::NotKept) -> Outcome {
    let msg = format!(
        "an earlier, unused payment of this request under this Idempotency-Key cannot be resumed: {why}; nothing \
         was signed or paid; use a new Idempotency-Key"
    );
    Outcome::Failed(Failure::new(Code::PaymentNotMade, msg))
}

/// Why a call stopped after the upstream's 402 without paying in this attempt.
struct Stop {
    /// The `payments` metric's label.
    metric: &'static str,
    code: Code,
    msg: String,
    payment: Option<PaymentView>,
}

impl Stop {
    fn new(metric: &'static str, code: Code, msg: impl Into<String>) -> Self {
        Self { metric, code, msg: msg.into(), payment: None }
    }

    /// A 502: the 402 is the envelope's known part, and the call gets its receipt.
    fn outcome(self, state: &AppState, first: UpstreamResponse) -> Outcome {
        state.metrics.payments.with_label_values(&[self.metric]).inc();
        let payment = self.payment.map(|shown| PaymentNote { shown, ledger: None });
        Outcome::Failed(Failure::new(self.code, self.msg).upstream(first).payment(payment))
    }
}
/// The outcome of a call cut off by the route deadline. If a payment was signed for the
/// key, it may have left: its state becomes `unknown` (shown in the answer and to
/// operators; `x402-router reconcile` settles the question from the chain later).
///
/// # Errors
/// [`Error`] when the ledger cannot be read.
pub async fn past_deadline(state: &AppState, own: &Ownership) -> Result<Outcome, Error> {
    let mut conn = super::error::conn(&state.pool).await?;
    let intent = store::find(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash).await?;
    let payment = intent.and_then(|row| {
        let shown = match StoredIntent::decode(&row) {
            Ok(intent) => intent.view(PaymentStatus::Unknown, None),
            Err(_) => svm::stored_view(&row, PaymentStatus::Unknown)?,
        };
        let error = Some("route deadline exceeded".into());
        let ledger = Final { id: row.id, status: PaymentStatus::Unknown, tx_hash: None, error, recovery: None };
        Some(PaymentNote { shown, ledger: Some(ledger) })
    });
    let code = if payment.is_some() { Code::PaymentUnknown } else { Code::UpstreamTimeout };
    Ok(Outcome::Failed(Failure::new(code, "route deadline exceeded").timeout(true).payment(payment)))
}
/// The 402 answer when the upstream asks for a payment the router will not make.
fn declined(state: &AppState, code: Code, upstream: Option<UpstreamResponse>, why: &str, accepts: Value) -> Outcome {
    state.metrics.payments.with_label_values(&["declined"]).inc();
    let reason = format!("upstream requires a payment the router will not make: {why}");
    Outcome::Declined { code, upstream, reason, accepts }
}
/// The outcome of a reservation an operator's limit refused: over a budget or off the `payTo`
/// allowlist is the call's recorded answer (402); a pause or a rate limit is an error of the
/// router (503, 429) that records nothing, so the same key can be retried.
fn refused(
    state: &AppState,
    refusal: limits::Refusal,
    upstream: Option<UpstreamResponse>,
    accepts: Value,
) -> Result<Outcome, Error> {
    match refusal {
        limits::Refusal::OverBudget(why) => Ok(declined(state, Code::PaymentOverBudget, upstream, &why, accepts)),
        limits::Refusal::PayToNotAllowed(why) => Ok(declined(state, Code::PaymentNotAllowed, upstream, &why, accepts)),
        other => Err(Error::Refused(other)),
    }
}
/// The RPC endpoint serves another chain: no payment, 503 (the key stays in flight).
fn wrong_chain() -> Error {
    tracing::error!("an RPC endpoint serves another chain than its network; no payment is made");
    Error::PaymentNetworkUnavailable(
        "the payment network's RPC endpoint serves another chain; nothing was signed or paid",
    )
}
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// First bytes of a nonce for logs.
fn short(nonce: &B256) -> String {
    nonce.to_string().chars().take(10).collect()
}
