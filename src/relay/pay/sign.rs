//! Signing a payment: the request's deterministic nonces, checked unused on every configured
//! token and Permit2 first (never pay a request twice, even if our own records were lost),
//! the context committed with the intent, and the signed header.

use alloy::primitives::B256;
use reqwest::header::HeaderName;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{Attempt, PayError, Stop, wrong_chain};
use crate::clock::now_unix;
use crate::codes::Code;
use crate::idempotency::Ownership;
use crate::relay::Error;
use crate::relay::request::RouteCall;
use crate::relay::view::PaymentView;
use crate::state::AppState;
use crate::x402::{self, PaymentRequired, Requirement, X402Version};

/// A new payment, signed and ready to be committed as the call's intent.
pub(super) struct Signing {
    pub attempt: Attempt,
    /// The nonce of the chosen method (EIP-3009, or Permit2's).
    pub nonce: B256,
    /// `{version, resource, extensions}`: what the payload was built from (resigning reuses it).
    pub context: Value,
    /// The upstream request exactly as sent, for recovery.
    pub sent: crate::payments::store::SentRequest,
    /// The 402's extensions as advertised, for recovery.
    pub advertised: Option<Vec<u8>>,
}

/// The request's deterministic nonces, and whether the chain shows either used on any
/// configured token or network (an earlier attempt may have chosen another asset or method).
pub(super) struct NonceCheck {
    eip3009: B256,
    permit2: alloy::primitives::U256,
    used: Result<Option<(x402::Network, alloy::primitives::Address)>, x402::ChainError>,
}

/// Asks every token the request's EIP-3009 nonce could have been used on, and every
/// network's Permit2 for its Permit2 nonce.
pub(super) async fn check_nonces(state: &AppState, own: &Ownership) -> NonceCheck {
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
pub(super) fn sign_new(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    (required, chosen): (&PaymentRequired, &Requirement),
    check: NonceCheck,
) -> Result<Result<Signing, Stop>, Error> {
    let nonce = if x402::permit2::scheme_of(chosen).is_some() { B256::from(check.permit2) } else { check.eip3009 };
    let payer = state.config.signer.address();
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
    let context = context_of(state, own, required)?;
    // Recovery needs the request exactly as sent and what the 402 advertised: both are
    // committed with the intent, before the payment leaves.
    let sent = crate::recovery::as_sent(&call.upstream).map_err(Error::invariant)?;
    let advertised = match required.extensions.as_ref() {
        Some(e) => Some(serde_json::to_vec(e).map_err(|e| Error::Internal(e.into()))?),
        None => None,
    };
    Ok(match sign(state, required.version, chosen, &context, nonce) {
        Ok(attempt) => Ok(Signing { attempt, nonce, context, sent, advertised }),
        Err(msg) => Err(Stop::new("sign_failed", Code::PaymentNotMade, msg.0)),
    })
}

/// The payload's context: the 402's version and resource, and the extensions echoed
/// (`payment-identifier` with our own id when the upstream advertises it).
pub(super) fn context_of(state: &AppState, own: &Ownership, required: &PaymentRequired) -> Result<Value, Error> {
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
        // A declared `bazaar` is echoed, as the x402 spec asks of payers, so that the facilitator
        // catalogues the resource (docs/DESIGN.md §11); other declarations need no echo.
        required.extensions.as_ref().and_then(|e| e.get("bazaar")).map(|b| json!({ "bazaar": b }))
    };
    if required.requires_payment_identifier()
        && extensions.as_ref().and_then(|e| e.pointer("/payment-identifier/info/id")).is_none()
    {
        return Err(Error::invariant("the upstream requires payment-identifier and no id would be sent"));
    }
    Ok(json!({ "version": required.version.number(), "resource": required.resource, "extensions": extensions }))
}

/// Signs `requirement` and builds the header of `version`.
pub(super) fn sign(
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
