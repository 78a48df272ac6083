//! Gas sponsoring for Permit2 (`eip2612GasSponsoring`): when an upstream's 402 offers it for
//! an `exact` Permit2 requirement and the wallet's Permit2 allowance for the token is below
//! the price, the router signs the token's EIP-2612 `permit` for Permit2 and sends it in the
//! payment's extensions; the facilitator submits it (and pays its gas) with the transfer.
//!
//! The permit is part of the payment's intent:
//! - It travels in the payment header, which the ledger seals and commits before the payment
//!   leaves; a retry or a takeover resends that header verbatim — the same permit, never a
//!   second one at the same token nonce while the first can still be used.
//! - Its deadline is the Permit2 authorization's (`now + min(maxTimeoutSeconds,
//!   X402_MAX_AUTH_SECS)`), so the two die together: a payment signed again after its
//!   `validBefore` passed unused (`sign_again`) reads the chain afresh and signs a new permit
//!   only when the old one can no longer be submitted.
//! - It is counted by nothing but the transfer it enables: its value is the price, it moves
//!   nothing by itself (Permit2 still needs the payment's own signature, once per nonce), and it
//!   is no budget charge of its own.
//! - The upstream decides nothing in it: an offer naming another spender, chain, token, owner,
//!   amount or a later deadline is refused before anything is signed, and the token's own
//!   `DOMAIN_SEPARATOR()` must equal the domain the requirement names.

use alloy::primitives::U256;
use reqwest::header::HeaderValue;
use serde_json::Value;

use crate::clock::now_unix;
use crate::codes::Code;
use crate::relay::Error;
use crate::relay::pay::{PayError, Stop, wrong_chain};
use crate::state::AppState;
use crate::x402::gas_sponsoring::{self, EIP2612_GAS_SPONSORING, SignedEip2612Permit, TokenDomain};
use crate::x402::permit2::{Permit2Scheme, scheme_of};
use crate::x402::{self, Requirement};

/// What a new signature of a payment carries beside the transfer.
#[derive(Debug)]
pub(super) enum Sponsor {
    /// No permit (no offer, an allowance that suffices, a token without EIP-2612).
    No,
    /// Sign a permit with the token's `nonce` under `domain`; `declared` is the offer's own
    /// `info` (its members are echoed, as the official server checks, ours added).
    Sign { domain: TokenDomain, nonce: U256, declared: serde_json::Map<String, Value> },
    /// Send this permit again (the `info` of an earlier attempt of the same payment, verbatim).
    Reuse(Value),
}

impl Sponsor {
    /// `context`'s extensions with the permit merged in, the permit signed (for
    /// [`Sponsor::Sign`]) with `deadline` — the payment's own.
    ///
    /// # Errors
    /// The signer's error.
    pub(super) fn extensions(
        &self,
        state: &AppState,
        context_extensions: Option<&Value>,
        (amount, deadline): (U256, u64),
    ) -> Result<Option<Value>, PayError> {
        let info = match self {
            Self::No => return Ok(context_extensions.cloned()),
            Self::Sign { domain, nonce, declared } => {
                let signed =
                    gas_sponsoring::sign_eip2612_permit(&state.config.signer, domain, amount, *nonce, deadline)
                        .map_err(|e| format!("cannot sign the Permit2 permit: {e}"))?;
                let Value::Object(ours) =
                    serde_json::to_value(&signed).map_err(|e| format!("cannot encode the Permit2 permit: {e}"))?
                else {
                    return Err("the Permit2 permit did not encode to an object".into());
                };
                let mut info = declared.clone();
                info.extend(ours);
                Value::Object(info)
            }
            Self::Reuse(info) => info.clone(),
        };
        let mut merged = match context_extensions {
            Some(Value::Object(map)) => map.clone(),
            _ => serde_json::Map::new(),
        };
        merged.insert(EIP2612_GAS_SPONSORING.to_owned(), serde_json::json!({ "info": info }));
        Ok(Some(Value::Object(merged)))
    }
}

