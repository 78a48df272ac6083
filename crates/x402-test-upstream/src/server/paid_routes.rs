//! The steps of a paid route: 402, decode, match the offer, verify, then its behaviour.

use std::str::FromStr;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use alloy::primitives::{Address, B256, keccak256};
use serde_json::{Value, json};

use crate::payment::{Offer, Refusal, SignedAuthorization};
use crate::wire::{self, PaymentPayloadV1, PaymentPayloadV2};

use super::hoard::{hoard_or_free, keep};
use super::*;

/// What the paid part of a request came to, before it is put in a wire format.
pub(super) enum Outcome {
    Answer {
        status: StatusCode,
        body: Value,
        settlement: Option<Settled>,
    },
    Refused(Refusal),
    Drop,
    /// 402 carrying a settlement header `settlement_pending` (no answer).
    Pending(Settled),
    /// 412 with this reason as the requirements' `error`.
    Precondition(&'static str),
    /// 200 with the report and a settlement header `settlement_pending`.
    AnsweredPending(Settled, Value),
}

pub(super) struct Settled {
    pub(super) transaction: B256,
    pub(super) payer: Address,
}

/// Every route of [`ROUTES`].
pub(super) async fn paid(req: HttpRequest, body: Bytes, state: web::Data<AppState>) -> HttpResponse {
    let Some(spec) = ROUTES.iter().find(|r| r.path == req.path()) else {
        return not_found().await;
    };
    state.stats.update(spec.path, |s| s.requests += 1);
    let query = Query::parse(&state.query_of(&req));
    let seconds = match spec.behaviour {
        Behaviour::Stall | Behaviour::SlowSettle => match query.seconds() {
            Ok(seconds) => seconds,
            Err(message) => return bad_request(&message),
        },
        Behaviour::PaymentIdentifier | Behaviour::Siwx | Behaviour::PidSiwx => match query.seconds_or(0) {
            Ok(seconds) => seconds,
            Err(message) => return bad_request(&message),
        },
        _ => 0,
    };
    let url = resource_url(&req);
    match spec.version {
        Version::V2 => paid_v2(&req, spec, &state, &body, &url, seconds, &query).await,
        Version::V1 => paid_v1(&req, spec, &state, &body, &url, seconds).await,
    }
}

pub(super) async fn paid_v2(
    req: &HttpRequest,
    spec: &'static RouteSpec,
    state: &AppState,
    body: &Bytes,
    url: &str,
    seconds: u64,
    query: &Query,
) -> HttpResponse {
    let offers = state.offers(spec.behaviour, query.price());
    let (scheme, host) = {
        let info = req.connection_info();
        (info.scheme().to_owned(), info.host().to_owned())
    };
    let required = |error: &str| wire::PaymentRequiredV2 {
        x402_version: 2,
        error: error.to_owned(),
        resource: wire::ResourceInfo {
            url: url.to_owned(),
            description: spec.description.to_owned(),
            mime_type: "application/json".into(),
        },
        accepts: offers.iter().map(|o| state.requirement_v2(o, query.max_timeout())).collect(),
        extensions: extensions_of(spec, state, &scheme, &host, req.query_string()),
    };

    // A signed-in payer of a sign-in-with-x route re-accesses it without paying.
    if spec.behaviour.siwx()
        && let Some(header) = req.headers().get("sign-in-with-x")
    {
        return siwx_reaccess(spec, state, header.as_bytes(), &scheme, &host, req.query_string(), &required);
    }

    // Like the official v2 server: no header, or one that does not decode, is no payment.
    let payload =
        req.headers().get(wire::PAYMENT_SIGNATURE).and_then(|h| wire::decode_header::<PaymentPayloadV2>(h.as_bytes()));
    if let Some(answer) = hoard_or_free(state, spec, query, payload.as_ref()).await {
        return answer;
    }
    let Some(payload) = payload else {
        if let Err(message) = hold(query).await {
            return bad_request(&message);
        }
        let answer = payment_required_v2(&required("Payment required"), json!({}));
        if spec.behaviour == Behaviour::Reprice {
            state.reprices.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        return answer;
    };
    let payment_id = payload.payment_identifier();
    state.stats.update(spec.path, |s| {
        s.payment_attempts += 1;
        if payment_id.is_some() {
            s.last_payment_identifier = payment_id.clone();
        }
    });
    let payer = Address::from_str(&payload.payload.authorization.from).ok();

    // The payment-identifier cache answers before anything is verified.
    let cached_id = payment_id.filter(|_| spec.behaviour.payment_identifier());
    if let Some(answer) =
        cached_id.as_deref().and_then(|id| cached_answer(state, spec.path, req, body, id, query.conflict()))
    {
        return answer;
    }
    let answer = paid_v2_handle(spec, state, body, seconds, query, &required, &offers, payload, payer).await;
    if let Some(id) = &cached_id {
        match &answer {
            V2Answer::Answered(stored) => {
                state.pid_cache.finish(id, stored.clone());
                state.stats.update(spec.path, |s| s.pid_completed += 1);
            }
            V2Answer::Other(_) => state.pid_cache.forget(id),
        }
    }
    match answer {
        V2Answer::Answered(stored) => stored.response(),
        V2Answer::Other(r) => r,
    }
}

/// `?hold=N`: waits N seconds before a `402` is answered.
async fn hold(query: &Query) -> Result<(), String> {
    let seconds = query.hold()?;
    if seconds > 0 {
        tokio::time::sleep(Duration::from_secs(seconds)).await;
    }
    Ok(())
}

/// A sign-in of a payer of a sign-in-with-x route: the answer again without paying, or a 402.
fn siwx_reaccess(
    spec: &'static RouteSpec,
    state: &AppState,
    header: &[u8],
    scheme: &str,
    host: &str,
    query: &str,
    required: &impl Fn(&str) -> wire::PaymentRequiredV2,
) -> HttpResponse {
    state.stats.update(spec.path, |s| s.siwx_sign_ins += 1);
    let verdict = if siwx::refuses(query) {
        Err("this route refuses every sign-in (?siwx=refuse)".to_owned())
    } else {
        state.siwx.verify(header, host, scheme, spec.path, &state.settings.network)
    };
    match verdict {
        Ok(address) => {
            let answer_id = uuid::Uuid::new_v4().to_string();
            tracing::info!(route = spec.path, %address, answer_id, "re-accessed by a signed-in payer");
            state.stats.update(spec.path, |s| {
                s.siwx_reaccess += 1;
                s.last_answer_id = Some(answer_id.clone());
            });
            HttpResponse::Ok().json(json!({ "reaccessed": true, "answer_id": answer_id, "report": weather(spec) }))
        }
        Err(why) => {
            tracing::info!(route = spec.path, why, "sign-in refused");
            state.stats.update(spec.path, |s| s.siwx_refused += 1);
            payment_required_v2(&required("sign-in refused"), json!({}))
        }
    }
}

/// The `extensions` a v2 route advertises (a fresh sign-in-with-x challenge with every 402).
fn extensions_of(spec: &RouteSpec, state: &AppState, scheme: &str, host: &str, query: &str) -> Option<Value> {
    let mut ext = serde_json::Map::new();
    if spec.behaviour.payment_identifier()
        && let Value::Object(pid) = wire::payment_identifier_declaration()
    {
        ext.extend(pid);
    }
    if spec.behaviour.siwx() {
        let variant = siwx::Variant::of(query);
        let decl = state.siwx.declaration(host, scheme, spec.path, &state.settings.network, variant);
        if let Value::Object(decl) = decl {
            ext.extend(decl);
        }
    }
    if url::form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "bazaar" && v == "1") {
        ext.insert("bazaar".into(), super::respond::bazaar_declaration(spec));
    }
    (!ext.is_empty()).then_some(Value::Object(ext))
}

/// A v2 paid request's answer: an answer of the route (cacheable), or a refusal or drop.
enum V2Answer {
    Answered(pid_cache::StoredAnswer),
    Other(HttpResponse),
}

#[expect(clippy::too_many_arguments, reason = "the steps of one request, split for the cache")]
async fn paid_v2_handle(
    spec: &'static RouteSpec,
    state: &AppState,
    body: &Bytes,
    seconds: u64,
    query: &Query,
    required: &dyn Fn(&str) -> wire::PaymentRequiredV2,
    offers: &[Offer],
    payload: PaymentPayloadV2,
    payer: Option<Address>,
) -> V2Answer {
    if matches!(spec.behaviour, Behaviour::Reject | Behaviour::RejectHostile) {
        let reason = if spec.behaviour == Behaviour::Reject { query.reason() } else { HOSTILE_REASON.to_owned() };
        let refusal = Refusal::Forced { reason, message: "this route refuses every payment".into() };
        let body = serde_json::to_value(wire::VerifyRefusal {
            is_valid: false,
            invalid_reason: refusal.reason().to_owned(),
            invalid_message: refusal.to_string(),
            payer: payer.map(|p| p.to_checksum(None)),
        })
        .unwrap_or_else(|_| json!({}));
        note_refusal(state, spec, &refusal);
        return V2Answer::Other(payment_required_v2(&required(refusal.reason()), body));
    }

    let prepared = if payload.x402_version != 2 {
        Err(Refusal::InvalidVersion(payload.x402_version))
    } else {
        match_offer_v2(offers, &payload.accepted)
            .and_then(|offer| SignedAuthorization::parse(&payload.payload).map(|auth| (offer.clone(), auth)))
    };
    let outcome = match prepared {
        Ok((offer, auth)) => execute(spec, state, &offer, auth, body, seconds).await,
        Err(refusal) => Outcome::Refused(refusal),
    };

    match outcome {
        Outcome::Refused(refusal) => {
            note_refusal(state, spec, &refusal);
            V2Answer::Other(payment_required_v2(&required(refusal.reason()), json!({})))
        }
        Outcome::Drop => V2Answer::Other(dropped_connection()),
        Outcome::Pending(settled) => V2Answer::Other(super::pending_routes::pending_v2(state, &settled)),
        Outcome::Precondition(reason) => V2Answer::Other(super::pending_routes::precondition_v2(&required(reason))),
        Outcome::AnsweredPending(settled, body) => {
            V2Answer::Other(super::pending_routes::answered_pending_v2(state, &settled, &body))
        }
        Outcome::Answer { status, body, settlement } => {
            let settlement = match settlement {
                None => None,
                Some(settled) => match wire::encode_header(&wire::SettlementV2 {
                    success: true,
                    payer: settled.payer.to_checksum(None),
                    transaction: format!("{:#x}", settled.transaction),
                    network: state.settings.network.clone(),
                }) {
                    Ok(header) => Some(header),
                    Err(err) => return V2Answer::Other(internal_error(&err)),
                },
            };
            let body = match serde_json::to_vec(&body) {
                Ok(b) => b,
                Err(err) => return V2Answer::Other(internal_error(&err)),
            };
            V2Answer::Answered(pid_cache::StoredAnswer { status, body, settlement })
        }
    }
}

pub(super) async fn paid_v1(
    req: &HttpRequest,
    spec: &'static RouteSpec,
    state: &AppState,
    body: &Bytes,
    url: &str,
    seconds: u64,
) -> HttpResponse {
    let offers = state.offers(spec.behaviour, Query::parse(&state.query_of(req)).price());
    let required = |error: &str, payer: Option<Address>| wire::PaymentRequiredV1 {
        x402_version: 1,
        error: error.to_owned(),
        accepts: offers.iter().map(|o| state.requirement_v1(o, spec, url)).collect(),
        payer: payer.map(|p| p.to_checksum(None)),
    };

    let Some(header) = req.headers().get(wire::X_PAYMENT) else {
        return payment_required_v1(&required("X-PAYMENT header is required", None));
    };
    let Some(payload) = wire::decode_header::<PaymentPayloadV1>(header.as_bytes()) else {
        state.stats.update(spec.path, |s| s.refused += 1);
        return payment_required_v1(&required("Invalid or malformed payment header", None));
    };
    state.stats.update(spec.path, |s| s.payment_attempts += 1);
    let payer = Address::from_str(&payload.payload.authorization.from).ok();

    let prepared = if payload.x402_version != 1 {
        Err(Refusal::InvalidVersion(payload.x402_version))
    } else {
        offers
            .iter()
            .find(|o| {
                o.scheme == payload.scheme
                    && o.network == state.settings.network
                    && payload.network == state.settings.network_v1
            })
            .ok_or(Refusal::NoMatchingRequirement)
            .and_then(|offer| SignedAuthorization::parse(&payload.payload).map(|auth| (offer.clone(), auth)))
    };
    let outcome = match prepared {
        Ok((offer, auth)) => execute(spec, state, &offer, auth, body, seconds).await,
        Err(refusal) => Outcome::Refused(refusal),
    };

    match outcome {
        Outcome::Refused(refusal) => {
            note_refusal(state, spec, &refusal);
            payment_required_v1(&required(refusal.reason(), payer))
        }
        Outcome::Drop => dropped_connection(),
        Outcome::Pending(settled) => super::pending_routes::pending_v1(state, &settled),
        Outcome::Precondition(reason) => super::pending_routes::precondition_v1(&required(reason, payer)),
        Outcome::AnsweredPending(settled, body) => super::pending_routes::answered_pending_v1(state, &settled, &body),
        Outcome::Answer { status, body, settlement } => {
            let mut response = HttpResponse::build(status);
            if let Some(settled) = settlement {
                let header = wire::encode_header(&wire::SettlementV1 {
                    success: true,
                    transaction: format!("{:#x}", settled.transaction),
                    network: state.settings.network_v1.clone(),
                    payer: settled.payer.to_checksum(None),
                });
                match header {
                    Ok(header) => {
                        response.insert_header((wire::X_PAYMENT_RESPONSE, header));
                    }
                    Err(err) => return internal_error(&err),
                }
            }
            response.json(body)
        }
    }
}

/// The offered entry a v2 client says it accepted (addresses compared as addresses).
pub(super) fn match_offer_v2<'a>(offers: &'a [Offer], accepted: &wire::AcceptedV2) -> Result<&'a Offer, Refusal> {
    let asset = Address::from_str(&accepted.asset).ok();
    let pay_to = Address::from_str(&accepted.pay_to).ok();
    offers
        .iter()
        .find(|o| {
            o.scheme == accepted.scheme
                && o.network == accepted.network
                && o.amount.to_string() == accepted.amount
                && Some(o.asset) == asset
                && Some(o.pay_to) == pay_to
        })
        .ok_or(Refusal::NoMatchingRequirement)
}

