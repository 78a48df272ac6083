//! Paying on Solana (x402 `exact` on `solana:` networks): the EVM flow's walk — choose within
//! the agent's limits, sign, commit the intent, send, ask the chain — with the chain's own
//! at-most-once rule: a transaction lands at most once, and never after the block height
//! `lastValidBlockHeight` of its blockhash. A request is signed again only when the chain shows
//! its recorded transaction can never land ([`TransferState::may_sign_again`]), by the word of
//! every RPC endpoint of its network, at least two (`SvmEndpoints::fate`, in `resume`).
//!
//! The intent's row: `network` (CAIP-2), `asset` (the mint), `pay_to` and `payer` (base58),
//! `nonce` the request's deterministic nonce (stable across re-signings, so one intent per
//! request; also the transaction's memo unless the upstream asks for its own), and the signed
//! transfer ([`SignedSvmTransfer`]: the payer's signature, the blockhash and its last valid
//! height). `valid_before` only bounds the budget window; expiry is the chain's block height.
//!
//! What the chain says, never the upstream: an answer's settlement claim is believed only when
//! the transaction it names carries the payer's signature; otherwise the payer's own
//! transactions are searched (`SvmRpc::find_landed`).

mod resume;

use std::time::Instant;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;
use uuid::Uuid;

pub(super) use self::resume::resume;
use super::select::Declined;
use super::{SETTLEMENT_POLL_INTERVAL, SETTLEMENT_POLLS, Stop, declined, refused, to_i64, wrong_chain};
use crate::clock::now_unix;
use crate::codes::Code;
use crate::faults::{self, Point};
use crate::idempotency::Ownership;
use crate::money::Amount;
use crate::payments::store::{self, PaymentRow};
use crate::payments::{Final, PaymentStatus, RecoveryNote, limits};
use crate::recovery::{Ending, Proof};
use crate::relay::request::RouteCall;
use crate::relay::view::{PaymentView, StoredSvmIntent};
use crate::relay::{Error, Failure, Outcome, PaymentNote, remaining};
use crate::solana::Solana;
use crate::state::AppState;
use crate::upstream::{UpstreamError, UpstreamResponse};
use crate::x402::svm::{ComputeBudget, SignedSvmTransfer, SvmEndpoints, SvmRpc, SvmRpcError, SvmTerms, TransferState};
use crate::x402::{self, PaymentRequired, X402Version};

/// How long after signing a Solana payment counts in the 24-hour budget window at the least
/// (a blockhash lives 150 blocks, about a minute; the chain's block height decides expiry).
const WINDOW_BOUND_SECS: u64 = 300;

/// A signed Solana payment ready to send.
struct SvmAttempt {
    id: Uuid,
    version: X402Version,
    /// The request's deterministic nonce (hex), the ledger's `nonce`.
    nonce: String,
    signed: SignedSvmTransfer,
    header: (HeaderName, HeaderValue),
}

impl SvmAttempt {
    fn note(&self, status: PaymentStatus, tx: Option<String>, error: Option<String>) -> PaymentNote {
        note(self.id, (self.version, &self.signed, &self.nonce), (status, tx), error, None)
    }
}

/// The envelope's `payment` and the intent's final state.
fn note(
    id: Uuid,
    (version, signed, nonce): (X402Version, &SignedSvmTransfer, &str),
    (status, tx): (PaymentStatus, Option<String>),
    error: Option<String>,
    recovery: Option<RecoveryNote>,
) -> PaymentNote {
    let shown =
        PaymentView::svm(version, signed, nonce, status, tx.as_deref()).recovery(recovery.as_ref().map(|r| r.kind));
    PaymentNote { shown, ledger: Some(Final { id, status, tx_hash: tx, error, recovery }) }
}

