//! Sending the paid request, once the lease is seen held, and turning its answer (or its
//! absence) into an outcome: confirmed on-chain, refused, pending settlement, or lost in
//! transit (then recovered while the deadline allows).

use std::time::Instant;

use reqwest::header::{HeaderName, HeaderValue};

use super::{Attempt, MIN_RECOVERY_TIME};
use crate::codes::Code;
use crate::faults::{self, Point};
use crate::idempotency::Ownership;
use crate::payments::store;
use crate::payments::{Final, PaymentStatus};
use crate::relay::request::RouteCall;
use crate::relay::{Error, Failure, Outcome, PaymentNote, remaining};
use crate::state::AppState;
use crate::upstream::{UpstreamError, UpstreamResponse};
use crate::x402;

/// Sends the paid request and turns the answer (or its absence) into an outcome,
/// confirming settlement on-chain.
///
/// # Errors
/// [`Error::Superseded`] when the lease was lost before the payment left (nothing sent).
pub(super) async fn exchange(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    attempt: &Attempt,
    deadline: Instant,
) -> Result<Outcome, Error> {
    let sent = send(state, own, call, &attempt.header, deadline).await?;
    Ok(finish(state, own, attempt, sent, deadline).await)
}

/// What the upstream said to a paid request (or why it said nothing).
pub(super) type Sent = Result<UpstreamResponse, UpstreamError>;

/// Sends the paid request, once [`crate::relay::may_leave`] allows it.
///
/// # Errors
/// [`Error::Superseded`] when the lease was lost before the payment left, [`Error::Refused`]
/// when an operator stopped it (paused, agent disabled): nothing sent.
pub(super) async fn send(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    header: &(HeaderName, HeaderValue),
    deadline: Instant,
) -> Result<Sent, Error> {
    faults::at(state.faults.as_ref(), Point::BeforePaidSend).await;
    crate::relay::may_leave(state, own).await?;
    faults::at(state.faults.as_ref(), Point::PaymentLeaving).await;
    let started = Instant::now();
    let sent = state
        .upstream
        .send(&call.upstream, std::slice::from_ref(header), remaining(deadline).min(state.upstream.timeout()))
        .await;
    state.metrics.upstream_seconds.with_label_values(&["paid"]).observe(started.elapsed().as_secs_f64());
    faults::at(state.faults.as_ref(), Point::PaidAnswered).await;
    Ok(sent)
}

/// True when the answer to a paid request refuses it without claiming a settlement: a `402`
/// (without `settlement_pending`) or a Permit2 allowance request.
pub(super) fn refuses(resp: &UpstreamResponse) -> bool {
    (resp.status == 402 && !crate::relay::pending::claims_settlement(resp))
        || crate::relay::allowance::needs_permit2(resp)
}

/// Turns the answer to a paid request (or its absence) into an outcome.
pub(super) async fn finish(
    state: &AppState,
    own: &Ownership,
    attempt: &Attempt,
    sent: Sent,
    deadline: Instant,
) -> Outcome {
    let signed = &attempt.signed;
    match sent {
        Err(e) => lost_answer(state, own, attempt, &e, deadline).await,
        Ok(resp) if refuses(&resp) => refused_after_paying(state, own, attempt, resp).await,
        // A 402 carrying a settlement claim (`settlement_pending`) is no refusal: the money may
        // still move. The chain decides, within the deadline (relay/pending.rs).
        Ok(resp) if resp.status == 402 => {
            let paid = crate::relay::pending::Paid {
                id: attempt.id,
                signed,
                used: || super::confirm::chain_used(state, signed),
                describe: |status, tx: Option<&str>, charged| attempt.view(status, tx, charged),
            };
            crate::relay::pending::unanswered(state, own, paid, resp, deadline).await
        }
        Ok(resp) => answered(state, own, attempt, resp, deadline).await,
    }
}