/// Verifies, then does what the route does. Shared by both wire versions.
pub(super) async fn execute(
    spec: &'static RouteSpec,
    state: &AppState,
    offer: &Offer,
    auth: SignedAuthorization,
    body: &Bytes,
    seconds: u64,
) -> Outcome {
    if let Err(refusal) = state.facilitator.verify(offer, &auth).await {
        return Outcome::Refused(refusal);
    }
    match spec.behaviour {
        Behaviour::Weather | Behaviour::Multi => settle_then(state, spec, auth, StatusCode::OK, weather(spec)).await,
        // Settles, then (with `?seconds=N`) is still handling the request for N s.
        Behaviour::PaymentIdentifier | Behaviour::Siwx | Behaviour::PidSiwx => {
            settle_then_handle(state, spec, auth, seconds).await
        }
        Behaviour::Hostile => {
            let body = json!({ "route": spec.path, "note": HOSTILE_NOTE, "report": weather(spec) });
            settle_then(state, spec, auth, StatusCode::OK, body).await
        }
        Behaviour::Echo => match serde_json::from_slice::<Value>(body) {
            Ok(echo) => settle_then(state, spec, auth, StatusCode::OK, echo).await,
            // The handler failed, so (like the official middleware) nothing is settled.
            Err(_) => Outcome::Answer {
                status: StatusCode::BAD_REQUEST,
                body: json!({ "error": "the request body must be JSON" }),
                settlement: None,
            },
        },
        Behaviour::Error500 => Outcome::Answer {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: json!({ "error": "the upstream failed (test route); the payment was not settled" }),
            settlement: None,
        },
        Behaviour::SettleThen500 => {
            let body = json!({ "error": "the upstream failed after settling (test route)" });
            settle_then(state, spec, auth, StatusCode::INTERNAL_SERVER_ERROR, body).await
        }
        Behaviour::SettleThenDrop => match settle(state, spec, auth, Duration::ZERO).await {
            Ok(_) => Outcome::Drop,
            Err(refusal) => Outcome::Refused(refusal),
        },
        Behaviour::Stall => stall(state, spec, auth, seconds).await,
        Behaviour::SlowSettle => slow_settle(state, spec, auth, seconds).await,
        Behaviour::Lie => lie(spec, &auth),
        Behaviour::KeepThenReject => {
            keep(state, spec, auth).await;
            Outcome::Refused(Refusal::Forced {
                reason: "unexpected_settle_error".into(),
                message: "payment failed (this route keeps the authorization)".into(),
            })
        }
        Behaviour::KeepThenAnswer => {
            keep(state, spec, auth).await;
            Outcome::Answer { status: StatusCode::OK, body: weather(spec), settlement: None }
        }
        Behaviour::Reprice => settle_then(state, spec, auth, StatusCode::OK, weather(spec)).await,
        Behaviour::RejectHostile => Outcome::Refused(Refusal::Forced {
            reason: HOSTILE_REASON.into(),
            message: "this route refuses every payment".into(),
        }),
        Behaviour::SettlementPending => super::pending_routes::broadcast_then_pending(state, spec, auth).await,
        Behaviour::SettlementPendingLie => super::pending_routes::pending_lie(state, spec, auth).await,
        Behaviour::Permit2Gate => super::pending_routes::permit2_gate(state, spec, auth).await,
        Behaviour::SettlementPendingWrongTx => super::pending_routes::pending_wrong_tx(state, spec, auth).await,
        Behaviour::SettlementPendingAnswered => {
            match super::pending_routes::broadcast_then_pending(state, spec, auth).await {
                Outcome::Pending(settled) => Outcome::AnsweredPending(settled, weather(spec)),
                other => other,
            }
        }
        Behaviour::Reject => Outcome::Refused(Refusal::Forced {
            reason: "invalid_exact_evm_signature".into(),
            message: "this route refuses every payment".into(),
        }),
    }
}

