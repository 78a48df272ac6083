//! Two answers of the official x402 packages that are not a settlement and not a refusal:
//! a settlement still pending (402 carrying `PAYMENT-RESPONSE` `settlement_pending`) and a
//! facilitator that needs a Permit2 approval first (412 `permit2_allowance_required`).

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::CACHE_CONTROL;
use alloy::primitives::{U256, keccak256};
use serde::Serialize;
use serde_json::json;

use crate::payment::SignedAuthorization;
use crate::permit2::PERMIT2;
use crate::wire;

use super::paid_routes::{Outcome, Settled, settle_then};
use super::*;

pub const SETTLEMENT_PENDING: &str = "settlement_pending";
pub const PERMIT2_ALLOWANCE_REQUIRED: &str = "permit2_allowance_required";

/// The JSON inside `PAYMENT-RESPONSE` of an unsuccessful settlement (field order as the
/// official middleware writes it).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FailedSettlementV2 {
    success: bool,
    error_reason: &'static str,
    payer: String,
    transaction: String,
    network: String,
}

/// `SettlementPending`: broadcast, answer `settlement_pending` with the hash.
pub(super) async fn broadcast_then_pending(
    state: &AppState,
    spec: &'static RouteSpec,
    auth: SignedAuthorization,
) -> Outcome {
    let payer = auth.from;
    match state.facilitator.broadcast(&auth).await {
        Ok(transaction) => {
            tracing::info!(route = spec.path, payer = %payer, tx = %transaction, "broadcast; answering settlement_pending");
            state.stats.update(spec.path, |s| {
                s.pending += 1;
                s.last_transaction = Some(format!("{transaction:#x}"));
            });
            Outcome::Pending(Settled { transaction, payer })
        }
        Err(refusal) => Outcome::Refused(refusal),
    }
}

/// `SettlementPendingLie`: keep the authorization, claim a transaction that does not exist.
pub(super) async fn pending_lie(state: &AppState, spec: &'static RouteSpec, auth: SignedAuthorization) -> Outcome {
    let payer = auth.from;
    let made_up = keccak256([b"x402-test-upstream: pending, never sent ".as_slice(), auth.nonce.as_slice()].concat());
    tracing::warn!(route = spec.path, payer = %payer, tx = %made_up, "keeping the authorization; claiming settlement_pending");
    state.stats.update(spec.path, |s| {
        s.pending += 1;
        s.kept += 1;
    });
    state.kept.lock().await.push(auth);
    Outcome::Pending(Settled { transaction: made_up, payer })
}

/// `SettlementPendingWrongTx`: keep the authorization, name a mined transaction that did
/// not use it.
pub(super) async fn pending_wrong_tx(state: &AppState, spec: &'static RouteSpec, auth: SignedAuthorization) -> Outcome {
    let payer = auth.from;
    let unrelated = match state.facilitator.send_unrelated().await {
        Ok(hash) => hash,
        Err(refusal) => return Outcome::Refused(refusal),
    };
    tracing::warn!(route = spec.path, payer = %payer, tx = %unrelated, "keeping the authorization; naming an unrelated tx");
    state.stats.update(spec.path, |s| {
        s.pending += 1;
        s.kept += 1;
        s.last_transaction = Some(format!("{unrelated:#x}"));
    });
    state.kept.lock().await.push(auth);
    Outcome::Pending(Settled { transaction: unrelated, payer })
}

/// `Permit2Gate`: 412 unless the payer's Permit2 allowance covers the price.
pub(super) async fn permit2_gate(state: &AppState, spec: &'static RouteSpec, auth: SignedAuthorization) -> Outcome {
    match state.facilitator.allowance(auth.from, PERMIT2).await {
        Ok(allowed) if allowed >= auth.value && allowed > U256::ZERO => {
            settle_then(state, spec, auth, StatusCode::OK, weather(spec)).await
        }
        Ok(_) => {
            tracing::info!(route = spec.path, payer = %auth.from, "no Permit2 allowance: 412");
            state.stats.update(spec.path, |s| s.permit2_required += 1);
            Outcome::Precondition(PERMIT2_ALLOWANCE_REQUIRED)
        }
        Err(refusal) => Outcome::Refused(refusal),
    }
}

/// The settlement header of a `settlement_pending` claim for `settled`, on `network`.
fn pending_claim(settled: &Settled, network: &str) -> Result<String, serde_json::Error> {
    wire::encode_header(&FailedSettlementV2 {
        success: false,
        error_reason: SETTLEMENT_PENDING,
        payer: settled.payer.to_checksum(None),
        transaction: format!("{:#x}", settled.transaction),
        network: network.to_owned(),
    })
}

/// 402, body `{}`, `PAYMENT-RESPONSE` `settlement_pending` (v2).
pub(super) fn pending_v2(state: &AppState, settled: &Settled) -> HttpResponse {
    let header = pending_claim(settled, &state.settings.network);
    match header {
        Ok(h) => HttpResponse::PaymentRequired()
            .insert_header((wire::PAYMENT_RESPONSE, h))
            .insert_header((CACHE_CONTROL, "no-store"))
            .json(json!({})),
        Err(err) => internal_error(&err),
    }
}

/// 200 with `body` and `PAYMENT-RESPONSE` `settlement_pending` (v2).
pub(super) fn answered_pending_v2(state: &AppState, settled: &Settled, body: &serde_json::Value) -> HttpResponse {
    let header = pending_claim(settled, &state.settings.network);
    match header {
        Ok(h) => HttpResponse::Ok().insert_header((wire::PAYMENT_RESPONSE, h)).json(body),
        Err(err) => internal_error(&err),
    }
}

/// 200 with `body` and `X-PAYMENT-RESPONSE` `settlement_pending` (v1).
pub(super) fn answered_pending_v1(state: &AppState, settled: &Settled, body: &serde_json::Value) -> HttpResponse {
    let header = pending_claim(settled, &state.settings.network_v1);
    match header {
        Ok(h) => HttpResponse::Ok().insert_header((wire::X_PAYMENT_RESPONSE, h)).json(body),
        Err(err) => internal_error(&err),
    }
}

/// 402 with `X-PAYMENT-RESPONSE` `settlement_pending` (v1).
pub(super) fn pending_v1(state: &AppState, settled: &Settled) -> HttpResponse {
    let header = pending_claim(settled, &state.settings.network_v1);
    match header {
        Ok(h) => HttpResponse::PaymentRequired().insert_header((wire::X_PAYMENT_RESPONSE, h)).json(json!({})),
        Err(err) => internal_error(&err),
    }
}

/// 412 with the requirements and `error` = the reason (v2), body `{}`.
pub(super) fn precondition_v2(required: &wire::PaymentRequiredV2) -> HttpResponse {
    match wire::encode_header(required) {
        Ok(header) => HttpResponse::PreconditionFailed()
            .insert_header((wire::PAYMENT_REQUIRED, header))
            .insert_header((CACHE_CONTROL, "no-store"))
            .json(json!({})),
        Err(err) => internal_error(&err),
    }
}

/// 412 with the v1 requirements body.
pub(super) fn precondition_v1(required: &wire::PaymentRequiredV1) -> HttpResponse {
    HttpResponse::PreconditionFailed().insert_header((CACHE_CONTROL, "no-store")).json(required)
}
