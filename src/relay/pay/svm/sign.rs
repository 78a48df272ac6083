//! Choosing and signing a Solana payment: the cheapest option the router and the agent's
//! limits allow, signed by the payer only (the upstream's fee payer pays the fees), over the
//! mint's program and decimals and a fresh blockhash read from the chain.

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;
use uuid::Uuid;

use crate::chains::solana::Solana;
use crate::codes::Code;
use crate::money::Amount;
use crate::payments::limits;
use crate::payments::store::Spend;
use crate::relay::Error;
use crate::relay::pay::agent::refuse_disabled;
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{Attempt, cheapest_allowed};
use crate::relay::pay::{Declined, PayError, Stop, wrong_chain};
use crate::x402::svm::{ComputeBudget, SignedSvmTransfer, SvmRpc, SvmRpcError, SvmTerms};
use crate::x402::{self, PaymentRequired};

/// The 402's Solana options: its entries that read as SVM `exact` terms, with the entry as sent.
pub(super) fn offered(required: &PaymentRequired) -> Vec<(SvmTerms, &Value)> {
    required.raw_accepts.iter().filter_map(|e| Some((SvmTerms::from_json(required.version, e).ok()?, e))).collect()
}

/// The cheapest Solana option the router and the agent's limits allow, or why none.
///
/// # Errors
/// [`Error`] when the agent's limits cannot be read.
pub(super) async fn choose(
    pc: &PaidCall<'_>,
    solana: &Solana,
    required: &PaymentRequired,
) -> Result<Result<(SvmTerms, Value), Declined>, Error> {
    let spend = pc.spend().await?;
    refuse_disabled(spend.as_ref())?;
    let limit = match spend.as_ref().map(Spend::limits) {
        None => None,
        Some(Ok(limits)) => limits.headroom(),
        Some(Err(_)) => return Ok(Err((Code::PaymentOverBudget, "the agent's limits cannot be read".into()))),
    };
    let options = offered(required);
    Ok(cheapest_allowed(&options, "Solana", SvmTerms::amount, |t| refusal(pc, solana, t, spend.as_ref(), limit)))
}

/// Why one Solana option may not be paid, with how far it got, if it may not.
fn refusal(
    pc: &PaidCall<'_>,
    solana: &Solana,
    terms: &SvmTerms,
    spend: Option<&Spend>,
    limit: Option<Amount>,
) -> Option<(u8, Code, String)> {
    let amount = Amount::from(terms.amount());
    let (network, mint) = (terms.network(), terms.mint());
    let decimals = solana.config.decimals(network, &mint);
    if decimals.is_none() {
        Some((0, Code::PaymentUnsupported, format!("{mint} on {network} is not configured for payments")))
    } else if !in_unit(pc, solana, decimals) {
        Some((0, Code::PaymentUnsupported, format!("{mint} on {network} is not in the router's unit")))
    } else if terms.fee_payer() == solana.config.signer.address() {
        Some((0, Code::PaymentUnsupported, "its feePayer is the router's own wallet (it would pay the fees)".into()))
    } else if amount.is_zero() {
        Some((0, Code::PaymentUnsupported, "its amount is zero".into()))
    } else if let Some(why) = spend.and_then(|s| limits::pay_to_refusal(s, &terms.pay_to().to_string())) {
        Some((1, Code::PaymentNotAllowed, why))
    } else if amount > pc.call.max_amount {
        Some((3, Code::PaymentOverMaxAmount, format!("its amount {amount} exceeds max_amount {}", pc.call.max_amount)))
    } else {
        limit.filter(|l| amount > *l).map(|limit| {
            (2, Code::PaymentOverBudget, format!("its amount {amount} exceeds the agent's limits ({limit} left)"))
        })
    }
}

/// True when a mint of `decimals` is in the router's unit (that of its EVM assets too, once
/// they are known: caps and budgets are atomic units of one unit).
pub(super) fn in_unit(pc: &PaidCall<'_>, solana: &Solana, decimals: Option<u8>) -> bool {
    let unit = solana.config.unit;
    decimals == Some(unit) && pc.state.supported.unit().is_none_or(|u| u == unit)
}

/// Reads the mint and a fresh blockhash from the chain and signs the transfer of `terms` (the
/// upstream's fee payer pays the fees; the router's wallet signs as the token owner only).
///
/// # Errors
/// [`Error::PaymentNetworkUnavailable`] for an endpoint serving another chain (nothing signed).
pub(super) async fn sign(
    solana: &Solana,
    rpc: &SvmRpc,
    terms: &SvmTerms,
    context: &Value,
    nonce: String,
) -> Result<Result<Attempt<SignedSvmTransfer>, Stop>, Error> {
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
        Ok(header) => Ok(Attempt { id: Uuid::new_v4(), version: terms.version(), nonce, signed, header }),
        Err(msg) => Err(Stop::new("sign_failed", Code::PaymentNotMade, msg.0)),
    })
}

/// The payment header of `signed`.
fn header(
    terms: &SvmTerms,
    context: &Value,
    signed: &SignedSvmTransfer,
) -> Result<(HeaderName, HeaderValue), PayError> {
    let resource = context.get("resource").filter(|v| !v.is_null());
    let extensions = context.get("extensions").filter(|v| !v.is_null());
    let payload = x402::svm::payment_payload(terms, resource, &signed.transaction, extensions);
    let (name, value) = x402::wire::encode_payment_header(terms.version(), &payload)
        .map_err(|e| format!("cannot encode the payment: {e}"))?;
    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("bad payment header name: {e}"))?;
    Ok((name, value))
}