/// Settles, then (with `?seconds=N`) is still handling the request for N s; a settled payer
/// of a sign-in-with-x route may sign in from then on.
async fn settle_then_handle(
    state: &AppState,
    spec: &'static RouteSpec,
    auth: SignedAuthorization,
    seconds: u64,
) -> Outcome {
    let payer = auth.from;
    match settle(state, spec, auth, Duration::ZERO).await {
        Ok(transaction) => {
            // Settled: this payer may sign in to re-access the path from now on.
            if spec.behaviour.siwx() {
                state.siwx.record_payment(spec.path, payer);
            }
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            let answer_id = uuid::Uuid::new_v4().to_string();
            if spec.behaviour.siwx() {
                state.stats.update(spec.path, |s| {
                    s.siwx_handled += 1;
                    s.last_answer_id = Some(answer_id.clone());
                });
            }
            Outcome::Answer {
                status: StatusCode::OK,
                body: json!({ "handled_for_seconds": seconds, "answer_id": answer_id, "report": weather(spec) }),
                settlement: Some(Settled { transaction, payer }),
            }
        }
        Err(refusal) => Outcome::Refused(refusal),
    }
}

/// Settles after waiting `seconds`: the wait is part of the settlement task, so a client that
/// gives up does not stop it.
async fn stall(state: &AppState, spec: &'static RouteSpec, auth: SignedAuthorization, seconds: u64) -> Outcome {
    let payer = auth.from;
    match settle(state, spec, auth, Duration::from_secs(seconds)).await {
        Ok(transaction) => Outcome::Answer {
            status: StatusCode::OK,
            body: json!({ "stalled_seconds": seconds, "report": weather(spec) }),
            settlement: Some(Settled { transaction, payer }),
        },
        Err(refusal) => Outcome::Refused(refusal),
    }
}

