//! Picking up a recorded intent of this request: a takeover after a crash, or the same request
//! re-sent under a key that expired. The chain decides first (used ⇒ never pay again).

use std::time::Instant;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;

use super::{Attempt, MIN_VALIDITY_SECS, Resume, declined, refused, wrong_chain};
use crate::clock::now_unix;
use crate::codes::Code;
use crate::faults::{self, Point};
use crate::idempotency::Ownership;
use crate::payments::sealed::Opened;
use crate::payments::store::PaymentRow;
use crate::payments::{Final, PaymentStatus};
use crate::relay::request::RouteCall;
use crate::relay::view::{PaymentView, StoredIntent};
use crate::relay::{Error, Failure, Outcome, PaymentNote};
use crate::state::AppState;
use crate::upstream::UpstreamResponse;
use crate::x402::{self, Requirement, SignedPayment, X402Version};

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
    if crate::solana::is_solana_network(&intent.network) {
        return super::svm::resume(state, own, call, intent, deadline, mode).await;
    }
    let decoded = StoredIntent::decode(&intent).map_err(|e| Error::invariant(e.to_string()))?;
    faults::at(state.faults.as_ref(), Point::ResumeStart).await;
    let used = match super::confirm::chain_used(state, &decoded.signed).await {
        Ok(used) => used,
        Err(x402::ChainError::ChainIdMismatch { .. }) => return Err(wrong_chain()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot check a resumed payment on-chain; deferring");
            return Err(Error::Unavailable(
                "the payment network cannot be read to check an earlier payment; retry later",
            ));
        }
    };
    // The request as sent and the exact terms, opened once (sealed in the ledger).
    let opened = crate::secrets::intent::open(&state.config.secrets.keyring, &intent);
    if used {
        return paid_before(state, own, (&intent, &opened), decoded, deadline, mode).await;
    }
    send_again(state, own, call, (&intent, &opened), decoded, deadline).await
}

/// The recorded intent is used on-chain: never pay again. A reused key points at the earlier
/// receipt (or re-accesses an answer never served); a takeover tries to get the lost answer
/// back (recovery, then sign-in re-access) and is otherwise settled, response lost.
async fn paid_before(
    state: &AppState,
    own: &Ownership,
    (intent, opened): (&PaymentRow, &Opened),
    decoded: StoredIntent,
    deadline: Instant,
    mode: Resume,
) -> Result<Outcome, Error> {
    let StoredIntent { version, signed } = decoded;
    let proven = crate::relay::settled::prove(state, own.agent_id, intent.id, &signed, None).await;
    let charged = proven.charged;
    let tx_hash = proven.tx_hash.map(|h| h.to_string()).or(intent.tx_hash.clone());
    if mode == Resume::KeyReused {
        return key_reused(state, own, (intent, opened), (version, &signed), tx_hash, charged, deadline).await;
    }
    // Paid, and the answer was lost: try to get it back without paying again
    // (crate::recovery cannot sign; it re-sends the stored bytes or nothing).
    let recovery = if state.config.recover_lost_answers {
        let proof = crate::recovery::Proof::Evm(&state.chain);
        crate::recovery::recover(&state.upstream, proof, (intent, opened), deadline).await
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
        crate::relay::count_paid(state, &signed, PaymentStatus::Settled, charged);
        let status = PaymentStatus::Settled;
        let tx_hash = Some(tx_hash.to_string());
        let shown = PaymentView::of(version, &signed, status, tx_hash.as_deref()).charged(charged).recovery(Some(kind));
        let ledger = Final { id: intent.id, status, tx_hash, error: None, recovery: Some(note) };
        return Ok(Outcome::Answered { resp, payment: Some(PaymentNote { shown, ledger: Some(ledger) }) });
    }
    // Nothing came back: for a GET/HEAD whose 402 advertised sign-in-with-x, sign in as
    // the payer and run the request again (a new execution, never a payment).
    let mut log = note.log;
    let again = crate::relay::reaccess::reaccess(state, own, (intent, opened), deadline).await?;
    log.extend(again.log);
    if let Some(resp) = again.answer {
        return Ok(reaccessed(state, own, version, &signed, intent.id, tx_hash, resp, log));
    }
    let note = crate::payments::RecoveryNote { kind, log };
    state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
    state.metrics.payments.with_label_values(&["settled_response_lost"]).inc();
    crate::relay::count_paid(state, &signed, PaymentStatus::SettledResponseLost, charged);
    tracing::warn!(agent_id = %own.agent_id, sends = recovery.sends,
        "resumed key was already paid on-chain and its answer could not be recovered: settled, response lost");
    let status = PaymentStatus::SettledResponseLost;
    let shown = PaymentView::of(version, &signed, status, tx_hash.as_deref()).charged(charged).recovery(Some(kind));
    let ledger = Final { id: intent.id, status, tx_hash, error: None, recovery: Some(note) };
    let msg = "payment settled on-chain but the upstream's response was lost; the router will not pay again";
    let payment = Some(PaymentNote { shown, ledger: Some(ledger) });
    Ok(Outcome::Failed(Failure::new(Code::SettledResponseLost, msg).payment(payment)))
}

