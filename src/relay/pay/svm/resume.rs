//! Picking up a recorded Solana intent (a takeover, or a key reused for the same request): the
//! chain decides first, and a new transaction is signed only once the recorded one can never
//! land, by the word of every RPC endpoint of its network, at least two
//! (`SvmEndpoints::fate`): one endpoint's lagging, pruned or lying signature index never makes
//! the router pay twice.

use std::time::Instant;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;
use uuid::Uuid;

use super::{SvmAttempt, WINDOW_BOUND_SECS, count, exchange, in_unit, note, recover_answer, sign};
use crate::clock::now_unix;
use crate::codes::Code;
use crate::faults::{self, Point};
use crate::idempotency::Ownership;
use crate::money::Amount;
use crate::payments::PaymentStatus;
use crate::payments::store::{self, PaymentRow};
use crate::relay::pay::{Resume, Stop, declined, refused, to_i64, wrong_chain};
use crate::relay::request::RouteCall;
use crate::relay::view::{PaymentView, StoredSvmIntent};
use crate::relay::{Error, Failure, Outcome};
use crate::solana::Solana;
use crate::state::AppState;
use crate::x402::svm::{SignedSvmTransfer, SvmRpc, SvmRpcError, SvmTerms, TransferState};
use crate::x402::{self, X402Version};

/// Picks up the recorded Solana intent of this request (a takeover, or a key reused for the
/// same request). The chain decides first: landed ⇒ never pay again; can still land ⇒ resend
/// the same transaction (it lands at most once); can never land ⇒ sign again with the same
/// nonce and memo, after the agent and the settings are checked again.
///
/// # Errors
/// [`Error::PaymentNetworkUnavailable`] when the chain cannot say (nothing decided or paid).
pub(crate) async fn resume(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    intent: PaymentRow,
    deadline: Instant,
    mode: Resume,
) -> Result<Outcome, Error> {
    let unavailable = Error::PaymentNetworkUnavailable(
        "an earlier Solana payment of this call cannot be checked (its network is not configured or cannot be \
         read); nothing was signed or paid; retry later",
    );
    let StoredSvmIntent { version, signed, .. } = StoredSvmIntent::decode(&intent).map_err(Error::invariant)?;
    let Some((solana, endpoints)) = state.solana.as_deref().and_then(|s| Some((s, s.rpcs.of(&signed.network)?))) else {
        return Err(unavailable);
    };
    let rpc = endpoints.primary();
    faults::at(state.faults.as_ref(), Point::ResumeStart).await;
    let fate = match endpoints.fate(&signed).await {
        Ok(fate) => fate,
        Err(SvmRpcError::WrongChain { .. }) => return Err(wrong_chain()),
        Err(e @ (SvmRpcError::NoSecondOpinion | SvmRpcError::Disagreement | SvmRpcError::HistoryPruned { .. })) => {
            tracing::warn!(error = %e, "a resumed Solana payment may never land, but that is not confirmed; nothing is signed again");
            return Err(Error::PaymentNetworkUnavailable(
                "an earlier Solana payment of this call may never land, but not every RPC endpoint of its network \
                 confirms it; nothing was signed or paid; retry later",
            ));
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot check a resumed Solana payment on-chain; deferring");
            return Err(unavailable);
        }
    };
    let attempt = |signed: SignedSvmTransfer, header| SvmAttempt {
        id: intent.id,
        version,
        nonce: intent.nonce.clone(),
        signed,
        header,
    };
    match fate {
        TransferState::Settled { tx_id, .. } => {
            paid_before(state, own, (&intent, rpc), (version, signed), tx_id, (deadline, mode)).await
        }
        TransferState::Failed { finalized: false, .. } => Err(Error::PaymentNetworkUnavailable(
            "an earlier Solana transaction of this call failed and is not final yet; nothing was signed; retry later",
        )),
        TransferState::Pending { .. } => {
            if let Some((code, why)) = still_allowed(state, solana, own.agent_id, &signed).await? {
                return Ok(declined(state, code, None, &why, Value::Array(vec![intent.requirement.clone()])));
            }
            let opened = crate::secrets::intent::open(&state.config.secrets.keyring, &intent);
            let exact = match opened.exact() {
                Ok(exact) => exact,
                Err(why) => return Ok(super::super::not_resumable(&why)),
            };
            let name = HeaderName::from_bytes(intent.header_name.as_bytes()).map_err(|e| Error::Internal(e.into()))?;
            let value = HeaderValue::from_str(&exact.header_value).map_err(|e| Error::Internal(e.into()))?;
            tracing::info!(agent_id = %own.agent_id, "resending the Solana transaction of an abandoned attempt (it lands at most once)");
            exchange(state, own, call, rpc, &attempt(signed, (name, value)), deadline).await
        }
        TransferState::Expired { .. } | TransferState::Failed { finalized: true, .. } => {
            sign_again(state, own, call, (solana, rpc), &intent, version, deadline).await
        }
    }
}

