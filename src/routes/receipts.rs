//! `GET /receipts/{id}` for agents.

use actix_web::{HttpResponse, web};
use uuid::Uuid;

use crate::auth::AuthenticatedAgent;
use crate::error::{ApiError, PoolConn};
use crate::receipts::store;
use crate::state::AppState;

/// GET /receipts/{id} — one of the calling agent's receipts; anyone else's is 404. When a
/// payment was signed for its key, `X-Payment-Status` carries the payment's current ledger
/// status (outside the signed document: `reconcile` may have moved it on since).
#[utoipa::path(get, path = "/receipts/{id}", tag = "agent", operation_id = "getOwnReceipt",
    summary = "One of the calling agent's receipts",
    description = "Another agent's receipt, an unknown id and a non-uuid are all 404.",
    security(("agentKey" = [])),
    params(("id" = Uuid, Path, description = "The receipt id (a non-uuid is 404).")),
    responses(
        (status = 200, description = "The signed receipt.", body = crate::receipts::Receipt,
            headers(("X-Payment-Status" = String, description = "When a payment was signed for the receipt's key: its current ledger status (`signed`, `settled`, `unconfirmed`, `not_settled`, `rejected`, `settled_response_lost`, `unknown`, `expired`). Outside the signed document: `reconcile` may have moved it on since the receipt was signed."))),
        (status = 401, response = crate::routes::responses::Unauthorized),
        (status = 403, response = crate::routes::responses::AgentDisabled),
        (status = 404, response = crate::routes::responses::NotFound),
        (status = 503, response = crate::routes::responses::Unavailable),
    ))]
pub async fn get_own(
    state: web::Data<AppState>,
    agent: AuthenticatedAgent,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let mut conn = state.conn().await?;
    let receipt = store::find_for_agent(&mut conn, agent.id, id).await.map_err(ApiError::database)?;
    let receipt = receipt.ok_or(ApiError::NotFound)?;
    let status = crate::self_service::payment_status(&mut conn, agent.id, &receipt.idempotency_key)
        .await
        .map_err(ApiError::database)?;
    let mut resp = HttpResponse::Ok();
    if let Some(s) = status {
        resp.insert_header(("X-Payment-Status", s));
    }
    Ok(resp.json(receipt))
}
