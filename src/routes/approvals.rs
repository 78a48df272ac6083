//! Approvals over HTTP (`/admin/approvals*`): the queue for viewers and admins, the decisions
//! for admins. The domain is `crate::approvals`; this only extracts, calls and shapes JSON.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::admin::approval_queue::{self, Decision, QueueEntry, StateFilter};
use crate::approvals::Approval;
use crate::audit::{BadQuery, Params};
use crate::auth::{Admin, Viewer};
use crate::error::{ApiError, PoolConn};
use crate::routes::responses::{
    AdminOnly, ApprovalDecided, BadQuery as BadQueryAnswer, ForbiddenAgentKey, NotFound, Unauthorized, Unavailable,
};
use crate::state::AppState;

/// The body of `GET /admin/approvals`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalList {
    /// Newest first, at most 500.
    pub approvals: Vec<QueueEntry>,
}

/// GET /admin/approvals — the approvals, newest first (`?state=pending|approved|denied|expired`).
#[utoipa::path(get, path = "/admin/approvals", tag = "admin", operation_id = "adminListApprovals",
    summary = "Payments held for an operator's approval",
    description = "Viewer or admin. Newest first, at most 500; `state` filters (a pending approval past its `expires_at` is `expired`).",
    security(("operatorToken" = [])),
    params(("state" = Option<String>, Query, description = "`pending`, `approved`, `denied` or `expired`.")),
    responses(
        (status = 200, description = "The approvals.", body = ApprovalList),
        (status = 400, response = BadQueryAnswer),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 503, response = Unavailable),
    ))]
pub async fn list(state: web::Data<AppState>, _: Viewer, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let mut p = Params::parse(req.query_string(), &["state"])?;
    let filter = StateFilter::parse(p.take("state").as_deref()).map_err(|e| BadQuery(e.0))?;
    let mut conn = state.conn().await?;
    let approvals = approval_queue::list(&mut conn, filter).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok().json(ApprovalList { approvals }))
}

/// POST /admin/approvals/{id}/approve — the held payment may be made (the agent's retry pays).
#[utoipa::path(post, path = "/admin/approvals/{id}/approve", tag = "admin", operation_id = "adminApprove",
    summary = "Approve a held payment",
    description = "Admin. The agent's next retry with the same Idempotency-Key pays (once; its budgets and caps checked again then) and calls the upstream. An `approval.approve` operator event in the same transaction. Of two decisions on one approval exactly one wins; the other gets 409 `approval_decided`. Under the two-person rule (`REQUIRE_SECOND_ADMIN`) only a named admin approves: the bootstrap `OPERATOR_TOKEN` gets 403 `own_change` (it may deny).",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The approval's id (not a uuid: 404).")),
    responses(
        (status = 200, description = "The approval, decided.", body = Approval),
        (status = 401, response = Unauthorized),
        (status = 403, description = "Not an admin (`operator_only`), or the bootstrap token under the two-person rule (`own_change`); nothing changed.",
            body = inline(crate::routes::inline::ApproveForbidden)),
        (status = 404, response = NotFound),
        (status = 409, response = ApprovalDecided),
        (status = 503, response = Unavailable),
    ))]
pub async fn approve(state: web::Data<AppState>, op: Admin, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    decided(&state, &op, &id, Decision::Approve).await
}

/// POST /admin/approvals/{id}/deny — the held payment is never made (403 `approval_denied`).
#[utoipa::path(post, path = "/admin/approvals/{id}/deny", tag = "admin", operation_id = "adminDeny",
    summary = "Deny a held payment",
    description = "Admin. The agent's retry gets 403 `approval_denied`; nothing is signed. An `approval.deny` operator event in the same transaction. Of two decisions on one approval exactly one wins; the other gets 409 `approval_decided`.",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The approval's id (not a uuid: 404).")),
    responses(
        (status = 200, description = "The approval, decided.", body = Approval),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 404, response = NotFound),
        (status = 409, response = ApprovalDecided),
        (status = 503, response = Unavailable),
    ))]
pub async fn deny(state: web::Data<AppState>, op: Admin, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    decided(&state, &op, &id, Decision::Deny).await
}

async fn decided(state: &AppState, op: &Admin, id: &str, decision: Decision) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(id).map_err(|_| ApiError::NotFound)?;
    let mut conn = state.conn().await?;
    let named_only = state.config.second_admin.is_some();
    let approval = approval_queue::decide(&mut conn, &op.actor, id, decision, named_only).await?;
    Ok(HttpResponse::Ok().json(approval))
}
