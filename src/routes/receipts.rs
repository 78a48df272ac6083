//! `GET /receipts/{id}` for agents.

use actix_web::{HttpResponse, web};
use uuid::Uuid;

use crate::auth::AuthenticatedAgent;
use crate::error::ApiError;
use crate::receipts::store;
use crate::state::AppState;

/// GET /receipts/{id} — one of the calling agent's receipts; anyone else's is 404.
pub async fn get_own(
    state: web::Data<AppState>,
    agent: AuthenticatedAgent,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    let receipt = store::find_for_agent(&mut conn, agent.id, id).await.map_err(ApiError::database)?;
    receipt.map(|r| HttpResponse::Ok().json(r)).ok_or(ApiError::NotFound)
}
