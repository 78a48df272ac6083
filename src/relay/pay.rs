//! The x402 payment flow of a routed call (DESIGN.md §6): select, sign, commit the intent,
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

use std::time::{Duration, Instant};

use alloy::primitives::{Address, B256};
use reqwest::StatusCode;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Value, json};
use uuid::Uuid;

use super::request::RouteCall;
use super::{Error, Failure, Outcome, PaymentNote, remaining};
use crate::clock::now_unix;
use crate::codes::Code;
use crate::faults::{self, Point};
use crate::idempotency::Ownership;
use crate::payments::store::{self, PaymentRow};
use crate::payments::{Final, PaymentStatus};
use crate::state::AppState;
use crate::upstream::{UpstreamError, UpstreamResponse};
use crate::x402::{self, Network, Requirement, SignedAuthorization, X402Version};

/// A stored authorization with less validity left than this is re-signed, not resent
/// (the official facilitator wants `validBefore ≥ now + 6 s`).
const MIN_VALIDITY_SECS: u64 = 30;
/// Least time before the route deadline for recovering, within the call, an answer lost in
/// transit.
const MIN_RECOVERY_TIME: Duration = Duration::from_secs(1);
/// How long to wait for a claimed settlement to become visible on-chain.
const SETTLEMENT_POLLS: u32 = 10;
const SETTLEMENT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// An authorization ready to send: the ledger row id, the signed message and its header.
struct Attempt {
    id: Uuid,
    version: X402Version,
    signed: SignedAuthorization,
    header: (HeaderName, HeaderValue),
}

impl Attempt {
    /// The envelope's `payment` object.
    fn describe(&self, status: PaymentStatus, tx_hash: Option<&str>) -> Value {
        describe(self.version, &self.signed, status, tx_hash)
    }
}

fn describe(version: X402Version, signed: &SignedAuthorization, status: PaymentStatus, tx_hash: Option<&str>) -> Value {
    let auth = signed.authorization();
    json!({
        "x402_version": version.number(),
        "scheme": "exact",
        "network": signed.network().caip2(),
        "asset": signed.asset().to_checksum(None),
        "amount": auth.value.to_string(),
        "pay_to": auth.to.to_checksum(None),
        "payer": auth.from.to_checksum(None),
        "nonce": auth.nonce.to_string(),
        "tx_hash": tx_hash,
        "status": status.as_str(),
    })
}

/// The envelope's `payment` object for a stored intent, in `status` (for answers recorded
/// outside a route call, e.g. by `reconcile`).
///
/// # Errors
/// A stored authorization or version that cannot be read.
pub fn describe_row(row: &PaymentRow, status: PaymentStatus, tx_hash: Option<&str>) -> Result<Value, String> {
    let signed: SignedAuthorization = serde_json::from_value(row.signed_authorization.clone())
        .map_err(|e| format!("stored authorization unreadable: {e}"))?;
    let version = X402Version::from_number(u64::try_from(row.x402_version).unwrap_or(0))
        .ok_or_else(|| format!("stored x402 version {}", row.x402_version))?;
    Ok(describe(version, &signed, status, tx_hash))
}

/// A 502 for a call that stopped after the upstream's 402 without paying in this attempt:
/// the 402 is the envelope's known part, and the call gets its receipt.
fn stopped_after_402(
    state: &AppState,
    first: UpstreamResponse,
    metric: &str,
    code: Code,
    msg: &str,
    payment: Option<Value>,
) -> Outcome {
    state.metrics.payments.with_label_values(&[metric]).inc();
    let payment = payment.map(|shown| PaymentNote { shown, ledger: None });
    Outcome::Failed(Failure::new(code, msg).upstream(first).payment(payment))
}

/// The 402 answer when the upstream asks for a payment the router will not make.
fn declined(state: &AppState, code: Code, upstream: Option<UpstreamResponse>, why: &str, accepts: Value) -> Outcome {
    state.metrics.payments.with_label_values(&["declined"]).inc();
    let reason = format!("upstream requires a payment the router will not make: {why}");
    Outcome::Declined { code, upstream, reason, accepts }
}