/// Asks the upstream of a settled Solana payment whose answer was lost for that answer again: a
/// byte-identical re-send of the recorded request and payment (`crate::recovery`, which cannot
/// sign), only to an upstream that advertised `payment-identifier`. `Ok`: the original answer,
/// its claimed transaction proven to carry the payment; `Err`: what was tried (None: nothing).
async fn recover_answer(
    state: &AppState,
    intent: &PaymentRow,
    rpc: &SvmRpc,
    signed: &SignedSvmTransfer,
    deadline: Instant,
) -> Result<(UpstreamResponse, String, RecoveryNote), Option<RecoveryNote>> {
    if !state.config.recover_lost_answers || !crate::recovery::can_resend(intent) {
        return Err(None);
    }
    let opened = crate::secrets::intent::open(&state.config.secrets.keyring, intent);
    let recovery =
        crate::recovery::recover(&state.upstream, Proof::Svm(rpc, signed), (intent, &opened), deadline).await;
    let kind = recovery.kind();
    state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
    let note = RecoveryNote { kind, log: recovery.log };
    match recovery.ending {
        Ending::Recovered { resp, tx_hash } => {
            state.metrics.payments.with_label_values(&["recovered"]).inc();
            tracing::info!(
                upstream.status = resp.status,
                sends = recovery.sends,
                "the answer to a settled Solana payment, lost, was recovered by a byte-identical re-send"
            );
            Ok((resp, tx_hash, note))
        }
        Ending::Lost => Err(Some(note)),
    }
}

/// The 402's Solana options: its entries that read as SVM `exact` terms, with the entry as sent.
fn offered(required: &PaymentRequired) -> Vec<(SvmTerms, &Value)> {
    required.raw_accepts.iter().filter_map(|e| Some((SvmTerms::from_json(required.version, e).ok()?, e))).collect()
}

/// True when the router pays on Solana and the 402 offers a Solana option.
pub(super) fn offers(state: &AppState, required: &PaymentRequired) -> bool {
    state.solana.is_some() && !offered(required).is_empty()
}

/// Pays the 402's Solana option the agent may pay, if any: choose, sign, commit, send, confirm.
///
/// # Errors
/// [`Error`] when nothing may be recorded (database gone, lease lost, RPC of another chain).
pub(super) async fn pay(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    required: &PaymentRequired,
    first: UpstreamResponse,
    deadline: Instant,
) -> Result<Outcome, Error> {
    let Some(solana) = state.solana.as_deref() else {
        return Err(Error::invariant("Solana payment without Solana settings"));
    };
    let accepts = || Value::Array(required.raw_accepts.clone());
    let options = offered(required);
    let (terms, raw) = match choose(state, solana, own.agent_id, call, &options).await? {
        Ok(chosen) => chosen,
        Err((code, why)) => return Ok(declined(state, code, Some(first), &why, accepts())),
    };
    let Some(rpc) = solana.rpcs.of(&terms.network().caip2()).map(SvmEndpoints::primary) else {
        return Err(Error::invariant("a configured Solana network without an endpoint"));
    };
    let nonce = x402::deterministic_nonce(&state.nonce_secret[..], own.agent_id, own.key.as_str(), &own.request_hash);
    // `{version, resource, extensions}` (payment-identifier echoed with our own id when
    // advertised, so that a lost answer can be asked for again): what the payload is built from.
    let context = super::sign::context_of(state, own, required)?;
    let attempt = match sign(solana, rpc, terms, &context, nonce.to_string()).await? {
        Ok(attempt) => attempt,
        Err(stop) => return Ok(stop.outcome(state, first)),
    };
    let advertised = match required.extensions.as_ref() {
        Some(e) => Some(serde_json::to_vec(e).map_err(|e| Error::Internal(e.into()))?),
        None => None,
    };
    if let Some(refusal) = reserve(state, own, call, (terms, raw), (&context, advertised.as_deref()), &attempt).await? {
        return refused(state, refusal, Some(first), accepts());
    }
    tracing::info!(agent_id = %own.agent_id, payment.network = %attempt.signed.network, payment.amount = %attempt.signed.amount,
        "Solana payment signed and recorded; sending the paid request");
    exchange(state, own, call, rpc, &attempt, deadline).await
}

