//! The agent's self-service endpoints: `GET /agents/me`, `GET /receipts`, `GET /payments`.

use actix_web::{HttpRequest, HttpResponse, web};

use crate::auth::AuthenticatedAgent;
use crate::error::{ApiError, PoolConn};
use crate::self_service::{self, ReceiptPage};
use crate::state::AppState;

/// GET /agents/me — the calling agent's limits and rolling 24 h spend (decimal strings of
/// atomic units), in total and per asset.
#[utoipa::path(get, path = "/agents/me", tag = "agent", operation_id = "getAgentSelf",
    summary = "The calling agent's limits, budget and rolling 24 h spend",
    security(("agentKey" = [])),
    responses(
        (status = 200, description = "Limits and spend.", body = crate::self_service::Me),
        (status = 401, response = crate::routes::responses::Unauthorized),
        (status = 403, response = crate::routes::responses::AgentDisabled),
        (status = 503, response = crate::routes::responses::Unavailable),
    ))]
pub async fn me(state: web::Data<AppState>, agent: AuthenticatedAgent) -> Result<HttpResponse, ApiError> {
    let mut conn = state.conn().await?;
    let me = self_service::me(&mut conn, agent.id).await.map_err(ApiError::database)?;
    me.map(|m| HttpResponse::Ok().json(m)).ok_or(ApiError::NotFound)
}

/// GET /receipts — the calling agent's receipts, newest first, keyset-paginated:
/// `{"receipts": [...], "next_cursor": "…" | null}` (`limit` 1–500, default 50; `cursor`).
#[utoipa::path(get, path = "/receipts", tag = "agent", operation_id = "listOwnReceipts",
    summary = "The calling agent's receipts, newest first",
    description = "Keyset-paginated on `(created_at, id)` descending: pass `next_cursor` back as `cursor` until it is null. A page never repeats or skips a receipt. Unknown or repeated parameters are 400.",
    security(("agentKey" = [])),
    params(
        ("limit" = inline(Option<crate::routes::inline::Limit<50>>), Query),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page."),
    ),
    responses(
        (status = 200, description = "A page of receipts.", body = crate::routes::pages::ReceiptPage),
        (status = 400, response = crate::routes::responses::BadQuery),
        (status = 401, response = crate::routes::responses::Unauthorized),
        (status = 403, response = crate::routes::responses::AgentDisabled),
        (status = 503, response = crate::routes::responses::Unavailable),
    ))]
pub async fn receipts(
    state: web::Data<AppState>,
    agent: AuthenticatedAgent,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let page = ReceiptPage::parse(req.query_string()).map_err(|e| ApiError::BadRequest(e.0))?;
    let mut conn = state.conn().await?;
    let (rows, next) = self_service::receipts(&mut conn, agent.id, page).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok()
        .json(crate::routes::pages::ReceiptPage { next_cursor: next.map(|c| c.encode()), receipts: rows }))
}

/// GET /payments?idempotency_key=K — the payment signed under one of the agent's keys, as the
/// ledger has it now, whether a new key is safe for that call, and the answer `reconcile`
/// recovered for it after the key was answered `settled_response_lost` (`recovered_answer`,
/// else null). 404: no payment was ever signed for the key, so nothing was paid under it.
#[utoipa::path(get, path = "/payments", tag = "agent", operation_id = "getOwnPayment",
    summary = "The payment signed under one of the calling agent's idempotency keys",
    description = "For an ambiguous outcome (`payment_unknown`, e.g. a route deadline with no receipt): poll this until the status is final. `expired` (set by `reconcile` once the authorization lapsed unused) means nothing was paid and a new key is safe; `settled_response_lost` means paid, not served: never pay again. When `reconcile` later recovers the lost answer (an upstream that advertised `payment-identifier` gives back its original answer to the byte-identical re-sent payment), the status becomes `settled` and `recovered_answer` holds it; the key's own answer stays as first given.",
    security(("agentKey" = [])),
    params(("idempotency_key" = String, Query)),
    responses(
        (status = 200, description = "The payment.", body = crate::self_service::KeyPaymentView),
        (status = 400, response = crate::routes::responses::BadQuery),
        (status = 401, response = crate::routes::responses::Unauthorized),
        (status = 403, response = crate::routes::responses::AgentDisabled),
        (status = 404, description = "No payment was ever signed under this key (nothing was paid under it).",
            body = crate::routes::responses::ErrorNotFound),
        (status = 503, response = crate::routes::responses::Unavailable),
    ))]
pub async fn payment(
    state: web::Data<AppState>,
    agent: AuthenticatedAgent,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut key = None;
    for (name, value) in url::form_urlencoded::parse(req.query_string().as_bytes()) {
        match name.as_ref() {
            "idempotency_key" if key.is_none() => key = Some(value.into_owned()),
            "idempotency_key" => return Err(ApiError::BadRequest("`idempotency_key` given more than once".into())),
            other => {
                return Err(ApiError::BadRequest(format!("unknown parameter `{other}` (allowed: idempotency_key)")));
            }
        }
    }
    let key = key.ok_or_else(|| ApiError::BadRequest("`idempotency_key` is required".into()))?;
    let mut conn = state.conn().await?;
    let found = self_service::payment_for_key(&mut conn, agent.id, &key).await.map_err(ApiError::database)?;
    let p = found.ok_or(ApiError::NotFound)?;
    let safe = crate::mcp::policy::RELEASED_PAYMENT_STATES.contains(&p.status.as_str());
    // Through a value: members in name order, as before.
    let body =
        serde_json::to_value(self_service::KeyPaymentView::new(&p, safe)).map_err(|e| ApiError::Internal(e.into()))?;
    Ok(HttpResponse::Ok().json(body))
}