/// Settles, then sleeps `seconds` before answering.
async fn slow_settle(state: &AppState, spec: &'static RouteSpec, auth: SignedAuthorization, seconds: u64) -> Outcome {
    let payer = auth.from;
    match settle(state, spec, auth, Duration::ZERO).await {
        Ok(transaction) => {
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            Outcome::Answer {
                status: StatusCode::OK,
                body: json!({ "slept_after_settling_seconds": seconds, "report": weather(spec) }),
                settlement: Some(Settled { transaction, payer }),
            }
        }
        Err(refusal) => Outcome::Refused(refusal),
    }
}

/// Claims a settlement that did not happen: a made-up hash no transaction has.
fn lie(spec: &'static RouteSpec, auth: &SignedAuthorization) -> Outcome {
    // Looks like a transaction hash; no transaction has it.
    let made_up = keccak256([b"x402-test-upstream: never settled ".as_slice(), auth.nonce.as_slice()].concat());
    tracing::warn!(route = spec.path, payer = %auth.from, tx = %made_up, "claiming a settlement that did not happen");
    Outcome::Answer {
        status: StatusCode::OK,
        body: weather(spec),
        settlement: Some(Settled { transaction: made_up, payer: auth.from }),
    }
}

/// Settles now, then answers `status` with `body` and the settlement header.
pub(super) async fn settle_then(
    state: &AppState,
    spec: &'static RouteSpec,
    auth: SignedAuthorization,
    status: StatusCode,
    body: Value,
) -> Outcome {
    let payer = auth.from;
    match settle(state, spec, auth, Duration::ZERO).await {
        Ok(transaction) => Outcome::Answer { status, body, settlement: Some(Settled { transaction, payer }) },
        Err(refusal) => Outcome::Refused(refusal),
    }
}

