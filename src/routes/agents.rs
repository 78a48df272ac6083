//! The agent's self-service endpoints: `GET /agents/me`, `GET /receipts`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::json;

use crate::auth::AuthenticatedAgent;
use crate::error::ApiError;
use crate::self_service::{self, ReceiptPage};
use crate::state::AppState;

/// GET /agents/me — the calling agent's limits and rolling 24 h spend (decimal strings of
/// atomic units), in total and per asset.
pub async fn me(state: web::Data<AppState>, agent: AuthenticatedAgent) -> Result<HttpResponse, ApiError> {
    let mut conn = state.pool.get().await.map_err(ApiError::database)?;
    let me = self_service::me(&mut conn, agent.id).await.map_err(ApiError::database)?;
    me.map(|m| HttpResponse::Ok().json(m)).ok_or(ApiError::NotFound)
}

/// GET /receipts — the calling agent's receipts, newest first, keyset-paginated:
/// `{"receipts": [...], "next_cursor": "…" | null}` (`limit` 1–500, default 50; `cursor`).
pub async fn receipts(
    state: web::Data<AppState>,
    agent: AuthenticatedAgent,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let page = ReceiptPage::parse(req.query_string()).map_err(ApiError::BadRequest)?;
    let mut conn = state.pool.get().await.map_err(ApiError::database)?;
    let (rows, next) = self_service::receipts(&mut conn, agent.id, page).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok().json(json!({ "receipts": rows, "next_cursor": next.map(|c| c.encode()) })))
}
