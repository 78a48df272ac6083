//! Signing an EVM payment: the request's deterministic nonces, checked unused on every
//! configured token and Permit2 first (never pay a request twice, even if our own records
//! were lost), and the signed header (EIP-3009 or Permit2).

use alloy::primitives::B256;
use reqwest::header::HeaderName;
use serde_json::Value;
use uuid::Uuid;

use crate::clock::now_unix;
use crate::codes::Code;
use crate::relay::Error;
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{Attempt, Columns, Signing};
use crate::relay::pay::{PayError, Stop, to_i64, wrong_chain};
use crate::relay::view::PaymentView;

use super::sponsor::Sponsor;
use crate::state::AppState;
use crate::x402::{self, PaymentRequired, Requirement, SignedPayment, X402Version};

/// The request's deterministic nonces, and whether the chain shows either used on any
/// configured token or network (an earlier attempt may have chosen another asset or method).
pub(crate) struct NonceCheck {
    eip3009: B256,
    permit2: alloy::primitives::U256,
    used: Result<Option<(x402::Network, alloy::primitives::Address)>, x402::ChainError>,
}

impl NonceCheck {
    /// The nonce of `chosen`'s method (EIP-3009, or Permit2's).
    pub fn nonce_of(&self, chosen: &Requirement) -> B256 {
        if x402::permit2::scheme_of(chosen).is_some() { B256::from(self.permit2) } else { self.eip3009 }
    }
}

/// Asks every token the request's EIP-3009 nonce could have been used on, and every
/// network's Permit2 for its Permit2 nonce.
pub(super) async fn check_nonces(pc: &PaidCall<'_>) -> NonceCheck {
    let (state, own) = (pc.state, pc.own);
    let secret = &state.nonce_secret[..];
    let eip3009 = x402::deterministic_nonce(secret, own.agent_id, own.key.as_str(), &own.request_hash);
    let permit2 = x402::permit2_nonce(secret, own.agent_id, own.key.as_str(), &own.request_hash);
    let used = super::confirm::used_anywhere(state, state.config.signer.address(), eip3009, permit2).await;
    NonceCheck { eip3009, permit2, used }
}

/// Signs `chosen` with the request's nonce, when `check` shows neither of its nonces used.
///
/// # Errors
/// [`Error`] for a broken invariant or an RPC endpoint of another chain (nothing signed).
pub(super) async fn sign_new(
    pc: &PaidCall<'_>,
    (required, chosen): (&PaymentRequired, &Requirement),
    check: NonceCheck,
) -> Result<Result<Signing<SignedPayment>, Stop>, Error> {
    let nonce = check.nonce_of(chosen);
    let payer = pc.state.config.signer.address();
    match check.used {
        Ok(None) => {}
        Ok(Some(found)) => {
            let msg = "this request's payment under this Idempotency-Key was already settled on-chain; \
                       the router will not pay again";
            let mut stop = Stop::new("already_settled", Code::SettledResponseLost, msg);
            stop.payment = Some(PaymentView::found_on_chain(required.version, chosen.scheme(), found, payer, nonce));
            return Ok(Err(stop));
        }
        Err(x402::ChainError::ChainIdMismatch { .. }) => return Err(wrong_chain()),
        Err(e) => {
            let msg = format!("cannot read the payment network ({e}); nothing was signed or paid");
            return Ok(Err(Stop::new("rpc_unavailable", Code::PaymentNotMade, msg)));
        }
    }
    let sponsor = match super::sponsor::plan(pc.state, required.extensions.as_ref(), chosen).await? {
        Ok(sponsor) => sponsor,
        Err(stop) => return Ok(Err(stop)),
    };
    let context = pc.context_of(required)?;
    Ok(match sign(pc.state, required.version, chosen, &context, nonce, &sponsor) {
        Ok(attempt) => Ok(signing(pc, (required, chosen), &context, attempt)?),
        Err(msg) => Err(Stop::new("sign_failed", Code::PaymentNotMade, msg.0)),
    })
}

/// `attempt`, signed for `chosen` of `required` with `context`, with its intent's columns and
/// exact parts.
///
/// # Errors
/// [`Error`] when a part cannot be stored.
pub(super) fn signing(
    pc: &PaidCall<'_>,
    (required, chosen): (&PaymentRequired, &Requirement),
    context: &Value,
    attempt: Attempt<SignedPayment>,
) -> Result<Signing<SignedPayment>, Error> {
    let exact = pc.exact_of(required, (&chosen.raw_json(), context), &attempt.header.1)?;
    let s = &attempt.signed;
    let columns = Columns {
        scheme: chosen.scheme().to_owned(),
        network: chosen.network().caip2(),
        asset: chosen.asset().to_checksum(None),
        amount: chosen.amount(),
        pay_to: chosen.pay_to().to_checksum(None),
        payer: pc.state.config.signer.address().to_checksum(None),
        valid_after: to_i64(s.valid_after()),
        valid_before: to_i64(s.valid_before()),
    };
    Ok(Signing { attempt, columns, exact, lane: None })
}

/// Signs `requirement` with `nonce` and builds the header of `version`, with the Permit2
/// permit `sponsor` asks for in its extensions (deadline: the payment's own).
pub(super) fn sign(
    state: &AppState,
    version: X402Version,
    requirement: &Requirement,
    context: &Value,
    nonce: B256,
    sponsor: &Sponsor,
) -> Result<Attempt<SignedPayment>, PayError> {
    let max_auth = state.config.payments.max_auth_secs;
    let signed = x402::sign_payment(&state.config.signer, requirement, nonce, now_unix(), max_auth)
        .map_err(|e| format!("cannot sign the payment: {e}"))?;
    let resource = context.get("resource").filter(|v| !v.is_null());
    let extensions = context.get("extensions").filter(|v| !v.is_null());
    let extensions = sponsor.extensions(state, extensions, (signed.amount(), signed.valid_before()))?;
    let payload = x402::payload::payment_payload(version, requirement, resource, &signed, extensions.as_ref())
        .map_err(|e| format!("cannot build the payment: {e}"))?;
    let (name, value) =
        x402::wire::encode_payment_header(version, &payload).map_err(|e| format!("cannot encode the payment: {e}"))?;
    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("bad payment header name: {e}"))?;
    Ok(Attempt { id: Uuid::new_v4(), version, nonce: nonce.to_string(), signed, header: (name, value) })
}
