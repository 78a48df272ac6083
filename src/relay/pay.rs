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

use std::time::{Duration, Instant};

use alloy::primitives::{Address, B256};
use reqwest::StatusCode;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Value, json};
use uuid::Uuid;

use super::request::RouteCall;
use super::view::{PaymentView, StoredIntent};
use super::{Error, Failure, Outcome, PaymentNote, remaining};
use crate::clock::now_unix;
use crate::codes::Code;
use crate::faults::{self, Point};
use crate::idempotency::Ownership;
use crate::payments::limits;
use crate::payments::store::{self, PaymentRow};
use crate::payments::{Final, PaymentStatus};
use crate::state::AppState;
use crate::upstream::{UpstreamError, UpstreamResponse};
use crate::x402::{self, Network, Requirement, SignedPayment, X402Version};

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

/// A 502 for a call that stopped after the upstream's 402 without paying in this attempt:
/// the 402 is the envelope's known part, and the call gets its receipt.
fn stopped_after_402(
    state: &AppState,
    first: UpstreamResponse,
    metric: &str,
    code: Code,
    msg: &str,
    payment: Option<PaymentView>,
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

/// The lower of two optional limits (None: no limit).
fn min_limit(a: Option<crate::money::Amount>, b: Option<crate::money::Amount>) -> Option<crate::money::Amount> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
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
    let (cap, left) = match spend.as_ref().map(|s| (s.cap(), s.remaining(), s.remaining_this_month())) {
        None => (None, None),
        Some((Ok(cap), Ok(day), Ok(month))) => (cap, min_limit(day, month)),
        Some(_) => {
            let why = "the agent's limits cannot be read";
            let accepts = Value::Array(required.raw_accepts.clone());
            return Ok(declined(state, Code::PaymentOverBudget, Some(first), why, accepts));
        }
    };
    let limit = min_limit(cap, left);
    // Only options whose payTo the agent may pay (all, without an allowlist).
    let allowed_pay_to = spend.as_ref().and_then(|s| s.allowed_pay_to.as_deref());
    let payable: Vec<Requirement> = required
        .accepts
        .iter()
        .filter(|r| {
            allowed_pay_to.is_none_or(|list| list.iter().any(|a| a.eq_ignore_ascii_case(&r.pay_to().to_string())))
        })
        .cloned()
        .collect();
    if payable.is_empty() && !required.accepts.is_empty() {
        let why = "no offered option pays a payTo address on the agent's allowlist";
        let accepts = Value::Array(required.raw_accepts.clone());
        return Ok(declined(state, Code::PaymentNotAllowed, Some(first), why, accepts));
    }
    let chosen = match x402::select(&payable, &state.supported, call.max_amount, limit) {
        Ok(r) => r.clone(),
        Err(rejection) => {
            let mut why = rejection.to_string();
            if let Some(left) = left.filter(|l| rejection.is_over_budget() && cap.is_none_or(|c| *l <= c)) {
                why.push_str(&format!(" (the agent's budgets have {left} left)"));
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

    let eip3009_nonce =
        x402::deterministic_nonce(&state.nonce_secret[..], own.agent_id, own.key.as_str(), &own.request_hash);
    let permit2_nonce = x402::permit2_nonce(&state.nonce_secret[..], own.agent_id, own.key.as_str(), &own.request_hash);
    let nonce = if x402::permit2::scheme_of(&chosen).is_some() { B256::from(permit2_nonce) } else { eip3009_nonce };
    let payer = state.config.signer.address();
    // Never pay a request twice, even if our own records were lost: ask every token this
    // nonce could have been used on, and every network's Permit2 (an earlier attempt may
    // have chosen another asset or transfer method).
    match used_anywhere(state, payer, eip3009_nonce, permit2_nonce).await {
        Ok(None) => {}
        Ok(Some((network, asset))) => {
            let payment =
                PaymentView::found_on_chain(required.version, chosen.scheme(), (network, asset), payer, nonce);
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
        Err(msg) => return Ok(stopped_after_402(state, first, "sign_failed", Code::PaymentNotMade, &msg.0, None)),
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
        valid_after: to_i64(attempt.signed.valid_after()),
        valid_before: to_i64(attempt.signed.valid_before()),
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
        store::Reservation::Refused(refusal) => {
            // An operator's limit refuses it (a concurrent payment may have taken the budget
            // first). This signature is dropped here: it was never stored nor sent.
            let accepts = Value::Array(required.raw_accepts.clone());
            return refused(state, refusal, Some(first), accepts);
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
        let shown = StoredIntent::decode(&row).ok()?.view(PaymentStatus::Unknown, None);
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
    let StoredIntent { version, signed } =
        StoredIntent::decode(&intent).map_err(|e| Error::invariant(e.to_string()))?;
    faults::at(state.faults.as_ref(), Point::ResumeStart).await;
    let used = match chain_used(state, &signed).await {
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
        let proven = super::settled::prove(state, own.agent_id, intent.id, &signed, None).await;
        let charged = proven.charged;
        let tx_hash = proven.tx_hash.map(|h| h.to_string()).or(intent.tx_hash.clone());
        if mode == Resume::KeyReused {
            // Paid before the key expired. If that call was never served (its answer lost),
            // a sign-in may still re-access what was paid for; a served one is never re-run.
            let unserved = matches!(
                intent.status,
                PaymentStatus::SettledResponseLost
                    | PaymentStatus::Signed
                    | PaymentStatus::Unknown
                    | PaymentStatus::Rejected
            );
            if unserved {
                let mut log = crate::payments::RecoveryStep::stored(intent.recovery.as_ref());
                let again = super::reaccess::reaccess(state, &intent, deadline).await;
                log.extend(again.log);
                if let Some(resp) = again.answer {
                    return Ok(reaccessed(state, own, version, &signed, intent.id, tx_hash, resp, log));
                }
            }
            state.metrics.payments.with_label_values(&["already_paid"]).inc();
            let previous_receipt = {
                let mut conn = super::error::conn(&state.pool).await?;
                crate::receipts::store::latest_for_request(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash)
                    .await?
            };
            let shown = PaymentView::of(version, &signed, intent.status, tx_hash.as_deref()).charged(charged);
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
        let note = crate::payments::RecoveryNote { kind, log: recovery.log };
        if let crate::recovery::Ending::Recovered { resp, tx_hash } = recovery.ending {
            state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
            state.metrics.payments.with_label_values(&["recovered"]).inc();
            tracing::info!(agent_id = %own.agent_id, upstream.status = resp.status, sends = recovery.sends,
                "the upstream's answer to a settled payment was recovered by a byte-identical re-send");
            super::count_paid(state, &signed, PaymentStatus::Settled, charged);
            let status = PaymentStatus::Settled;
            let tx_hash = Some(tx_hash.to_string());
            let shown =
                PaymentView::of(version, &signed, status, tx_hash.as_deref()).charged(charged).recovery(Some(kind));
            let ledger = Final { id: intent.id, status, tx_hash, error: None, recovery: Some(note) };
            return Ok(Outcome::Answered { resp, payment: Some(PaymentNote { shown, ledger: Some(ledger) }) });
        }
        // Nothing came back: for a GET/HEAD whose 402 advertised sign-in-with-x, sign in as
        // the payer and run the request again (a new execution, never a payment).
        let mut log = note.log;
        let again = super::reaccess::reaccess(state, &intent, deadline).await;
        log.extend(again.log);
        if let Some(resp) = again.answer {
            return Ok(reaccessed(state, own, version, &signed, intent.id, tx_hash, resp, log));
        }
        let note = crate::payments::RecoveryNote { kind, log };
        state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
        state.metrics.payments.with_label_values(&["settled_response_lost"]).inc();
        super::count_paid(state, &signed, PaymentStatus::SettledResponseLost, charged);
        tracing::warn!(agent_id = %own.agent_id, sends = recovery.sends,
            "resumed key was already paid on-chain and its answer could not be recovered: settled, response lost");
        let status = PaymentStatus::SettledResponseLost;
        let shown = PaymentView::of(version, &signed, status, tx_hash.as_deref()).charged(charged).recovery(Some(kind));
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
    let now = now_unix();
    let valid_before = signed.valid_before();
    if now < valid_before && now.saturating_add(MIN_VALIDITY_SECS) >= valid_before {
        // Too little validity left to resend, but the earlier authorization may still settle
        // (e.g. a `settlement_pending` transaction): nothing is signed until its validBefore has
        // passed unused (the same nonce would make a second transfer impossible anyway).
        tracing::info!(agent_id = %own.agent_id, "an earlier authorization may still settle; deferring the re-sign");
        return Err(Error::PaymentNetworkUnavailable(
            "an earlier authorization of this call may still settle until its validBefore; nothing was signed; \
             retry the same key later",
        ));
    }
    let attempt = if signed.is_valid_at(now, MIN_VALIDITY_SECS) {
        let name = HeaderName::from_bytes(intent.header_name.as_bytes()).map_err(|e| Error::Internal(e.into()))?;
        let value = HeaderValue::from_str(&intent.header_value).map_err(|e| Error::Internal(e.into()))?;
        tracing::info!(agent_id = %own.agent_id, "resending the unused, still valid payment of an abandoned attempt");
        Attempt { id: intent.id, version, signed, header: (name, value) }
    } else {
        let attempt = sign(state, version, &requirement, &context, signed.nonce()).map_err(Error::invariant)?;
        let auth = serde_json::to_value(&attempt.signed).map_err(|e| Error::Internal(e.into()))?;
        let header = attempt.header.1.to_str().map_err(|e| Error::Internal(e.into()))?;
        let a = &attempt.signed;
        let resign = store::Resign {
            id: intent.id,
            agent_id: own.agent_id,
            lease: own.lease,
            amount: requirement.amount(),
            pay_to: &intent.pay_to,
            valid_after: to_i64(a.valid_after()),
            valid_before: to_i64(a.valid_before()),
            authorization: &auth,
            header_value: header,
        };
        faults::at(state.faults.as_ref(), Point::BeforeResign).await;
        let mut conn = super::error::conn(&state.pool).await?;
        match store::resign(&mut conn, &resign).await? {
            store::Reservation::Reserved => {}
            store::Reservation::Fenced => return Err(Error::Superseded),
            store::Reservation::Refused(refusal) => {
                // The expired intent released its budget and a limit refuses a new one now
                // (or payments are paused). Nothing was sent in this attempt.
                let accepts = Value::Array(vec![raw_requirement.clone()]);
                return refused(state, refusal, None, accepts);
            }
        }
        tracing::info!(agent_id = %own.agent_id, "re-signed an expired, unused payment with the same nonce");
        Attempt { id: intent.id, ..attempt }
    };
    exchange(state, own, call, &attempt, deadline).await
}

/// A settled payment whose answer was lost, served again by signing in as the payer: a new
/// execution, recorded as a completed call whose payment says `recovery: "reaccessed"`.
#[expect(clippy::too_many_arguments, reason = "the parts of one recorded re-access")]
fn reaccessed(
    state: &AppState,
    own: &Ownership,
    version: X402Version,
    signed: &SignedPayment,
    id: Uuid,
    tx_hash: Option<String>,
    resp: UpstreamResponse,
    log: Vec<crate::payments::RecoveryStep>,
) -> Outcome {
    let kind = crate::payments::RecoveryKind::Reaccessed;
    state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
    state.metrics.payments.with_label_values(&[kind.as_str()]).inc();
    super::count_paid(state, signed, PaymentStatus::Settled, None);
    tracing::info!(agent_id = %own.agent_id, upstream.status = resp.status,
        "the answer to a settled payment was lost; the resource was re-accessed by signing in as the payer");
    let status = PaymentStatus::Settled;
    let shown = PaymentView::of(version, signed, status, tx_hash.as_deref()).recovery(Some(kind));
    let note = crate::payments::RecoveryNote { kind, log };
    let ledger = Final { id, status, tx_hash, error: None, recovery: Some(note) };
    Outcome::Answered { resp, payment: Some(PaymentNote { shown, ledger: Some(ledger) }) }
}

/// Signs `requirement` and builds the header of `version`.
fn sign(
    state: &AppState,
    version: X402Version,
    requirement: &Requirement,
    context: &Value,
    nonce: B256,
) -> Result<Attempt, PayError> {
    let max_auth = state.config.payments.max_auth_secs;
    let signed = x402::sign_payment(&state.config.signer, requirement, nonce, now_unix(), max_auth)
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
        // A 402 carrying a settlement claim (`settlement_pending`) is no refusal: the money may
        // still move. The chain decides, within the deadline (relay/pending.rs).
        Ok(resp) if resp.status == 402 && super::pending::claims_settlement(&resp) => {
            let paid = super::pending::Paid {
                id: attempt.id,
                signed,
                used: || chain_used(state, signed),
                describe: |status, tx: Option<&str>, charged| attempt.view(status, tx, charged),
            };
            super::pending::unanswered(state, own, paid, resp, deadline).await
        }
        Ok(resp) if resp.status == 402 || super::allowance::needs_permit2(&resp) => {
            let reasons = x402::wire::refusal_reasons(&resp.headers, &resp.body);
            // Paid and refused anyway: the money moved and the call was not served, so it is
            // `settled_response_lost` (visible to recovery), charged what the chain shows moved.
            let (status, proven) = match chain_used(state, signed).await {
                Ok(true) => {
                    let proven = super::settled::prove(state, own.agent_id, attempt.id, signed, None).await;
                    (PaymentStatus::SettledResponseLost, proven)
                }
                Ok(false) => (PaymentStatus::Rejected, super::settled::Proven::default()),
                Err(_) => (PaymentStatus::Unknown, super::settled::Proven::default()),
            };
            let tx_hash = proven.tx_hash.map(|h| h.to_string());
            state.metrics.payments.with_label_values(&[status.as_str()]).inc();
            super::count_paid(state, signed, status, proven.charged);
            let reason = reasons.error.clone().or(reasons.invalid_reason.clone()).or(reasons.error_reason.clone());
            let permit2 = reasons.names(x402::wire::PERMIT2_ALLOWANCE_REQUIRED);
            let msg = if permit2 && status == PaymentStatus::Rejected {
                super::allowance::message(signed)
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
        Ok(resp) => {
            let claim = x402::wire::parse_settlement(&resp.headers).ok().flatten();
            let claimed = claim.as_ref().is_some_and(|c| c.success);
            faults::at(state.faults.as_ref(), Point::BeforeConfirm).await;
            // The answer has arrived: it is recorded whatever the clock says; a settlement that
            // cannot be confirmed by the deadline is recorded `unknown` for `reconcile`.
            let (status, tx_hash, note, charged) =
                confirm(state, (own.agent_id, attempt.id), signed, claim.as_ref(), deadline).await;
            state.metrics.payments.with_label_values(&[status.as_str()]).inc();
            super::count_paid(state, signed, status, charged);
            tracing::info!(agent_id = %own.agent_id, payment.status = status.as_str(), upstream.status = resp.status, "paid request answered");
            // upto: the upstream's word, beside what the chain shows (`amount`).
            let said = claim.as_ref().and_then(|c| c.amount).map(|a| a.to_string());
            let shown = attempt.view(status, tx_hash.as_deref(), charged).claimed_amount(said);
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
    let (status, proven) = match chain_used(state, &attempt.signed).await {
        Ok(true) => {
            let proven = super::settled::prove(state, own.agent_id, attempt.id, &attempt.signed, None).await;
            (PaymentStatus::SettledResponseLost, proven)
        }
        // Not (yet) used: the upstream still holds a valid authorization until validBefore.
        _ => (PaymentStatus::Unknown, super::settled::Proven::default()),
    };
    let charged = proven.charged;
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
            let recorded = crate::payments::RecoveryNote { kind, log: recovery.log };
            if let crate::recovery::Ending::Recovered { resp, tx_hash } = recovery.ending {
                state.metrics.payments.with_label_values(&["recovered"]).inc();
                super::count_paid(state, &attempt.signed, PaymentStatus::Settled, charged);
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
    super::count_paid(state, &attempt.signed, status, charged);
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

/// What [`confirm`] found: the status, the proven transaction, a note for the ledger, and
/// (Permit2) the amount the chain shows moved.
type Confirmed = (PaymentStatus, Option<String>, Option<String>, Option<alloy::primitives::U256>);

/// Asks the chain whether the authorization was consumed. A claimed success is given a
/// moment to appear; a claimed transaction must exist and have succeeded to be recorded.
/// An `upto` answer whose claim charges nothing is not waited for: nothing is expected to
/// move, and the authorization stays reserved until the chain shows it used or expired.
async fn confirm(
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
        Ok(true) => {
            // Record only the transaction the chain shows consuming this nonce, whatever the
            // upstream claims, and (Permit2) the amount its logs show moving.
            let claimed_hash = claim.and_then(|c| c.tx_hash);
            let proven = super::settled::prove(state, agent_id, id, s, claimed_hash).await;
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

/// The first configured `(network, asset)` on which the request's EIP-3009 nonce, or its
/// Permit2 nonce (asset: Permit2), is used, if any. Any unreadable chain is an error: nothing
/// is signed without every answer. A network without Permit2 code has used no Permit2 nonce;
/// a token configured without EIP-3009 (`+permit2`) has no EIP-3009 nonce to ask.
async fn used_anywhere(
    state: &AppState,
    payer: Address,
    eip3009_nonce: B256,
    permit2_nonce: alloy::primitives::U256,
) -> Result<Option<(Network, Address)>, x402::ChainError> {
    for (network, asset) in state.supported.payable_assets() {
        if state.supported.is_permit2_only(network, asset) {
            continue;
        }
        if eip3009_used(state, network, asset, payer, eip3009_nonce).await? {
            return Ok(Some((network, asset)));
        }
    }
    let mut networks: Vec<Network> = state.supported.payable_assets().map(|(n, _)| n).collect();
    networks.dedup();
    for network in networks {
        let started = Instant::now();
        let r = state.chain.permit2_nonce_used(network, payer, permit2_nonce).await;
        state.metrics.rpc_seconds.with_label_values(&["nonceBitmap"]).observe(started.elapsed().as_secs_f64());
        match r {
            Ok(true) => return Ok(Some((network, x402::permit2::PERMIT2))),
            Ok(false) | Err(x402::ChainError::NoContract { .. }) => {}
            Err(e) => {
                state.metrics.rpc_errors.with_label_values(&["nonceBitmap"]).inc();
                return Err(e);
            }
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

/// Whether the signed payment's nonce is used on-chain (EIP-3009 `authorizationState`,
/// Permit2 `nonceBitmap`).
async fn chain_used(state: &AppState, signed: &SignedPayment) -> Result<bool, x402::ChainError> {
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

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// First bytes of a nonce for logs.
fn short(nonce: &B256) -> String {
    nonce.to_string().chars().take(10).collect()
}
