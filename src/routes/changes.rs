//! The two-person rule over HTTP (`/admin/changes*`): the proposed changes for viewers and
//! admins, confirmations and rejections for admins. The domain is
//! `crate::admin::proposals`; this only extracts, calls and shapes JSON.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::admin::proposals::{self, Proposal, ProposalState};
use crate::audit::{BadQuery, Params};
use crate::auth::{Admin, Viewer};
use crate::error::{ApiError, PoolConn};
use crate::routes::responses::{
    AdminOnly, BadQuery as BadQueryAnswer, ChangeDecided, ForbiddenAgentKey, NotFound, Unauthorized, Unavailable,
};
use crate::state::AppState;

/// The body of `GET /admin/changes`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChangeList {
    /// Newest first, at most 500.
    pub changes: Vec<Proposal>,
    /// Whether this router holds raising changes for a second admin (`REQUIRE_SECOND_ADMIN`).
    pub require_second_admin: bool,
}

/// GET /admin/changes — proposed changes, newest first (`?state=`; absent: pending).
#[utoipa::path(get, path = "/admin/changes", tag = "admin", operation_id = "adminListChanges",
    summary = "Changes waiting for a second admin (the two-person rule)",
    description = "Viewer or admin. Newest first, at most 500: each with its proposer and what it would change, field by field. `state`: `pending` (the default), `confirmed`, `rejected`, `expired` or `all` (a pending change past its `expires_at` is `expired`).",
    security(("operatorToken" = [])),
    params(("state" = Option<String>, Query, description = "`pending` (default), `confirmed`, `rejected`, `expired` or `all`.")),
    responses(
        (status = 200, description = "The changes.", body = ChangeList),
        (status = 400, response = BadQueryAnswer),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 503, response = Unavailable),
    ))]
pub async fn list(state: web::Data<AppState>, _: Viewer, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let mut p = Params::parse(req.query_string(), &["state"])?;
    let filter = match p.take("state").as_deref().map(str::trim) {
        None | Some("") => Some(ProposalState::Pending),
        Some("all") => None,
        Some(s) => Some(ProposalState::parse(s).ok_or_else(|| {
            BadQuery(format!("state must be pending, confirmed, rejected, expired or all, not {s:?}"))
        })?),
    };
    let mut conn = state.conn().await?;
    let changes = proposals::list(&mut conn, filter).await.map_err(ApiError::database)?;
    let require_second_admin = state.config.second_admin.is_some();
    Ok(HttpResponse::Ok().json(ChangeList { changes, require_second_admin }))
}

/// POST /admin/changes/{id}/confirm — applies a proposed change (another admin than its proposer).
#[utoipa::path(post, path = "/admin/changes/{id}/confirm", tag = "admin", operation_id = "adminConfirmChange",
    summary = "Confirm a proposed change (a second admin)",
    description = "Admin, not the proposer (403 `own_change`). Applies exactly the proposed values, in one transaction with a `change.confirm` event and the change's own event. Refused with 409 `change_stale` when the agent's limits or the settings changed since the proposal (nothing written); of two confirmations exactly one applies, the other gets 409 `change_decided` (so does one after `CHANGE_TTL`).",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The change's id (not a uuid: 404).")),
    responses(
        (status = 200, description = "The change, confirmed and applied (a new admin operator: with its `token`, shown this once).", body = proposals::Confirmed),
        (status = 401, response = Unauthorized),
        (status = 403, description = "A viewer's token or an agent key (`operator_only`), or the change's own proposer (`own_change`); nothing changed.",
            body = inline(crate::routes::inline::ConfirmForbidden)),
        (status = 404, response = NotFound),
        (status = 409, description = "Already confirmed, rejected or expired (`change_decided`), or the agent or settings changed since the proposal (`change_stale`); nothing changed.",
            body = inline(crate::routes::inline::ChangeConflict)),
        (status = 503, response = Unavailable),
    ))]
pub async fn confirm(state: web::Data<AppState>, op: Admin, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let mut conn = state.conn().await?;
    Ok(HttpResponse::Ok().json(proposals::confirm(&mut conn, &op.actor, id).await?))
}

/// POST /admin/changes/{id}/reject — drops a proposed change (any admin, its proposer too).
#[utoipa::path(post, path = "/admin/changes/{id}/reject", tag = "admin", operation_id = "adminRejectChange",
    summary = "Reject a proposed change",
    description = "Admin (the proposer too: a withdrawal). Nothing is applied; a `change.reject` event. A change already decided or expired: 409 `change_decided`.",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The change's id (not a uuid: 404).")),
    responses(
        (status = 200, description = "The change, rejected.", body = Proposal),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 404, response = NotFound),
        (status = 409, response = ChangeDecided),
        (status = 503, response = Unavailable),
    ))]
pub async fn reject(state: web::Data<AppState>, op: Admin, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let mut conn = state.conn().await?;
    Ok(HttpResponse::Ok().json(proposals::reject(&mut conn, &op.actor, id).await?))
}