/// Handles an upstream's 402 to a fresh (unpaid) request: select, sign, commit the
/// intent, pay, verify.
///
/// # Errors
/// [`Error`] when nothing may be recorded (database gone, lease lost).
pub async fn pay(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    first: UpstreamResponse,
    deadline: Instant,
) -> Result<Outcome, Error> {
    faults::at(state.faults.as_ref(), Point::PaymentRequired).await;
    let required = match x402::wire::parse_payment_required(StatusCode::PAYMENT_REQUIRED, &first.headers, &first.body) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("invalid 402 from upstream: {e}");
            return Ok(stopped_after_402(state, first, "invalid_402", Code::UpstreamInvalid402, &msg, None));
        }
    };

    // The agent's limits narrow the choice up front; `store::reserve` re-checks atomically.
    let spend = {
        let mut conn = super::error::conn(&state.pool).await?;
        store::agent_spend(&mut conn, own.agent_id, false).await?
    };
    let (cap, left) = match spend.as_ref().map(|s| (s.cap(), s.remaining())) {
        None => (None, None),
        Some((Ok(cap), Ok(left))) => (cap, left),
        Some(_) => {
            let why = "the agent's limits cannot be read";
            let accepts = Value::Array(required.raw_accepts.clone());
            return Ok(declined(state, Code::PaymentOverBudget, Some(first), why, accepts));
        }
    };
    let limit = match (cap, left) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let chosen = match x402::select(&required.accepts, &state.supported, call.max_amount, limit) {
        Ok(r) => r.clone(),
        Err(rejection) => {
            let mut why = rejection.to_string();
            if let Some(left) = left.filter(|l| rejection.is_over_budget() && cap.is_none_or(|c| *l <= c)) {
                why.push_str(&format!(" (the agent's rolling 24 h budget has {left} left)"));
            }
            let code = Code::for_rejection(&rejection);
            return Ok(declined(state, code, Some(first), &why, Value::Array(required.raw_accepts.clone())));
        }
    };

    // This very request was paid for under this key before (the key expired and was reused
    // for the same request): never a second payment; resume the recorded intent instead.
    let existing = {
        let mut conn = super::error::conn(&state.pool).await?;
        store::find(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash).await?
    };
    if let Some(intent) = existing {
        return resume(state, own, call, intent, deadline, Resume::KeyReused).await;
    }

    let nonce = x402::deterministic_nonce(&state.nonce_secret[..], own.agent_id, own.key.as_str(), &own.request_hash);
    let payer = state.config.signer.address();
    // Never pay a request twice, even if our own records were lost: ask every token this
    // nonce could have been used on (an earlier attempt may have chosen another asset).
    match used_anywhere(state, payer, nonce).await {
        Ok(None) => {}
        Ok(Some((network, asset))) => {
            let payment = json!({
                "x402_version": required.version.number(), "scheme": "exact", "network": network.caip2(),
                "asset": asset.to_checksum(None), "payer": payer.to_checksum(None), "nonce": nonce.to_string(),
                "status": PaymentStatus::SettledResponseLost.as_str(),
            });
            let msg = "this request's payment under this Idempotency-Key was already settled on-chain; \
                       the router will not pay again";
            return Ok(stopped_after_402(
                state,
                first,
                "already_settled",
                Code::SettledResponseLost,
                msg,
                Some(payment),
            ));
        }
        Err(x402::ChainError::ChainIdMismatch { .. }) => return Err(wrong_chain()),
        Err(e) => {
            let msg = format!("cannot read the payment network ({e}); nothing was signed or paid");
            return Ok(stopped_after_402(state, first, "rpc_unavailable", Code::PaymentNotMade, &msg, None));
        }
    }

    let extensions = if required.advertises_payment_identifier() {
        let pid =
            x402::payment_identifier_id(&state.nonce_secret[..], own.agent_id, own.key.as_str(), &own.request_hash);
        match x402::wire::payment_extensions(required.extensions.as_ref(), &pid) {
            Ok(e) => e,
            // Our own id is always valid: a payment without it would be a bug (and, when the
            // upstream requires it, refused); nothing is signed.
            Err(e) => return Err(Error::invariant(format!("cannot echo payment-identifier: {e}"))),
        }
    } else {
        None
    };
    if required.requires_payment_identifier()
        && extensions.as_ref().and_then(|e| e.pointer("/payment-identifier/info/id")).is_none()
    {
        return Err(Error::invariant("the upstream requires payment-identifier and no id would be sent"));
    }
    // Recovery needs the request exactly as sent and what the 402 advertised: both are
    // committed with the intent, before the payment leaves.
    let sent = crate::recovery::as_sent(&call.upstream).map_err(Error::invariant)?;
    let advertised = match required.extensions.as_ref() {
        Some(e) => Some(serde_json::to_vec(e).map_err(|e| Error::Internal(e.into()))?),
        None => None,
    };
    let context =
        json!({ "version": required.version.number(), "resource": required.resource, "extensions": extensions });
    let attempt = match sign(state, required.version, &chosen, &context, nonce) {
        Ok(a) => a,
        Err(msg) => return Ok(stopped_after_402(state, first, "sign_failed", Code::PaymentNotMade, &msg, None)),
    };

    // Commit the intent before the payment leaves (fenced by our lease).
    let authorization = serde_json::to_value(&attempt.signed).map_err(|e| Error::Internal(e.into()))?;
    let header_value = attempt.header.1.to_str().map_err(|e| Error::Internal(e.into()))?;
    let row = store::NewPayment {
        id: attempt.id,
        agent_id: own.agent_id,
        idempotency_key: own.key.as_str(),
        request_hash: &own.request_hash,
        lease: own.lease,
        x402_version: i16::from(required.version.number()),
        scheme: chosen.scheme(),
        network: &chosen.network().caip2(),
        asset: &chosen.asset().to_checksum(None),
        amount: chosen.amount(),
        pay_to: &chosen.pay_to().to_checksum(None),
        payer: &payer.to_checksum(None),
        nonce: &nonce.to_string(),
        valid_after: to_i64(attempt.signed.authorization().valid_after),
        valid_before: to_i64(attempt.signed.authorization().valid_before),
        requirement: &chosen.raw_json(),
        context: &context,
        authorization: &authorization,
        header_name: attempt.header.0.as_str(),
        header_value,
        request: &sent,
        advertised_extensions: advertised.as_deref(),
    };
    faults::at(state.faults.as_ref(), Point::BeforeIntent).await;
    let mut conn = super::error::conn(&state.pool).await?;
    match store::reserve(&mut conn, &row).await? {
        store::Reservation::Reserved => {}
        store::Reservation::Fenced => return Err(Error::Superseded),
        store::Reservation::OverLimit(why) => {
            // A concurrent payment of the same agent took the budget first. This
            // signature is dropped here: it was never stored nor sent.
            let accepts = Value::Array(required.raw_accepts.clone());
            return Ok(declined(state, Code::PaymentOverBudget, Some(first), &why, accepts));
        }
    }
    drop(conn);
    tracing::info!(
        agent_id = %own.agent_id, payment.network = %chosen.network(), payment.amount = %chosen.amount(),
        payment.nonce = %short(&nonce), "payment signed and recorded; sending the paid request"
    );
    exchange(state, own, call, &attempt, deadline).await
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
        let signed: SignedAuthorization = serde_json::from_value(row.signed_authorization).ok()?;
        let version = X402Version::from_number(u64::try_from(row.x402_version).ok()?)?;
        let shown = describe(version, &signed, PaymentStatus::Unknown, None);
        let error = Some("route deadline exceeded".into());
        let ledger = Final { id: row.id, status: PaymentStatus::Unknown, tx_hash: None, error, recovery: None };
        Some(PaymentNote { shown, ledger: Some(ledger) })
    });
    let code = if payment.is_some() { Code::PaymentUnknown } else { Code::UpstreamTimeout };
    Ok(Outcome::Failed(Failure::new(code, "route deadline exceeded").timeout(true).payment(payment)))
}