/// The cheapest Solana option the router and the agent's limits allow, or why none.
async fn choose<'a>(
    state: &AppState,
    solana: &Solana,
    agent_id: Uuid,
    call: &RouteCall,
    options: &'a [(SvmTerms, &'a Value)],
) -> Result<Result<(&'a SvmTerms, &'a Value), Declined>, Error> {
    let spend = {
        let mut conn = crate::relay::error::conn(&state.pool).await?;
        store::agent_spend(&mut conn, agent_id, false).await?
    };
    crate::relay::pay::select::refuse_disabled(spend.as_ref())?;
    let limit = match spend.as_ref().map(store::Spend::limits) {
        None => None,
        Some(Ok(limits)) => limits.headroom(),
        Some(Err(_)) => return Ok(Err((Code::PaymentOverBudget, "the agent's limits cannot be read".into()))),
    };
    let allowlist = spend.as_ref().and_then(|s| s.allowed_pay_to.as_deref());
    let payer = solana.config.signer.address();
    let mut best: Option<(&SvmTerms, &Value)> = None;
    // Why each option was refused, with how far it got (the 402's code is the furthest one's).
    let mut refusals: Vec<(u8, Code, String)> = Vec::new();
    for (i, (terms, raw)) in options.iter().enumerate() {
        let amount = Amount::from(terms.amount());
        let (network, mint) = (terms.network(), terms.mint());
        let decimals = solana.config.decimals(network, &mint);
        let refusal = if decimals.is_none() {
            Some((0, Code::PaymentUnsupported, format!("{mint} on {network} is not configured for payments")))
        } else if !in_unit(state, solana, decimals) {
            Some((0, Code::PaymentUnsupported, format!("{mint} on {network} is not in the router's unit")))
        } else if terms.fee_payer() == payer {
            Some((
                0,
                Code::PaymentUnsupported,
                "its feePayer is the router's own wallet (it would pay the fees)".into(),
            ))
        } else if amount.is_zero() {
            Some((0, Code::PaymentUnsupported, "its amount is zero".into()))
        } else if allowlist.is_some_and(|l| !l.iter().any(|a| limits::pay_to_matches(a, &terms.pay_to().to_string()))) {
            Some((1, Code::PaymentNotAllowed, format!("its payTo {} is not on the agent's allowlist", terms.pay_to())))
        } else if amount > call.max_amount {
            Some((3, Code::PaymentOverMaxAmount, format!("its amount {amount} exceeds max_amount {}", call.max_amount)))
        } else {
            limit.filter(|l| amount > *l).map(|limit| {
                (2, Code::PaymentOverBudget, format!("its amount {amount} exceeds the agent's limits ({limit} left)"))
            })
        };
        match refusal {
            Some((rank, code, why)) => refusals.push((rank, code, format!("Solana option {i}: {why}"))),
            None if best.is_none_or(|(b, _)| terms.amount() < b.amount()) => best = Some((terms, *raw)),
            None => {}
        }
    }
    Ok(best.ok_or_else(|| {
        let code = refusals.iter().max_by_key(|r| r.0).map_or(Code::PaymentUnsupported, |r| r.1);
        (code, refusals.into_iter().map(|r| r.2).collect::<Vec<_>>().join("; "))
    }))
}

/// Reads the mint and a fresh blockhash from the chain and signs the transfer of `terms` (the
/// upstream's fee payer pays the fees; the router's wallet signs as the token owner only).
///
/// # Errors
/// [`Error::PaymentNetworkUnavailable`] for an endpoint serving another chain (nothing signed).
async fn sign(
    solana: &Solana,
    rpc: &SvmRpc,
    terms: &SvmTerms,
    context: &Value,
    nonce: String,
) -> Result<Result<SvmAttempt, Stop>, Error> {
    let mint = terms.mint();
    let read = tokio::try_join!(rpc.mint(&mint), rpc.latest_blockhash());
    let (mint, blockhash) = match read {
        Ok(r) => r,
        Err(SvmRpcError::WrongChain { .. }) => return Err(wrong_chain()),
        Err(e @ (SvmRpcError::NoMint | SvmRpcError::NotAMint)) => {
            let msg = format!(
                "the asset {} is not an SPL mint on {}: {e}; nothing was signed",
                terms.mint(),
                terms.network()
            );
            return Ok(Err(Stop::new("sign_failed", Code::PaymentNotMade, msg)));
        }
        Err(e) => {
            let msg = format!("cannot read the payment network ({e}); nothing was signed or paid");
            return Ok(Err(Stop::new("rpc_unavailable", Code::PaymentNotMade, msg)));
        }
    };
    let configured = solana.config.decimals(terms.network(), &terms.mint());
    if configured != Some(mint.decimals) {
        let msg = format!(
            "the chain says the mint {} has {} decimals, not the configured {}; nothing was signed",
            terms.mint(),
            mint.decimals,
            configured.map_or_else(|| "none".to_owned(), |d| d.to_string())
        );
        return Ok(Err(Stop::new("sign_failed", Code::PaymentNotMade, msg)));
    }
    let compute = ComputeBudget { unit_price: solana.config.compute_unit_price, ..ComputeBudget::default() };
    let signed = match x402::svm::sign_transfer(&solana.config.signer, terms, &mint, &blockhash, &nonce, compute) {
        Ok(s) => s,
        Err(e) => {
            return Ok(Err(Stop::new("sign_failed", Code::PaymentNotMade, format!("cannot sign the payment: {e}"))));
        }
    };
    Ok(match header(terms, context, &signed) {
        Ok(header) => Ok(SvmAttempt { id: Uuid::new_v4(), version: terms.version(), nonce, signed, header }),
        Err(msg) => Err(Stop::new("sign_failed", Code::PaymentNotMade, msg.0)),
    })
}