/// The upstream refused the paid request (402, or Permit2 allowance required). Paid and
/// refused anyway: the money moved and the call was not served, so it is
/// `settled_response_lost` (visible to recovery), charged what the chain shows moved.
async fn refused_after_paying(state: &AppState, own: &Ownership, attempt: &Attempt, resp: UpstreamResponse) -> Outcome {
    let signed = &attempt.signed;
    let reasons = x402::wire::refusal_reasons(&resp.headers, &resp.body);
    let (status, proven) = match super::confirm::chain_used(state, signed).await {
        Ok(true) => {
            let proven = crate::relay::settled::prove(state, own.agent_id, attempt.id, signed, None).await;
            (PaymentStatus::SettledResponseLost, proven)
        }
        Ok(false) => (PaymentStatus::Rejected, crate::relay::settled::Proven::default()),
        Err(_) => (PaymentStatus::Unknown, crate::relay::settled::Proven::default()),
    };
    let tx_hash = proven.tx_hash.map(|h| h.to_string());
    state.metrics.payments.with_label_values(&[status.as_str()]).inc();
    crate::relay::count_paid(state, signed, status, proven.charged);
    let reason = reasons.error.clone().or(reasons.invalid_reason.clone()).or(reasons.error_reason.clone());
    let permit2 = reasons.names(x402::wire::PERMIT2_ALLOWANCE_REQUIRED);
    let msg = if permit2 && status == PaymentStatus::Rejected {
        crate::relay::allowance::message(signed)
    } else {
        format!("upstream rejected the payment: {}", reason.as_deref().unwrap_or("no reason given"))
    };
    let shown = attempt.view(status, tx_hash.as_deref(), proven.charged);
    let ledger = Final { id: attempt.id, status, tx_hash, error: reason, recovery: None };
    let payment = PaymentNote { shown, ledger: Some(ledger) };
    let code = match status {
        PaymentStatus::Rejected if permit2 => Code::Permit2AllowanceRequired,
        PaymentStatus::Rejected => Code::PaymentRejected,
        PaymentStatus::SettledResponseLost => Code::SettledResponseLost,
        _ => Code::PaymentUnknown,
    };
    // The facilitator's reasons, unchanged, beside our own message.
    Outcome::Failed(
        Failure::new(code, msg)
            .upstream(resp)
            .payment(Some(payment))
            .reason("invalidReason", reasons.invalid_reason)
            .reason("errorReason", reasons.error_reason),
    )
}

/// The paid request was answered: the chain confirms the settlement (or says it did not).
async fn answered(
    state: &AppState,
    own: &Ownership,
    attempt: &Attempt,
    resp: UpstreamResponse,
    deadline: Instant,
) -> Outcome {
    let signed = &attempt.signed;
    let claim = x402::wire::parse_settlement(&resp.headers).ok().flatten();
    let claimed = claim.as_ref().is_some_and(|c| c.success);
    faults::at(state.faults.as_ref(), Point::BeforeConfirm).await;
    // The answer has arrived: it is recorded whatever the clock says; a settlement that
    // cannot be confirmed by the deadline is recorded `unknown` for `reconcile`.
    let (status, tx_hash, note, charged) =
        super::confirm::confirm(state, (own.agent_id, attempt.id), signed, claim.as_ref(), deadline).await;
    state.metrics.payments.with_label_values(&[status.as_str()]).inc();
    crate::relay::count_paid(state, signed, status, charged);
    tracing::info!(agent_id = %own.agent_id, payment.status = status.as_str(), upstream.status = resp.status, "paid request answered");
    // upto: the upstream's word, beside what the chain shows (`amount`).
    let said = claim.as_ref().and_then(|c| c.amount).map(|a| a.to_string());
    let shown = attempt.view(status, tx_hash.as_deref(), charged).claimed_amount(said);
    let error = note.or_else(|| claim.as_ref().filter(|_| !claimed).and_then(|c| c.error_reason.clone()));
    let ledger = Final { id: attempt.id, status, tx_hash, error, recovery: None };
    Outcome::Answered { resp, payment: Some(PaymentNote { shown, ledger: Some(ledger) }) }
}