/// Why an existing intent of this request is picked up again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// A takeover after the previous owner of the key was abandoned (crashed or frozen).
    Takeover,
    /// The key expired and was reused for the same request.
    KeyReused,
}

/// Resumes the recorded intent of this request: a takeover after a crash, or the same
/// request re-sent under a key that expired. The chain decides first: used ⇒ never pay
/// again; unused and valid ⇒ resend the same signed payload; unused and expired ⇒ re-sign
/// with the same nonce. Before anything is sent, the agent (enabled), its current cap and
/// the configured networks and assets are checked again.
///
/// # Errors
/// [`Error::Unavailable`] when the chain cannot be read: nothing is decided or paid,
/// the key stays in flight for a later retry.
pub async fn resume(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    intent: PaymentRow,
    deadline: Instant,
    mode: Resume,
) -> Result<Outcome, Error> {
    let signed: SignedAuthorization = serde_json::from_value(intent.signed_authorization.clone())
        .map_err(|e| Error::invariant(format!("stored authorization unreadable: {e}")))?;
    let version = X402Version::from_number(u64::try_from(intent.x402_version).unwrap_or(0))
        .ok_or_else(|| Error::invariant(format!("stored x402 version {}", intent.x402_version)))?;
    faults::at(state.faults.as_ref(), Point::ResumeStart).await;
    let used = match chain_used(state, signed.network(), signed.asset(), signed.payer(), signed.nonce()).await {
        Ok(used) => used,
        Err(x402::ChainError::ChainIdMismatch { .. }) => return Err(wrong_chain()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot check a resumed payment on-chain; deferring");
            return Err(Error::Unavailable(
                "the payment network cannot be read to check an earlier payment; retry later",
            ));
        }
    };
    if used {
        let s = &signed;
        let proven = state.chain.authorization_tx(s.network(), s.asset(), s.payer(), s.nonce(), None).await;
        let tx_hash = proven.ok().flatten().map(|h| h.to_string()).or(intent.tx_hash.clone());
        if mode == Resume::KeyReused {
            state.metrics.payments.with_label_values(&["already_paid"]).inc();
            let previous_receipt = {
                let mut conn = super::error::conn(&state.pool).await?;
                crate::receipts::store::latest_for_request(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash)
                    .await?
            };
            let shown = describe(version, &signed, intent.status, tx_hash.as_deref());
            return Ok(Outcome::AlreadyPaid { previous_receipt, payment: shown });
        }
        // Paid, and the answer was lost: try to get it back without paying again
        // (crate::recovery cannot sign; it re-sends the stored bytes or nothing).
        let recovery = if state.config.recover_lost_answers {
            crate::recovery::recover(&state.upstream, &state.chain, &intent, deadline).await
        } else {
            crate::recovery::Recovery::skipped("recovery is disabled (RECOVER_LOST_ANSWERS=false)")
        };
        let kind = recovery.kind();
        state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
        let note = crate::payments::RecoveryNote { kind, log: Value::Array(recovery.log) };
        if let crate::recovery::Ending::Recovered { resp, tx_hash } = recovery.ending {
            state.metrics.payments.with_label_values(&["recovered"]).inc();
            tracing::info!(agent_id = %own.agent_id, upstream.status = resp.status, sends = recovery.sends,
                "the upstream's answer to a settled payment was recovered by a byte-identical re-send");
            let status = PaymentStatus::Settled;
            let tx_hash = Some(tx_hash.to_string());
            let mut shown = describe(version, &signed, status, tx_hash.as_deref());
            shown["recovery"] = json!(kind.as_str());
            let ledger = Final { id: intent.id, status, tx_hash, error: None, recovery: Some(note) };
            return Ok(Outcome::Answered { resp, payment: Some(PaymentNote { shown, ledger: Some(ledger) }) });
        }
        state.metrics.payments.with_label_values(&["settled_response_lost"]).inc();
        tracing::warn!(agent_id = %own.agent_id, sends = recovery.sends,
            "resumed key was already paid on-chain and its answer could not be recovered: settled, response lost");
        let status = PaymentStatus::SettledResponseLost;
        let mut shown = describe(version, &signed, status, tx_hash.as_deref());
        shown["recovery"] = json!(kind.as_str());
        let ledger = Final { id: intent.id, status, tx_hash, error: None, recovery: Some(note) };
        let msg = "payment settled on-chain but the upstream's response was lost; the router will not pay again";
        let payment = Some(PaymentNote { shown, ledger: Some(ledger) });
        return Ok(Outcome::Failed(Failure::new(Code::SettledResponseLost, msg).payment(payment)));
    }
    // The exact copies that were signed (the JSONB columns are sanitized for queries).
    let stored = intent.requirement_signed().and_then(|r| Ok((r, intent.context_signed()?)));
    let (raw_requirement, context) =
        stored.map_err(|e| Error::invariant(format!("stored requirement unreadable: {e}")))?;
    let requirement = Requirement::from_json(version, 0, &raw_requirement)
        .map_err(|e| Error::invariant(format!("stored requirement unreadable: {e}")))?;
    if let Some((code, why)) = still_allowed(state, own.agent_id, &requirement).await? {
        return Ok(declined(state, code, None, &why, Value::Array(vec![raw_requirement])));
    }
    let attempt = if signed.is_valid_at(now_unix(), MIN_VALIDITY_SECS) {
        let name = HeaderName::from_bytes(intent.header_name.as_bytes()).map_err(|e| Error::Internal(e.into()))?;
        let value = HeaderValue::from_str(&intent.header_value).map_err(|e| Error::Internal(e.into()))?;
        tracing::info!(agent_id = %own.agent_id, "resending the unused, still valid payment of an abandoned attempt");
        Attempt { id: intent.id, version, signed, header: (name, value) }
    } else {
        let attempt = sign(state, version, &requirement, &context, signed.nonce()).map_err(Error::invariant)?;
        let auth = serde_json::to_value(&attempt.signed).map_err(|e| Error::Internal(e.into()))?;
        let header = attempt.header.1.to_str().map_err(|e| Error::Internal(e.into()))?;
        let a = attempt.signed.authorization();
        let resign = store::Resign {
            id: intent.id,
            agent_id: own.agent_id,
            lease: own.lease,
            amount: requirement.amount(),
            valid_after: to_i64(a.valid_after),
            valid_before: to_i64(a.valid_before),
            authorization: &auth,
            header_value: header,
        };
        faults::at(state.faults.as_ref(), Point::BeforeResign).await;
        let mut conn = super::error::conn(&state.pool).await?;
        match store::resign(&mut conn, &resign).await? {
            store::Reservation::Reserved => {}
            store::Reservation::Fenced => return Err(Error::Superseded),
            store::Reservation::OverLimit(why) => {
                // The expired intent released its budget and the budget is gone now:
                // nothing can be paid for this key. Nothing was sent in this attempt.
                let accepts = Value::Array(vec![raw_requirement.clone()]);
                return Ok(declined(state, Code::PaymentOverBudget, None, &why, accepts));
            }
        }
        tracing::info!(agent_id = %own.agent_id, "re-signed an expired, unused payment with the same nonce");
        Attempt { id: intent.id, ..attempt }
    };
    exchange(state, own, call, &attempt, deadline).await
}