/// True when a mint of `decimals` is in the router's unit (that of its EVM assets too, once
/// they are known: caps and budgets are atomic units of one unit).
fn in_unit(state: &AppState, solana: &Solana, decimals: Option<u8>) -> bool {
    let unit = solana.config.unit;
    decimals == Some(unit) && state.supported.unit().is_none_or(|u| u == unit)
}

/// The payment header of `signed`.
fn header(
    terms: &SvmTerms,
    context: &Value,
    signed: &SignedSvmTransfer,
) -> Result<(HeaderName, HeaderValue), super::PayError> {
    let resource = context.get("resource").filter(|v| !v.is_null());
    let extensions = context.get("extensions").filter(|v| !v.is_null());
    let payload = x402::svm::payment_payload(terms, resource, &signed.transaction, extensions);
    let (name, value) = x402::wire::encode_payment_header(terms.version(), &payload)
        .map_err(|e| format!("cannot encode the payment: {e}"))?;
    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("bad payment header name: {e}"))?;
    Ok((name, value))
}

/// Commits the intent before the payment leaves (fenced by the lease; the agent's limits
/// checked again under its lock); a refusal by an operator's limit, if any.
async fn reserve(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    (terms, raw): (&SvmTerms, &Value),
    (context, advertised): (&Value, Option<&[u8]>),
    attempt: &SvmAttempt,
) -> Result<Option<limits::Refusal>, Error> {
    let signed = &attempt.signed;
    let authorization = serde_json::to_value(signed).map_err(|e| Error::Internal(e.into()))?;
    let header_value = attempt.header.1.to_str().map_err(|e| Error::Internal(e.into()))?;
    let json = |v: &Value| serde_json::to_vec(v).map_err(|e| Error::Internal(e.into()));
    let exact = crate::payments::sealed::Exact {
        request: Some(crate::recovery::as_sent(&call.upstream).map_err(Error::invariant)?),
        header_value: header_value.to_owned(),
        requirement_json: json(raw)?,
        context_json: json(context)?,
        advertised_extensions: advertised.map(<[u8]>::to_vec),
    };
    let kept = super::reserve::keep(state, own.agent_id, attempt.id, &exact)?;
    let now = now_unix();
    let row = store::NewPayment {
        id: attempt.id,
        agent_id: own.agent_id,
        credential: &own.credential,
        idempotency_key: own.key.as_str(),
        request_hash: &own.request_hash,
        lease: own.lease,
        x402_version: i16::from(attempt.version.number()),
        scheme: "exact",
        network: &signed.network,
        asset: &signed.mint,
        amount: Amount::from(terms.amount()),
        pay_to: &signed.pay_to,
        payer: &signed.payer,
        nonce: &attempt.nonce,
        valid_after: to_i64(now),
        valid_before: to_i64(now.saturating_add(WINDOW_BOUND_SECS)),
        authorization: &authorization,
        header_name: attempt.header.0.as_str(),
        kept: &kept,
    };
    faults::at(state.faults.as_ref(), Point::BeforeIntent).await;
    let mut conn = crate::relay::error::conn(&state.pool).await?;
    super::reserve::fenced(store::reserve(&mut conn, &row).await?)
}