/// The paid request got no answer: whether money moved is the chain's to say. Used: the
/// answer was lost in transit (a dropped connection, a timeout), and, while the route deadline
/// allows, recovery asks an upstream that advertised `payment-identifier` for it again
/// (byte-identical re-send; it cannot sign).
async fn lost_answer(
    state: &AppState,
    own: &Ownership,
    attempt: &Attempt,
    e: &UpstreamError,
    deadline: Instant,
) -> Outcome {
    let (status, proven) = match super::confirm::chain_used(state, &attempt.signed).await {
        Ok(true) => {
            let proven = crate::relay::settled::prove(state, own.agent_id, attempt.id, &attempt.signed, None).await;
            (PaymentStatus::SettledResponseLost, proven)
        }
        // Not (yet) used: the upstream still holds a valid authorization until validBefore.
        _ => (PaymentStatus::Unknown, crate::relay::settled::Proven::default()),
    };
    let charged = proven.charged;
    let mut note = None;
    // A call cut by the route deadline itself has no time left: `reconcile` tries later.
    let time_left = remaining(deadline) >= MIN_RECOVERY_TIME;
    if status == PaymentStatus::SettledResponseLost && state.config.recover_lost_answers && time_left {
        let intent = match crate::relay::error::conn(&state.pool).await {
            Ok(mut conn) => {
                store::find(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash).await.ok().flatten()
            }
            Err(_) => None,
        };
        if let Some(intent) = intent.filter(crate::recovery::can_resend) {
            let opened = crate::secrets::intent::open(&state.config.secrets.keyring, &intent);
            let proof = crate::recovery::Proof::Evm(&state.chain);
            let recovery = crate::recovery::recover(&state.upstream, proof, (&intent, &opened), deadline).await;
            let kind = recovery.kind();
            state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
            let recorded = crate::payments::RecoveryNote { kind, log: recovery.log };
            if let crate::recovery::Ending::Recovered { resp, tx_hash } = recovery.ending {
                state.metrics.payments.with_label_values(&["recovered"]).inc();
                crate::relay::count_paid(state, &attempt.signed, PaymentStatus::Settled, charged);
                tracing::info!(agent_id = %own.agent_id, upstream.status = resp.status, sends = recovery.sends,
                    "the answer to a settled payment, lost in transit, was recovered by a byte-identical re-send");
                let status = PaymentStatus::Settled;
                let tx_hash = Some(tx_hash.to_string());
                let shown = attempt.view(status, tx_hash.as_deref(), charged).recovery(Some(kind));
                let ledger = Final { id: attempt.id, status, tx_hash, error: None, recovery: Some(recorded) };
                return Outcome::Answered { resp, payment: Some(PaymentNote { shown, ledger: Some(ledger) }) };
            }
            note = Some(recorded);
        }
    }
    state.metrics.payments.with_label_values(&[status.as_str()]).inc();
    crate::relay::count_paid(state, &attempt.signed, status, charged);
    let msg = match status {
        PaymentStatus::SettledResponseLost => format!("{e}; the payment settled on-chain but the response was lost"),
        _ => format!("{e}; the payment was not seen on-chain (the signed authorization stays valid until it expires)"),
    };
    let tx_hash = proven.tx_hash.map(|h| h.to_string());
    let shown = attempt.view(status, tx_hash.as_deref(), charged).recovery(note.as_ref().map(|n| n.kind));
    let ledger = Final { id: attempt.id, status, tx_hash, error: Some(e.to_string()), recovery: note };
    let payment = PaymentNote { shown, ledger: Some(ledger) };
    let code =
        if status == PaymentStatus::SettledResponseLost { Code::SettledResponseLost } else { Code::PaymentUnknown };
    Outcome::Failed(Failure::new(code, msg).timeout(matches!(e, UpstreamError::Timeout)).payment(Some(payment)))
}