/// Paid before the key expired. If that call was never served (its answer lost), a sign-in
/// may still re-access what was paid for; a served one is never re-run.
async fn key_reused(
    state: &AppState,
    own: &Ownership,
    (intent, opened): (&PaymentRow, &Opened),
    (version, signed): (X402Version, &SignedPayment),
    tx_hash: Option<String>,
    charged: Option<alloy::primitives::U256>,
    deadline: Instant,
) -> Result<Outcome, Error> {
    // Paid before the key expired. If that call was never served (its answer lost),
    // a sign-in may still re-access what was paid for; a served one is never re-run.
    let unserved = matches!(
        intent.status,
        PaymentStatus::SettledResponseLost | PaymentStatus::Signed | PaymentStatus::Unknown | PaymentStatus::Rejected
    );
    if unserved {
        let mut log = crate::payments::RecoveryStep::stored(intent.recovery.as_ref());
        let again = crate::relay::reaccess::reaccess(state, own, (intent, opened), deadline).await?;
        log.extend(again.log);
        if let Some(resp) = again.answer {
            return Ok(reaccessed(state, own, version, signed, intent.id, tx_hash, resp, log));
        }
    }
    state.metrics.payments.with_label_values(&["already_paid"]).inc();
    let previous_receipt = {
        let mut conn = crate::relay::error::conn(&state.pool).await?;
        crate::receipts::store::latest_for_request(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash).await?
    };
    let shown = PaymentView::of(version, signed, intent.status, tx_hash.as_deref()).charged(charged);
    Ok(Outcome::AlreadyPaid { previous_receipt, payment: shown })
}

/// The recorded intent is unused: resend it while it stays valid, or sign it again with the
/// same nonce once it expired, after checking the agent and the configuration still allow it.
async fn send_again(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    (intent, opened): (&PaymentRow, &Opened),
    decoded: StoredIntent,
    deadline: Instant,
) -> Result<Outcome, Error> {
    let StoredIntent { version, signed } = decoded;
    // The exact copies that were signed (sealed; the JSONB columns are redacted copies).
    let exact = match opened.exact() {
        Ok(exact) => exact,
        Err(why) => return Ok(super::not_resumable(&why)),
    };
    let stored = exact.requirement().and_then(|r| Ok((r, exact.context()?)));
    let (raw_requirement, context) =
        stored.map_err(|e| Error::invariant(format!("stored requirement unreadable: {e}")))?;
    let requirement = Requirement::from_json(version, 0, &raw_requirement)
        .map_err(|e| Error::invariant(format!("stored requirement unreadable: {e}")))?;
    if let Some((code, why)) = super::select::still_allowed(state, own.agent_id, &requirement).await? {
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
        let value = HeaderValue::from_str(&exact.header_value).map_err(|e| Error::Internal(e.into()))?;
        tracing::info!(agent_id = %own.agent_id, "resending the unused, still valid payment of an abandoned attempt");
        Attempt { id: intent.id, version, signed, header: (name, value) }
    } else {
        let attempt =
            super::sign::sign(state, version, &requirement, &context, signed.nonce()).map_err(Error::invariant)?;
        if let Some(refusal) = super::reserve::resign(state, own, (intent, exact), &requirement, &attempt).await? {
            // The expired intent released its budget and a limit refuses a new one now
            // (or payments are paused). Nothing was sent in this attempt.
            return refused(state, refusal, None, Value::Array(vec![raw_requirement]));
        }
        tracing::info!(agent_id = %own.agent_id, "re-signed an expired, unused payment with the same nonce");
        Attempt { id: intent.id, ..attempt }
    };
    super::exchange::exchange(state, own, call, &attempt, deadline).await
}

/// A settled payment whose answer was lost, served again by signing in as the payer: a new
/// execution, recorded as a completed call whose payment says `recovery: "reaccessed"`.
#[expect(clippy::too_many_arguments, reason = "the parts of one recorded re-access")]
fn reaccessed(
    state: &AppState,
    own: &Ownership,
    version: X402Version,
    signed: &SignedPayment,
    id: uuid::Uuid,
    tx_hash: Option<String>,
    resp: UpstreamResponse,
    log: Vec<crate::payments::RecoveryStep>,
) -> Outcome {
    let kind = crate::payments::RecoveryKind::Reaccessed;
    state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
    state.metrics.payments.with_label_values(&[kind.as_str()]).inc();
    crate::relay::count_paid(state, signed, PaymentStatus::Settled, None);
    tracing::info!(agent_id = %own.agent_id, upstream.status = resp.status,
        "the answer to a settled payment was lost; the resource was re-accessed by signing in as the payer");
    let status = PaymentStatus::Settled;
    let shown = PaymentView::of(version, signed, status, tx_hash.as_deref()).recovery(Some(kind));
    let note = crate::payments::RecoveryNote { kind, log };
    let ledger = Final { id, status, tx_hash, error: None, recovery: Some(note) };
    Outcome::Answered { resp, payment: Some(PaymentNote { shown, ledger: Some(ledger) }) }
}