/// Waits `delay`, settles, and counts the settlement, in a task of its own so that a client
/// hanging up cannot cancel it half way.
pub(super) async fn settle(
    state: &AppState,
    spec: &'static RouteSpec,
    auth: SignedAuthorization,
    delay: Duration,
) -> Result<B256, Refusal> {
    let facilitator = state.facilitator.clone();
    let stats = state.stats.clone();
    let task = actix_rt::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let result = facilitator.settle(&auth).await;
        match &result {
            Ok(tx) => {
                tracing::info!(route = spec.path, payer = %auth.from, amount = %auth.value, %tx, "settled");
                stats.update(spec.path, |s| {
                    s.paid += 1;
                    s.last_paid_amount = Some(auth.value.to_string());
                    s.last_transaction = Some(format!("{tx:#x}"));
                });
            }
            Err(refusal) => {
                tracing::warn!(route = spec.path, payer = %auth.from, reason = refusal.reason(), error = %refusal, "settlement failed");
            }
        }
        result
    });
    match task.await {
        Ok(result) => result,
        Err(join) => Err(Refusal::SettleRpc(format!("the settlement task failed: {join}"))),
    }
}

pub(super) fn note_refusal(state: &AppState, spec: &RouteSpec, refusal: &Refusal) {
    tracing::info!(route = spec.path, reason = refusal.reason(), error = %refusal, "payment refused");
    state.stats.update(spec.path, |s| s.refused += 1);
}