/// Sends the paid request (the lease seen held first) and asks the chain what became of it.
async fn exchange(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    rpc: &SvmRpc,
    attempt: &SvmAttempt,
    deadline: Instant,
) -> Result<Outcome, Error> {
    let sent = super::exchange::send(state, own, call, &attempt.header, deadline).await?;
    Ok(match sent {
        Err(e) => lost_answer(state, own, rpc, attempt, &e, deadline).await,
        Ok(resp) if resp.status == 402 => refused_after_paying(state, rpc, attempt, resp).await,
        Ok(resp) => answered(state, own, rpc, attempt, resp, deadline).await,
    })
}

/// The paid request was answered: settled only when the chain shows a transaction carrying the
/// payer's signature (the claimed one first), given a moment when a settlement is claimed.
async fn answered(
    state: &AppState,
    own: &Ownership,
    rpc: &SvmRpc,
    attempt: &SvmAttempt,
    resp: UpstreamResponse,
    deadline: Instant,
) -> Outcome {
    let claim = x402::wire::parse_settlement(&resp.headers).ok().flatten();
    let claimed = claim.as_ref().is_some_and(|c| c.success);
    let claimed_id = claim.as_ref().filter(|_| claimed).and_then(|c| c.transaction.clone());
    faults::at(state.faults.as_ref(), Point::BeforeConfirm).await;
    let polls = if claimed { SETTLEMENT_POLLS } else { 1 };
    let mut found = Ok(None);
    for i in 0..polls {
        if i > 0 {
            if remaining(deadline) < SETTLEMENT_POLL_INTERVAL {
                break;
            }
            tokio::time::sleep(SETTLEMENT_POLL_INTERVAL).await;
        }
        found = landed(rpc, &attempt.signed, claimed_id.as_deref()).await;
        if !matches!(found, Ok(None)) {
            break;
        }
    }
    let (status, tx, note) = match found {
        Ok(Some(l)) if l.error.is_none() => {
            let note = claimed_id
                .filter(|c| *c != l.tx_id)
                .map(|c| format!("the claimed transaction {c} does not carry this payment"));
            (PaymentStatus::Settled, Some(l.tx_id), note)
        }
        Ok(Some(l)) => (
            PaymentStatus::NotSettled,
            None,
            Some(format!("the payment's transaction {} failed on chain; nothing moved", l.tx_id)),
        ),
        Ok(None) if claimed => (
            PaymentStatus::Unconfirmed,
            None,
            Some("the upstream claimed settlement, but the chain shows no transaction carrying this payment".into()),
        ),
        Ok(None) => (PaymentStatus::NotSettled, None, None),
        Err(e) => (PaymentStatus::Unknown, None, Some(format!("settlement could not be checked: {e}"))),
    };
    count(state, &attempt.signed, status);
    tracing::info!(agent_id = %own.agent_id, payment.status = status.as_str(), upstream.status = resp.status, "paid request answered");
    let error = note.or_else(|| claim.as_ref().filter(|_| !claimed).and_then(|c| c.error_reason.clone()));
    Outcome::Answered { resp, payment: Some(attempt.note(status, tx, error)) }
}

/// The transaction carrying `signed`: the claimed one if it does, else the payer's own
/// transactions searched.
async fn landed(
    rpc: &SvmRpc,
    signed: &SignedSvmTransfer,
    claimed: Option<&str>,
) -> Result<Option<x402::svm::rpc::Landed>, SvmRpcError> {
    if let Some(id) = claimed
        && let Some(l) = rpc.landed_as(signed, id).await?
    {
        return Ok(Some(l));
    }
    rpc.find_landed(signed).await
}

