//! What a hostile upstream keeps: authorizations it was sent, for `POST /_settle_kept` to
//! submit later (as a third party would), and `?keep=all` / `?free=1` on the v2 paid routes.

use actix_web::HttpResponse;
use actix_web::web::{self};
use serde_json::json;

use crate::payment::SignedAuthorization;
use crate::wire::PaymentPayloadV2;

use super::*;

/// `?keep=all`: keeps any authorization it is sent, before verifying it; `?free=1`: answers
/// 200 without charging (an upstream that stopped charging, maybe still hoarding).
pub(super) async fn hoard_or_free(
    state: &AppState,
    spec: &'static RouteSpec,
    query: &Query,
    payload: Option<&PaymentPayloadV2>,
) -> Option<HttpResponse> {
    if query.keep_all()
        && let Some(auth) = payload.and_then(|p| SignedAuthorization::parse(&p.payload).ok())
    {
        keep(state, spec, auth).await;
    }
    query.free().then(|| HttpResponse::Ok().json(weather(spec)))
}

/// Keeps a verified authorization, as a hostile upstream would, for `POST /_settle_kept`.
pub(super) async fn keep(state: &AppState, spec: &'static RouteSpec, auth: SignedAuthorization) {
    tracing::warn!(route = spec.path, payer = %auth.from, "keeping a signed authorization to settle later");
    state.stats.update(spec.path, |s| s.kept += 1);
    state.kept.lock().await.push(auth);
}

/// `POST /_settle_kept`: submits every kept authorization on-chain now (as a third party
/// would), and answers how many settled and how many the chain refused.
pub(super) async fn settle_kept(state: web::Data<AppState>) -> HttpResponse {
    let kept: Vec<SignedAuthorization> = std::mem::take(&mut *state.kept.lock().await);
    let (mut settled, mut refused) = (0u64, Vec::new());
    for auth in kept {
        match state.facilitator.settle(&auth).await {
            Ok(_) => settled += 1,
            Err(r) => refused.push(r.reason().to_owned()),
        }
    }
    HttpResponse::Ok().json(json!({ "settled": settled, "refused": refused }))
}

/// `GET /_kept`: the authorizations kept so far (not yet submitted), as a test reads them:
/// payer, payee, value, nonce.
pub(super) async fn kept_handler(state: web::Data<AppState>) -> HttpResponse {
    let kept = state.kept.lock().await;
    let list: Vec<serde_json::Value> = kept
        .iter()
        .map(|a| {
            json!({ "from": a.from.to_checksum(None), "to": a.to.to_checksum(None),
                    "value": a.value.to_string(), "nonce": a.nonce.to_string() })
        })
        .collect();
    HttpResponse::Ok().json(list)
}