/// The permit an earlier attempt sent (its payment header's `extensions`), if any: read, and
/// its `info` as sent.
pub(super) fn recorded(header: &HeaderValue) -> Option<(SignedEip2612Permit, Value)> {
    let sent = x402::wire::decode_payment_header(header).ok()?;
    let info = sent.pointer(&format!("/extensions/{EIP2612_GAS_SPONSORING}/info"))?.clone();
    Some((serde_json::from_value(info.clone()).ok()?, info))
}

/// For a new signature of `chosen`: whether the 402's `advertised` extensions offer gas
/// sponsoring that this payment needs, read on the chain (the wallet's Permit2 allowance, the
/// token's EIP-2612 nonce and domain).
///
/// # Errors
/// `Ok(Err(stop))` for an offer the router refuses or a chain it cannot read (nothing signed);
/// [`Error`] for an RPC endpoint of another chain.
pub(super) async fn plan(
    state: &AppState,
    advertised: Option<&Value>,
    chosen: &Requirement,
) -> Result<Result<Sponsor, Stop>, Error> {
    if scheme_of(chosen) != Some(Permit2Scheme::Exact) {
        return Ok(Ok(Sponsor::No));
    }
    let Some(offer) = advertised.and_then(|e| e.get(EIP2612_GAS_SPONSORING)) else {
        return Ok(Ok(Sponsor::No));
    };
    let owner = state.config.signer.address();
    let (network, asset, amount) = (chosen.network(), chosen.asset(), chosen.amount().as_u256());
    let timeout = chosen.max_timeout_seconds().min(state.config.payments.max_auth_secs);
    let terms = gas_sponsoring::Terms { owner, asset, network, amount, deadline: now_unix().saturating_add(timeout) };
    if let Err(e) = gas_sponsoring::check_offer(offer, &terms) {
        let msg = format!("the upstream's {EIP2612_GAS_SPONSORING} offer is refused ({e}); nothing was signed or paid");
        return Ok(Err(Stop::new("gas_sponsoring_refused", Code::PaymentNotMade, msg)));
    }
    let unreadable = |e: x402::ChainError| -> Result<Result<Sponsor, Stop>, Error> {
        if matches!(e, x402::ChainError::ChainIdMismatch { .. }) {
            return Err(wrong_chain());
        }
        let msg = format!("cannot read the payment network ({e}); nothing was signed or paid");
        Ok(Err(Stop::new("rpc_unavailable", Code::PaymentNotMade, msg)))
    };
    match state.chain.permit2_allowance(network, asset, owner).await {
        Ok(allowance) if allowance >= amount => return Ok(Ok(Sponsor::No)),
        Ok(_) => {}
        Err(e) => return unreadable(e),
    }
    let (Some(name), Some(version)) = (chosen.extra_name(), chosen.extra_version()) else {
        // No domain to sign under: paid without a permit, the facilitator's 412 names the
        // operator's command.
        return Ok(Ok(Sponsor::No));
    };
    let domain = TokenDomain { name: name.to_owned(), version: version.to_owned(), network, asset };
    match state.chain.eip2612_state(network, asset, owner).await {
        Ok(None) => Ok(Ok(Sponsor::No)),
        Ok(Some((nonce, separator))) if separator == gas_sponsoring::domain_separator(&domain) => {
            let declared = offer.get("info").and_then(Value::as_object).cloned().unwrap_or_default();
            Ok(Ok(Sponsor::Sign { domain, nonce, declared }))
        }
        Ok(Some(_)) => {
            let msg = format!(
                "the upstream's {EIP2612_GAS_SPONSORING} offer is refused: the EIP-712 domain its requirement names \
                 (extra.name, extra.version, {network}) is not the token's own; nothing was signed or paid"
            );
            Ok(Err(Stop::new("gas_sponsoring_refused", Code::PaymentNotMade, msg)))
        }
        Err(e) => unreadable(e),
    }
}