/// The upstream answered the paid request 402: refused, unless the chain shows the money moved
/// (then `settled_response_lost`). A transaction it keeps may still land until its blockhash
/// expires: the reservation stays until `reconcile` sees it land or expire.
async fn refused_after_paying(state: &AppState, rpc: &SvmRpc, attempt: &SvmAttempt, resp: UpstreamResponse) -> Outcome {
    let reasons = x402::wire::refusal_reasons(&resp.headers, &resp.body);
    let (status, tx) = match rpc.transfer_state(&attempt.signed).await {
        Ok(TransferState::Settled { tx_id, .. }) => (PaymentStatus::SettledResponseLost, Some(tx_id)),
        Ok(_) => (PaymentStatus::Rejected, None),
        Err(_) => (PaymentStatus::Unknown, None),
    };
    count(state, &attempt.signed, status);
    let reason = reasons.error.clone().or(reasons.invalid_reason.clone()).or(reasons.error_reason.clone());
    let msg = format!("upstream rejected the payment: {}", reason.as_deref().unwrap_or("no reason given"));
    let code = match status {
        PaymentStatus::Rejected => Code::PaymentRejected,
        PaymentStatus::SettledResponseLost => Code::SettledResponseLost,
        _ => Code::PaymentUnknown,
    };
    Outcome::Failed(
        Failure::new(code, msg)
            .upstream(resp)
            .payment(Some(attempt.note(status, tx, reason)))
            .reason("invalidReason", reasons.invalid_reason)
            .reason("errorReason", reasons.error_reason),
    )
}

/// No answer to the paid request: the chain says whether money moved.
async fn lost_answer(
    state: &AppState,
    own: &Ownership,
    rpc: &SvmRpc,
    attempt: &SvmAttempt,
    e: &UpstreamError,
    deadline: Instant,
) -> Outcome {
    let (status, tx) = match rpc.transfer_state(&attempt.signed).await {
        Ok(TransferState::Settled { tx_id, .. }) => (PaymentStatus::SettledResponseLost, Some(tx_id)),
        _ => (PaymentStatus::Unknown, None),
    };
    let mut recorded = None;
    // Paid and the answer lost: while the route deadline allows, ask for it again.
    if status == PaymentStatus::SettledResponseLost && remaining(deadline) >= super::MIN_RECOVERY_TIME {
        let intent = match crate::relay::error::conn(&state.pool).await {
            Ok(mut conn) => {
                store::find(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash).await.ok().flatten()
            }
            Err(_) => None,
        };
        if let Some(intent) = intent {
            match recover_answer(state, &intent, rpc, &attempt.signed, deadline).await {
                Ok((resp, tx_hash, recovery)) => {
                    count(state, &attempt.signed, PaymentStatus::Settled);
                    let ids = (attempt.version, &attempt.signed, attempt.nonce.as_str());
                    let payment = note(attempt.id, ids, (PaymentStatus::Settled, Some(tx_hash)), None, Some(recovery));
                    return Outcome::Answered { resp, payment: Some(payment) };
                }
                Err(tried) => recorded = tried,
            }
        }
    }
    count(state, &attempt.signed, status);
    let (code, msg) = if status == PaymentStatus::SettledResponseLost {
        (Code::SettledResponseLost, format!("{e}; the payment settled on-chain but the response was lost"))
    } else {
        let msg =
            format!("{e}; the payment was not seen on-chain (its transaction can land until its blockhash expires)");
        (Code::PaymentUnknown, msg)
    };
    let ids = (attempt.version, &attempt.signed, attempt.nonce.as_str());
    let payment = note(attempt.id, ids, (status, tx), Some(e.to_string()), recorded);
    Outcome::Failed(Failure::new(code, msg).timeout(matches!(e, UpstreamError::Timeout)).payment(Some(payment)))
}

/// Counts the outcome, and what was paid when money moved.
fn count(state: &AppState, signed: &SignedSvmTransfer, status: PaymentStatus) {
    state.metrics.payments.with_label_values(&[status.as_str()]).inc();
    if status.is_spent() {
        let amount = signed.amount.parse::<u64>().unwrap_or(0);
        state.metrics.count_paid(&signed.network, &signed.mint, alloy::primitives::U256::from(amount));
    }
}

/// The view of a stored Solana intent in `status`, if it can be read.
pub(super) fn stored_view(row: &PaymentRow, status: PaymentStatus) -> Option<PaymentView> {
    Some(StoredSvmIntent::decode(row).ok()?.view(status, None))
}
