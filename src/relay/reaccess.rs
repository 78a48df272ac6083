//! Re-access after a lost answer (issue 16): when recovery (`crate::recovery`, which cannot
//! sign) got nothing back for a payment the chain shows used, and the upstream's 402
//! advertised `sign-in-with-x`, sign in as the payer and send the stored request again
//! without any payment. The upstream runs its handler again: a **new execution**, recorded
//! as `reaccessed`, never as the lost answer.
//!
//! Only for `GET` and `HEAD` (running the request again must be safe), and bounded: one
//! unpaid request for a fresh challenge (the one stored with the intent is usually stale by a
//! takeover: the official server accepts a challenge for 5 minutes), one signed request, both
//! within the route deadline. The challenge is validated strictly by `x402::siwx` (origin,
//! chain of the payment, payer, freshness, sizes); refused ⇒ nothing signed, nothing sent.
//! Never a payment: no payment header is sent, and `x402::siwx::sign_in` signs only sign-in
//! messages.

use std::str::FromStr;
use std::time::Instant;

use alloy::primitives::Address;
use reqwest::StatusCode;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;

use super::remaining;
use crate::idempotency::Ownership;
use crate::payments::sealed::Opened;
use crate::payments::store::PaymentRow;
use crate::payments::{Exchange, RecoveryStep};
use crate::state::AppState;
use crate::upstream::{UpstreamRequest, UpstreamResponse};
use crate::x402::siwx::{self, Challenge};
use crate::x402::{Network, wire};

/// How a re-access ended, and what it tried (one JSON object per step, for the ledger).
pub struct Reaccess {
    pub answer: Option<UpstreamResponse>,
    pub log: Vec<RecoveryStep>,
}

/// True when the payment's 402 advertised sign-in-with-x (the stored extensions).
fn advertised(row: &PaymentRow) -> bool {
    row.advertised_extensions
        .as_deref()
        .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        .is_some_and(|e| siwx::advertised(&e))
}

/// Tries to re-access the resource of `row` (its sealed parts `opened`) by signing in as its
/// payer. Sends nothing unless the stored request is a GET or HEAD and its 402 advertised
/// sign-in-with-x, and signs nothing unless [`super::may_leave`] allows it (the owner's
/// lease, no pause, the agent enabled). What the upstream says in refusing is logged with its
/// URLs redacted (a challenge quoting the resource URL echoes the agent's query).
///
/// # Errors
/// [`super::Error::Superseded`] or [`super::Error::Refused`] from that check (nothing signed
/// or sent); database errors.
pub async fn reaccess(
    state: &AppState,
    own: &Ownership,
    (row, opened): (&PaymentRow, &Opened),
    deadline: Instant,
) -> Result<Reaccess, super::Error> {
    let mut tried = reaccess_unredacted(state, own, (row, opened), deadline).await?;
    let redaction = &state.config.secrets.redaction;
    for step in &mut tried.log {
        if let RecoveryStep::Challenge(e) | RecoveryStep::SignIn(e) = step {
            e.result = e.result.as_deref().map(|r| redaction.text(r).into_owned());
            e.error = e.error.as_deref().map(|r| redaction.text(r).into_owned());
        }
    }
    Ok(tried)
}

async fn reaccess_unredacted(
    state: &AppState,
    own: &Ownership,
    (row, opened): (&PaymentRow, &Opened),
    deadline: Instant,
) -> Result<Reaccess, super::Error> {
    if !advertised(row) {
        return Ok(Reaccess { answer: None, log: Vec::new() });
    }
    let (request, network, payer) = match eligible(state, row, opened) {
        Ok(r) => r,
        Err(why) => {
            let log = vec![RecoveryStep::SignIn(Exchange::result(format!("not tried: {why}")))];
            return Ok(Reaccess { answer: None, log });
        }
    };
    // 1. A fresh challenge: the stored request, unpaid.
    let (step, challenge) = challenge(state, &request, (network, payer), deadline).await;
    let mut log = vec![step];
    let Some(challenge) = challenge else {
        return Ok(Reaccess { answer: None, log });
    };
    // 2. The stored request again, signed in, without any payment: signed only if nothing
    // stops it now.
    let left = remaining(deadline);
    if left.is_zero() {
        log.push(RecoveryStep::SignIn(Exchange::result("not sent: route deadline")));
        return Ok(Reaccess { answer: None, log });
    }
    super::may_leave(state, own).await?;
    let header = match sign_in(state, &challenge) {
        Ok(header) => header,
        Err(why) => {
            log.push(RecoveryStep::SignIn(Exchange::result(format!("not signed: {why}"))));
            return Ok(Reaccess { answer: None, log });
        }
    };
    let at = chrono::Utc::now().to_rfc3339();
    match state.upstream.send(&request, std::slice::from_ref(&header), left.min(state.upstream.timeout())).await {
        Ok(resp) if resp.status == 200 => {
            log.push(RecoveryStep::SignIn(Exchange {
                status: Some(200),
                result: Some("reaccessed".into()),
                ..Exchange::at(&at)
            }));
            Ok(Reaccess { answer: Some(resp), log })
        }
        Ok(resp) => {
            log.push(RecoveryStep::SignIn(Exchange {
                status: Some(resp.status),
                result: Some("refused: the upstream did not accept the sign-in".into()),
                ..Exchange::at(&at)
            }));
            Ok(Reaccess { answer: None, log })
        }
        Err(e) => {
            log.push(RecoveryStep::SignIn(Exchange { error: Some(e.to_string()), ..Exchange::at(&at) }));
            Ok(Reaccess { answer: None, log })
        }
    }
}

