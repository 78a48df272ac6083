//! The x402 payment walk of a routed call (docs/DESIGN.md §6), written once over the payment
//! schemes ([`scheme::Scheme`]; `evm/`, `svm/`, registered in [`registry`]): choose → sign →
//! reserve → send → confirm → record, and, on a takeover or a reused key, resume what a
//! previous attempt signed.
//!
//! At most one payment per (agent, Idempotency-Key, request), guaranteed in layers:
//! 1. the idempotency ledger lets one owner at a time run a key;
//! 2. every scheme signs with the request's deterministic nonce (agent, key, request hash), so
//!    the chain itself accepts at most one payment of a request (EVM: the token's or Permit2's
//!    nonce, asked unused on every configured token first; Solana: one transaction, which lands
//!    at most once, signed again only when every endpoint says it never can);
//! 3. the signed intent is committed to `payments` *before* the paid request leaves, so a
//!    takeover knows exactly what was signed and asks the chain before doing anything:
//!    landed → never pay again ("settled, response lost"); still valid → resend the same
//!    signed payload; can never land → sign again with the same nonce.
//!
//! After a paid answer the chain is asked what moved before the receipt says `settled`; an
//! upstream's unconfirmed claim is recorded as such.
//!
//! The walk, top-down, as [`PaidCall`]'s methods: [`PaidCall::pay`] reads the 402 →
//! [`registry`] picks the scheme and its choice → [`PaidCall::pay_with`] signs and commits the
//! intent (`reserve.rs`) → `exchange.rs` sends (after the operator's stop is checked) and
//! finishes on the chain's word. `resume.rs` picks up a recorded intent; `ahead.rs` pays known
//! terms with the first request.

mod agent;
mod ahead;
mod approval_gate;
pub mod batch;
pub(crate) mod call;
mod evm;
mod exchange;
pub(crate) mod registry;
mod reserve;
mod resume;
pub(crate) mod scheme;
mod svm;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

pub(crate) use self::call::{PaidCall, Seen};
use self::scheme::{Scheme, Signing};
use super::view::PaymentView;
use super::{Error, Failure, Outcome, PaymentNote};
use crate::codes::Code;
use crate::faults::Point;
use crate::payments::limits;
use crate::payments::{Final, PaymentStatus};
use crate::state::AppState;
use crate::upstream::UpstreamResponse;
use crate::x402::{self, PaymentRequired};

/// Why no option may be paid: the 402's code and reason.
pub(crate) type Declined = (Code, String);

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

impl PaidCall<'_> {
    /// Handles an upstream's 402 to a fresh (unpaid) request: choose, sign, commit the intent,
    /// pay, confirm.
    ///
    /// # Errors
    /// [`Error`] when nothing may be recorded (database gone, lease lost).
    pub async fn pay(&self, first: UpstreamResponse) -> Result<Outcome, Error> {
        self.fault(Point::PaymentRequired).await;
        let required =
            match x402::wire::parse_payment_required(StatusCode::PAYMENT_REQUIRED, &first.headers, &first.body) {
                Ok(r) => r,
                Err(e) => {
                    let msg = format!("invalid 402 from upstream: {e}");
                    return Ok(Stop::new("invalid_402", Code::UpstreamInvalid402, msg).outcome(self.state, first));
                }
            };
        self.state.terms.put(self.terms.clone(), &required, &first.headers);
        // The catalogue lists HTTP resources; a tool call's 402 is not one.
        if self.call.upstream.protocol == crate::upstream::Protocol::Http {
            self.state.discovery.saw(&self.call.upstream.url, &required);
        }
        registry::pay(self, &required, first).await
    }

    /// Pays `choice` of `required` with scheme `s`: signs it, commits the intent (the agent's
    /// limits and the operator's stops checked under the agent's lock), then sends it and
    /// finishes on the chain's word.
    ///
    /// # Errors
    /// [`Error`] when nothing may be recorded (database gone, lease lost).
    async fn pay_with<S: Scheme>(
        &self,
        s: &S,
        (required, choice, prepared): (&PaymentRequired, &S::Choice, S::Prepared),
        first: UpstreamResponse,
    ) -> Result<Outcome, Error> {
        // Above the agent's approval threshold: nothing is signed without an operator's yes.
        self.approved(&s.terms(choice)).await?;
        let signing = match s.sign(self, required, choice, prepared).await? {
            Ok(signing) => signing,
            Err(stop) => return Ok(stop.outcome(self.state, first)),
        };
        if let Some(refusal) = self.reserve(&signing).await? {
            // An operator's limit refuses it (a concurrent payment may have taken the budget
            // first). This signature is dropped here: it was never stored nor sent.
            return refused(self.state, refusal, Some(first), Value::Array(required.raw_accepts.clone()));
        }
        log_signed(self, &signing, "payment signed and recorded; sending the paid request");
        self.exchange(s, &signing.attempt).await
    }

    /// The outcome of a call cut off by the route deadline. If a payment was signed for the
    /// key, it may have left: its state becomes `unknown` (shown in the answer and to
    /// operators; `x402-router reconcile` settles the question from the chain later).
    ///
    /// # Errors
    /// [`Error`] when the ledger cannot be read.
    pub async fn past_deadline(&self) -> Result<Outcome, Error> {
        let payment = self.earlier_intent().await?.and_then(|row| {
            let shown = registry::view_of_row(&row, PaymentStatus::Unknown, None).ok()?;
            let error = Some("route deadline exceeded".into());
            let ledger = Final { id: row.id, status: PaymentStatus::Unknown, tx_hash: None, error, recovery: None };
            Some(PaymentNote { shown, ledger: Some(ledger) })
        });
        let code = if payment.is_some() { Code::PaymentUnknown } else { Code::UpstreamTimeout };
        Ok(Outcome::Failed(Failure::new(code, "route deadline exceeded").timeout(true).payment(payment)))
    }
}

/// Logs a signed and recorded payment (never its signature or header).
fn log_signed<S>(pc: &PaidCall<'_>, signing: &Signing<S>, what: &str) {
    let c = &signing.columns;
    tracing::info!(
        agent_id = %pc.own.agent_id, payment.network = %c.network, payment.amount = %c.amount,
        payment.nonce = %signing.attempt.nonce.chars().take(10).collect::<String>(), "{what}"
    );
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
pub(crate) struct Stop {
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

/// The 402 answer when the upstream asks for a payment the router will not make.
fn declined(state: &AppState, code: Code, upstream: Option<UpstreamResponse>, why: &str, accepts: Value) -> Outcome {
    state.metrics.payments.with_label_values(&["declined"]).inc();
    let reason = format!("upstream requires a payment the router will not make: {why}");
    Outcome::Declined { code, upstream, reason, accepts }
}

/// The outcome of a reservation an operator's limit refused: over a budget or off the `payTo`
/// allowlist is the call's recorded answer (402); a pause, a rate limit, a disabled agent or a
/// rotated key is an error of the router (503, 429, 403, 401) that records nothing, so the same
/// key can be retried.
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