/// The recorded transaction landed: never pay again. A reused key points at the earlier
/// receipt; a takeover asks for the lost answer again (payment-identifier), else it is
/// settled, response lost.
async fn paid_before(
    state: &AppState,
    own: &Ownership,
    (intent, rpc): (&PaymentRow, &SvmRpc),
    (version, signed): (X402Version, SignedSvmTransfer),
    tx_id: String,
    (deadline, mode): (Instant, Resume),
) -> Result<Outcome, Error> {
    let shown = PaymentView::svm(version, &signed, &intent.nonce, PaymentStatus::Settled, Some(&tx_id));
    if mode == Resume::KeyReused {
        state.metrics.payments.with_label_values(&["already_paid"]).inc();
        let previous_receipt = {
            let mut conn = crate::relay::error::conn(&state.pool).await?;
            crate::receipts::store::latest_for_request(&mut conn, own.agent_id, own.key.as_str(), &own.request_hash)
                .await?
        };
        return Ok(Outcome::AlreadyPaid { previous_receipt, payment: shown });
    }
    // Paid, and the answer was lost: try to get it back without paying again.
    let ids = (version, &signed, intent.nonce.as_str());
    let tried = match recover_answer(state, intent, rpc, &signed, deadline).await {
        Ok((resp, tx_hash, recovery)) => {
            count(state, &signed, PaymentStatus::Settled);
            let payment = note(intent.id, ids, (PaymentStatus::Settled, Some(tx_hash)), None, Some(recovery));
            return Ok(Outcome::Answered { resp, payment: Some(payment) });
        }
        Err(tried) => tried,
    };
    let status = PaymentStatus::SettledResponseLost;
    count(state, &signed, status);
    tracing::warn!(agent_id = %own.agent_id, "resumed key was already paid on Solana: settled, response lost");
    let msg = "payment settled on-chain but the upstream's response was lost; the router will not pay again";
    let payment = note(intent.id, ids, (status, Some(tx_id)), None, tried);
    Ok(Outcome::Failed(Failure::new(Code::SettledResponseLost, msg).payment(Some(payment))))
}

/// The recorded transaction can never land: sign the same terms again (new blockhash, same
/// nonce and memo), record it over the old one, and send it.
async fn sign_again(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    (solana, rpc): (&Solana, &SvmRpc),
    intent: &PaymentRow,
    version: X402Version,
    deadline: Instant,
) -> Result<Outcome, Error> {
    let opened = crate::secrets::intent::open(&state.config.secrets.keyring, intent);
    let exact = match opened.exact() {
        Ok(exact) => exact,
        Err(why) => return Ok(super::super::not_resumable(&why)),
    };
    let stored = exact.requirement().and_then(|r| Ok((r, exact.context()?)));
    let (raw, context) = stored.map_err(|e| Error::invariant(format!("stored requirement unreadable: {e}")))?;
    let terms = SvmTerms::from_json(version, &raw)
        .map_err(|e| Error::invariant(format!("stored requirement unreadable: {e}")))?;
    let attempt = match sign(solana, rpc, &terms, &context, intent.nonce.clone()).await? {
        Ok(a) => SvmAttempt { id: intent.id, ..a },
        Err(stop) => return Err(Error::Unavailable(stop_reason(&stop))),
    };
    if let Some((code, why)) = still_allowed(state, solana, own.agent_id, &attempt.signed).await? {
        return Ok(declined(state, code, None, &why, Value::Array(vec![raw])));
    }
    let authorization = serde_json::to_value(&attempt.signed).map_err(|e| Error::Internal(e.into()))?;
    let header_value = attempt.header.1.to_str().map_err(|e| Error::Internal(e.into()))?;
    let exact = crate::payments::sealed::Exact { header_value: header_value.to_owned(), ..exact.clone() };
    let sealed = crate::relay::pay::reserve::seal(state, own.agent_id, intent.id, &exact)?;
    let now = now_unix();
    let resign = store::Resign {
        id: intent.id,
        agent_id: own.agent_id,
        credential: &own.credential,
        lease: own.lease,
        amount: Amount::from(terms.amount()),
        pay_to: &intent.pay_to,
        valid_after: to_i64(now),
        valid_before: to_i64(now.saturating_add(WINDOW_BOUND_SECS)),
        authorization: &authorization,
        sealed: &sealed,
    };
    faults::at(state.faults.as_ref(), Point::BeforeResign).await;
    let refusal = {
        let mut conn = crate::relay::error::conn(&state.pool).await?;
        crate::relay::pay::reserve::fenced(store::resign(&mut conn, &resign).await?)?
    };
    if let Some(refusal) = refusal {
        return refused(state, refusal, None, Value::Array(vec![raw]));
    }
    tracing::info!(agent_id = %own.agent_id, "signed an expired Solana payment again with the same nonce");
    exchange(state, own, call, rpc, &attempt, deadline).await
}

/// A re-sign that could not be made: the chain or the mint could not be read.
fn stop_reason(stop: &Stop) -> &'static str {
    if stop.metric == "rpc_unavailable" {
        "the Solana network cannot be read to sign an expired payment again; nothing was signed; retry later"
    } else {
        "an expired Solana payment of this call cannot be signed again; nothing was signed"
    }
}

/// Why a recorded Solana intent may no longer be sent: the agent disabled or gone, its network or
/// mint no longer configured, or its amount over the agent's current per-call cap.
async fn still_allowed(
    state: &AppState,
    solana: &Solana,
    agent_id: Uuid,
    signed: &SignedSvmTransfer,
) -> Result<Option<(Code, String)>, Error> {
    let spend = match crate::relay::pay::select::live_agent(state, agent_id).await? {
        Ok(spend) => spend,
        Err(why) => return Ok(Some(why)),
    };
    let configured = x402::svm::SvmNetwork::parse(&signed.network)
        .ok()
        .zip(signed.mint.parse().ok())
        .and_then(|(n, m)| solana.config.decimals(&n, &m));
    if !in_unit(state, solana, configured) {
        let why = format!("asset {} on {} is no longer configured for payments", signed.mint, signed.network);
        return Ok(Some((Code::PaymentUnsupported, why)));
    }
    let amount = Amount::parse(&signed.amount).map_err(|e| Error::invariant(e.to_string()))?;
    Ok(crate::relay::pay::select::over_cap(&spend, amount))
}