/// Signs `requirement` and builds the header of `version`.
fn sign(
    state: &AppState,
    version: X402Version,
    requirement: &Requirement,
    context: &Value,
    nonce: B256,
) -> Result<Attempt, String> {
    let max_auth = state.config.payments.max_auth_secs;
    let signed = x402::sign_authorization(&state.config.signer, requirement, nonce, now_unix(), max_auth)
        .map_err(|e| format!("cannot sign the payment: {e}"))?;
    let resource = context.get("resource").filter(|v| !v.is_null());
    let extensions = context.get("extensions").filter(|v| !v.is_null());
    let payload = x402::payload::payment_payload(version, requirement, resource, &signed, extensions)
        .map_err(|e| format!("cannot build the payment: {e}"))?;
    let (name, value) =
        x402::wire::encode_payment_header(version, &payload).map_err(|e| format!("cannot encode the payment: {e}"))?;
    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("bad payment header name: {e}"))?;
    Ok(Attempt { id: Uuid::new_v4(), version, signed, header: (name, value) })
}

/// Sends the paid request and turns the answer (or its absence) into an outcome,
/// confirming settlement on-chain.
///
/// # Errors
/// [`Error::Superseded`] when the lease was lost before the payment left (nothing sent).
async fn exchange(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    attempt: &Attempt,
    deadline: Instant,
) -> Result<Outcome, Error> {
    faults::at(state.faults.as_ref(), Point::BeforePaidSend).await;
    // The lease is read under a row lock immediately before the payment leaves: an owner
    // that was presumed dead and taken over sends nothing.
    let held = {
        let mut conn = super::error::conn(&state.pool).await?;
        crate::idempotency::store::lease_held(&mut conn, own.agent_id, own.key.as_str(), own.lease).await?
    };
    if !held {
        tracing::warn!(agent_id = %own.agent_id, "lease lost before the paid request left; nothing sent");
        return Err(Error::Superseded);
    }
    faults::at(state.faults.as_ref(), Point::PaymentLeaving).await;
    let started = Instant::now();
    let sent = state
        .upstream
        .send(&call.upstream, std::slice::from_ref(&attempt.header), remaining(deadline).min(state.upstream.timeout()))
        .await;
    state.metrics.upstream_seconds.with_label_values(&["paid"]).observe(started.elapsed().as_secs_f64());
    let signed = &attempt.signed;
    faults::at(state.faults.as_ref(), Point::PaidAnswered).await;
    Ok(match sent {
        Err(e) => lost_answer(state, own, attempt, &e, deadline).await,
        Ok(resp) if resp.status == 402 => {
            let reasons = x402::wire::refusal_reasons(&resp.headers, &resp.body);
            let status = match chain_used(state, signed.network(), signed.asset(), signed.payer(), signed.nonce()).await
            {
                Ok(true) => PaymentStatus::Settled,
                Ok(false) => PaymentStatus::Rejected,
                Err(_) => PaymentStatus::Unknown,
            };
            state.metrics.payments.with_label_values(&[status.as_str()]).inc();
            let reason = reasons.error.clone().or(reasons.invalid_reason.clone()).or(reasons.error_reason.clone());
            let msg = format!("upstream rejected the payment: {}", reason.as_deref().unwrap_or("no reason given"));
            let ledger = Final { id: attempt.id, status, tx_hash: None, error: reason, recovery: None };
            let payment = PaymentNote { shown: attempt.describe(status, None), ledger: Some(ledger) };
            let code = match status {
                PaymentStatus::Rejected => Code::PaymentRejected,
                PaymentStatus::Settled => Code::SettledResponseLost,
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
        Ok(resp) => {
            let claim = x402::wire::parse_settlement(&resp.headers).ok().flatten();
            let claimed = claim.as_ref().is_some_and(|c| c.success);
            faults::at(state.faults.as_ref(), Point::BeforeConfirm).await;
            // The answer has arrived: it is recorded whatever the clock says; a settlement that
            // cannot be confirmed by the deadline is recorded `unknown` for `reconcile`.
            let (status, tx_hash, note) = confirm(state, signed, claim.as_ref(), deadline).await;
            state.metrics.payments.with_label_values(&[status.as_str()]).inc();
            tracing::info!(agent_id = %own.agent_id, payment.status = status.as_str(), upstream.status = resp.status, "paid request answered");
            let shown = attempt.describe(status, tx_hash.as_deref());
            let error = note.or_else(|| claim.as_ref().filter(|_| !claimed).and_then(|c| c.error_reason.clone()));
            let ledger = Final { id: attempt.id, status, tx_hash, error, recovery: None };
            Outcome::Answered { resp, payment: Some(PaymentNote { shown, ledger: Some(ledger) }) }
        }
    })
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
    let s = &attempt.signed;
    let status = match chain_used(state, s.network(), s.asset(), s.payer(), s.nonce()).await {
        Ok(true) => PaymentStatus::SettledResponseLost,
        // Not (yet) used: the upstream still holds a valid authorization until validBefore.
        _ => PaymentStatus::Unknown,
    };
    let mut note = None;
    // A call cut by the route deadline itself has no time left: `reconcile` tries later.
    let time_left = remaining(deadline) >= MIN_RECOVERY_TIME;
    if status == PaymentStatus::SettledResponseLost && state.config.recover_lost_answers && time_left {
        let intent = match super::error::conn(&state.pool).await {
            Ok(mut conn) => {
                store::find(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash).await.ok().flatten()
            }
            Err(_) => None,
        };
        if let Some(intent) = intent.filter(crate::recovery::can_resend) {
            let recovery = crate::recovery::recover(&state.upstream, &state.chain, &intent, deadline).await;
            let kind = recovery.kind();
            state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
            let recorded = crate::payments::RecoveryNote { kind, log: Value::Array(recovery.log) };
            if let crate::recovery::Ending::Recovered { resp, tx_hash } = recovery.ending {
                state.metrics.payments.with_label_values(&["recovered"]).inc();
                tracing::info!(agent_id = %own.agent_id, upstream.status = resp.status, sends = recovery.sends,
                    "the answer to a settled payment, lost in transit, was recovered by a byte-identical re-send");
                let status = PaymentStatus::Settled;
                let tx_hash = Some(tx_hash.to_string());
                let mut shown = attempt.describe(status, tx_hash.as_deref());
                shown["recovery"] = json!(kind.as_str());
                let ledger = Final { id: attempt.id, status, tx_hash, error: None, recovery: Some(recorded) };
                return Outcome::Answered { resp, payment: Some(PaymentNote { shown, ledger: Some(ledger) }) };
            }
            note = Some(recorded);
        }
    }
    state.metrics.payments.with_label_values(&[status.as_str()]).inc();
    let msg = match status {
        PaymentStatus::SettledResponseLost => format!("{e}; the payment settled on-chain but the response was lost"),
        _ => format!("{e}; the payment was not seen on-chain (the signed authorization stays valid until it expires)"),
    };
    let mut shown = attempt.describe(status, None);
    if let Some(n) = &note {
        shown["recovery"] = json!(n.kind.as_str());
    }
    let ledger = Final { id: attempt.id, status, tx_hash: None, error: Some(e.to_string()), recovery: note };
    let payment = PaymentNote { shown, ledger: Some(ledger) };
    let code =
        if status == PaymentStatus::SettledResponseLost { Code::SettledResponseLost } else { Code::PaymentUnknown };
    Outcome::Failed(Failure::new(code, msg).timeout(matches!(e, UpstreamError::Timeout)).payment(Some(payment)))
}

/// Asks the chain whether the authorization was consumed. A claimed success is given a
/// moment to appear; a claimed transaction must exist and have succeeded to be recorded.
async fn confirm(
    state: &AppState,
    s: &SignedAuthorization,
    claim: Option<&x402::SettlementResponse>,
    deadline: Instant,
) -> (PaymentStatus, Option<String>, Option<String>) {
    let claimed = claim.is_some_and(|c| c.success);
    let polls = if claimed { SETTLEMENT_POLLS } else { 1 };
    let mut used = Ok(false);
    for i in 0..polls {
        if i > 0 {
            tokio::time::sleep(SETTLEMENT_POLL_INTERVAL).await;
        }
        if remaining(deadline).is_zero() {
            return (
                PaymentStatus::Unknown,
                None,
                Some("settlement not confirmed before the route deadline; reconcile decides from the chain".into()),
            );
        }
        used = chain_used(state, s.network(), s.asset(), s.payer(), s.nonce()).await;
        if matches!(used, Ok(true)) {
            break;
        }
        if i + 1 < polls && remaining(deadline) < SETTLEMENT_POLL_INTERVAL {
            return (
                PaymentStatus::Unknown,
                None,
                Some("settlement not confirmed before the route deadline; reconcile decides from the chain".into()),
            );
        }
    }
    match used {
        Ok(true) => {
            // Record only the transaction the chain shows consuming this nonce, whatever the
            // upstream claims.
            let claimed_hash = claim.and_then(|c| c.tx_hash);
            let proven = state.chain.authorization_tx(s.network(), s.asset(), s.payer(), s.nonce(), claimed_hash).await;
            let (tx, note) = match proven {
                Ok(Some(h)) if Some(h) == claimed_hash || claimed_hash.is_none() => (Some(h.to_string()), None),
                Ok(Some(h)) => (
                    Some(h.to_string()),
                    claimed_hash.map(|c| format!("the claimed transaction {c} did not use this authorization")),
                ),
                Ok(None) => (None, Some("the transaction that used the authorization was not found".to_owned())),
                Err(e) => (None, Some(format!("the settling transaction could not be found: {e}"))),
            };
            (PaymentStatus::Settled, tx, note)
        }
        Ok(false) if claimed => (
            PaymentStatus::Unconfirmed,
            None,
            Some("the upstream claimed settlement, but the authorization is unused on-chain".into()),
        ),
        Ok(false) => (PaymentStatus::NotSettled, None, None),
        Err(e) => (PaymentStatus::Unknown, None, Some(format!("settlement could not be checked: {e}"))),
    }
}

/// The first configured `(network, asset)` on which `nonce` of `payer` is used, if any.
/// Any unreadable chain is an error: nothing is signed without every answer.
async fn used_anywhere(
    state: &AppState,
    payer: Address,
    nonce: B256,
) -> Result<Option<(Network, Address)>, x402::ChainError> {
    for (network, asset) in state.supported.payable_assets() {
        if chain_used(state, network, asset, payer, nonce).await? {
            return Ok(Some((network, asset)));
        }
    }
    Ok(None)
}

/// Why a recorded intent may no longer be sent, if it may not: the agent is disabled or
/// gone, its asset is no longer configured (or not in the router's unit), or its amount is
/// over the agent's current per-call cap (an unreadable cap refuses).
async fn still_allowed(
    state: &AppState,
    agent_id: uuid::Uuid,
    requirement: &Requirement,
) -> Result<Option<(Code, String)>, Error> {
    let spend = {
        let mut conn = super::error::conn(&state.pool).await?;
        store::agent_spend(&mut conn, agent_id, false).await?
    };
    let Some(spend) = spend else {
        return Ok(Some((Code::PaymentNotMade, "the agent no longer exists".into())));
    };
    if spend.disabled {
        return Ok(Some((Code::PaymentNotMade, "the agent is disabled".into())));
    }
    let (network, asset) = (requirement.network(), requirement.asset());
    let unit_ok =
        state.supported.unit().is_some() && state.supported.decimals(network, asset) == state.supported.unit();
    if !state.supported.allows_asset(network, asset) || !unit_ok {
        return Ok(Some((
            Code::PaymentUnsupported,
            format!("asset {asset} on {network} is no longer configured for payments"),
        )));
    }
    match spend.cap() {
        Err(_) => Ok(Some((Code::PaymentOverBudget, "the agent's limits cannot be read".into()))),
        Ok(Some(cap)) if requirement.amount() > cap => Ok(Some((
            Code::PaymentOverBudget,
            format!("the price {} exceeds the agent's per-call cap {cap}", requirement.amount()),
        ))),
        Ok(_) => Ok(None),
    }
}

/// The RPC endpoint serves another chain: no payment, 503 (the key stays in flight).
fn wrong_chain() -> Error {
    tracing::error!("an RPC endpoint serves another chain than its network; no payment is made");
    Error::PaymentNetworkUnavailable(
        "the payment network's RPC endpoint serves another chain; nothing was signed or paid",
    )
}

async fn chain_used(
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

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// First bytes of a nonce for logs.
fn short(nonce: &B256) -> String {
    nonce.to_string().chars().take(10).collect()
}