/// Why a sign-in is not tried for `row`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NotTried(String);

/// The stored request, the payment's network and payer, when a sign-in may be tried: a
/// GET or HEAD, recorded as sent, paid by this router's wallet.
fn eligible(
    state: &AppState,
    row: &PaymentRow,
    opened: &Opened,
) -> Result<(UpstreamRequest, Network, Address), NotTried> {
    let method = row.request_method.as_deref().unwrap_or_default();
    if method != "GET" && method != "HEAD" {
        return Err(NotTried(format!("sign-in-with-x is advertised, but {method} may not be run again")));
    }
    let request = crate::recovery::stored_request(opened).map_err(|why| NotTried(why.to_string()))?;
    let network = Network::parse(&row.network).map_err(|e| NotTried(e.to_string()))?;
    let payer = Address::from_str(&row.payer).map_err(|e| NotTried(e.to_string()))?;
    if payer != state.config.signer.address() {
        return Err(NotTried("the payment was made by another wallet".into()));
    }
    Ok((request, network, payer))
}

/// Asks for a fresh challenge (the stored request, unpaid) and validates it: the step for the
/// log, and the challenge when it may be signed.
async fn challenge(
    state: &AppState,
    request: &UpstreamRequest,
    (network, payer): (Network, Address),
    deadline: Instant,
) -> (RecoveryStep, Option<Challenge>) {
    let left = remaining(deadline);
    if left.is_zero() {
        return (RecoveryStep::Challenge(Exchange::result("not tried: route deadline")), None);
    }
    let at = chrono::Utc::now().to_rfc3339();
    let first = match state.upstream.send(request, &[], left.min(state.upstream.timeout())).await {
        Ok(r) => r,
        Err(e) => return (RecoveryStep::Challenge(Exchange { error: Some(e.to_string()), ..Exchange::at(&at) }), None),
    };
    let mut entry = Exchange { status: Some(first.status), ..Exchange::at(&at) };
    let extensions = if first.status == 402 {
        wire::parse_payment_required(StatusCode::PAYMENT_REQUIRED, &first.headers, &first.body)
            .map_err(|e| format!("refused: the 402 could not be read: {e}"))
            .and_then(|r| r.extensions.ok_or_else(|| "refused: the 402 advertises no extensions".to_owned()))
    } else {
        Err("refused: the upstream did not answer 402 with a challenge".to_owned())
    };
    let challenge = extensions.and_then(|e| {
        Challenge::from_extensions(&e, &request.url, network, payer, chrono::Utc::now())
            .map_err(|e| format!("refused: {e}"))
    });
    let challenge = match challenge {
        Ok(c) => c,
        Err(why) => {
            entry.result = Some(why);
            return (RecoveryStep::Challenge(entry), None);
        }
    };
    entry.result = Some("challenge accepted".into());
    entry.nonce = Some(challenge.nonce().to_string());
    (RecoveryStep::Challenge(entry), Some(challenge))
}

/// The sign-in header for `challenge`, signed by the router's wallet (EIP-4361, never a
/// payment).
fn sign_in(state: &AppState, challenge: &Challenge) -> Result<(HeaderName, HeaderValue), NotTried> {
    let not = |e: &dyn std::fmt::Display| NotTried(e.to_string());
    let value = siwx::sign_in(&state.config.signer, challenge).map_err(|e| not(&e))?;
    let value = HeaderValue::from_str(&value).map_err(|e| not(&e))?;
    let name = HeaderName::from_bytes(siwx::HEADER.as_bytes()).map_err(|e| not(&e))?;
    Ok((name, value))
}
