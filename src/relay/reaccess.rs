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
use serde_json::{Value, json};

use super::remaining;
use crate::payments::store::PaymentRow;
use crate::state::AppState;
use crate::upstream::UpstreamResponse;
use crate::x402::siwx::{self, Challenge};
use crate::x402::{Network, wire};

/// How a re-access ended, and what it tried (one JSON object per step, for the ledger).
pub struct Reaccess {
    pub answer: Option<UpstreamResponse>,
    pub log: Vec<Value>,
}

/// True when the payment's 402 advertised sign-in-with-x (the stored extensions).
fn advertised(row: &PaymentRow) -> bool {
    row.advertised_extensions
        .as_deref()
        .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        .is_some_and(|e| siwx::advertised(&e))
}

/// Tries to re-access the resource of `row` by signing in as its payer. Sends nothing unless
/// the stored request is a GET or HEAD and its 402 advertised sign-in-with-x.
pub async fn reaccess(state: &AppState, row: &PaymentRow, deadline: Instant) -> Reaccess {
    let mut log = Vec::new();
    if !advertised(row) {
        return Reaccess { answer: None, log };
    }
    let method = row.request_method.as_deref().unwrap_or_default();
    if method != "GET" && method != "HEAD" {
        log.push(json!({"action": "sign-in", "result": format!(
            "not tried: sign-in-with-x is advertised, but {method} may not be run again")}));
        return Reaccess { answer: None, log };
    }
    let request = match crate::recovery::stored_request(row)
        .and_then(|r| r.ok_or_else(|| crate::recovery::NotResendable::from("the request as sent was not recorded")))
    {
        Ok(r) => r,
        Err(why) => {
            log.push(json!({"action": "sign-in", "result": format!("not tried: {why}")}));
            return Reaccess { answer: None, log };
        }
    };
    let coordinates = Network::parse(&row.network)
        .map_err(|e| e.to_string())
        .and_then(|n| Ok((n, Address::from_str(&row.payer).map_err(|e| e.to_string())?)));
    let (network, payer) = match coordinates {
        Ok(c) => c,
        Err(why) => {
            log.push(json!({"action": "sign-in", "result": format!("not tried: {why}")}));
            return Reaccess { answer: None, log };
        }
    };
    if payer != state.config.signer.address() {
        log.push(json!({"action": "sign-in", "result": "not tried: the payment was made by another wallet"}));
        return Reaccess { answer: None, log };
    }

    // 1. A fresh challenge: the stored request, unpaid.
    let left = remaining(deadline);
    if left.is_zero() {
        log.push(json!({"action": "challenge", "result": "not tried: route deadline"}));
        return Reaccess { answer: None, log };
    }
    let at = chrono::Utc::now().to_rfc3339();
    let first = match state.upstream.send(&request, &[], left.min(state.upstream.timeout())).await {
        Ok(r) => r,
        Err(e) => {
            log.push(json!({"action": "challenge", "at": at, "error": e.to_string()}));
            return Reaccess { answer: None, log };
        }
    };
    let mut entry = json!({"action": "challenge", "at": at, "status": first.status});
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
            entry["result"] = json!(why);
            log.push(entry);
            return Reaccess { answer: None, log };
        }
    };
    let header = siwx::sign_in(&state.config.signer, &challenge)
        .map_err(|e| e.to_string())
        .and_then(|v| HeaderValue::from_str(&v).map_err(|e| e.to_string()));
    let header =
        header.and_then(|v| Ok((HeaderName::from_bytes(siwx::HEADER.as_bytes()).map_err(|e| e.to_string())?, v)));
    let header = match header {
        Ok(h) => h,
        Err(why) => {
            entry["result"] = json!(format!("not signed: {why}"));
            log.push(entry);
            return Reaccess { answer: None, log };
        }
    };
    entry["result"] = json!("signed in");
    entry["nonce"] = json!(challenge.nonce());
    log.push(entry);

    // 2. The stored request again, signed in, without any payment.
    let left = remaining(deadline);
    if left.is_zero() {
        log.push(json!({"action": "sign-in", "result": "not sent: route deadline"}));
        return Reaccess { answer: None, log };
    }
    let at = chrono::Utc::now().to_rfc3339();
    match state.upstream.send(&request, std::slice::from_ref(&header), left.min(state.upstream.timeout())).await {
        Ok(resp) if resp.status == 200 => {
            log.push(json!({"action": "sign-in", "at": at, "status": 200, "result": "reaccessed"}));
            Reaccess { answer: Some(resp), log }
        }
        Ok(resp) => {
            log.push(json!({"action": "sign-in", "at": at, "status": resp.status,
                "result": "refused: the upstream did not accept the sign-in"}));
            Reaccess { answer: None, log }
        }
        Err(e) => {
            log.push(json!({"action": "sign-in", "at": at, "error": e.to_string()}));
            Reaccess { answer: None, log }
        }
    }
}
