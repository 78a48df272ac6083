//! Operator tokens over HTTP (`/admin/operators`, an admin operator token; a viewer gets 403
//! `operator_only`, listing included: the list names who can administer the router). Parsing,
//! the last-admin rule and the transactional writes with their events are
//! `crate::operators::manage`, which the `operators` command calls too.

use actix_web::{HttpResponse, web};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::admin::proposals;
use crate::auth::Admin;
use crate::error::{ApiError, PoolConn};
use crate::operators::manage::{self, Bootstrap, NewOperator};
use crate::operators::store::OperatorInfo;
use crate::routes::responses::{AdminOnly, BadInput, BodyTooLarge, LastAdmin, NotFound, Unauthorized, Unavailable};
use crate::state::AppState;

/// Most bytes the body of `POST /admin/operators` may hold.
const MAX_BODY: usize = 4 * 1024;

/// An operator and its token (`POST /admin/operators`).
#[derive(Debug, Serialize, ToSchema)]
pub struct OperatorWithToken {
    /// The operator.
    pub operator: OperatorInfo,
    /// `x4o_…`, shown this once: never listed, never in an event, only its sha256 stored.
    pub token: String,
}

/// The body of `GET /admin/operators`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OperatorList {
    /// Every operator, revoked ones included, oldest first.
    pub operators: Vec<OperatorInfo>,
}

/// POST /admin/operators — creates an operator: 201 `{"operator": {...}, "token": "x4o_…"}`
/// (the token is shown this once).
#[utoipa::path(post, path = "/admin/operators", tag = "admin", operation_id = "adminCreateOperator",
    summary = "Create an operator token (shown once)",
    description = "Admin only. `name` (1–200 printable characters) and `role` (`viewer` or `admin`) are required and nothing else is accepted. The token works at once on every router; it is never shown again (not in the list, not in the `operator.create` event written in the same transaction).",
    security(("operatorToken" = [])),
    request_body(content = NewOperator, content_type = "application/json"),
    responses(
        (status = 201, description = "The operator and its token.", body = OperatorWithToken),
        (status = 202, description = "Under the two-person rule (`REQUIRE_SECOND_ADMIN`), a new admin: proposed, nothing created; the admin who confirms it (`POST /admin/changes/{id}/confirm`) receives its token.", body = proposals::Proposal),
        (status = 400, response = BadInput),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 413, response = BodyTooLarge),
        (status = 503, response = Unavailable),
    ))]
pub async fn create(state: web::Data<AppState>, op: Admin, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let new = NewOperator::from_json(&super::read_limited(payload, MAX_BODY).await?)?;
    let mut conn = state.conn().await?;
    let rule = crate::admin::Rule { ttl: state.config.second_admin };
    if let Some(p) = proposals::propose_operator(&mut conn, &op.actor, rule, &new).await.map_err(ApiError::database)? {
        return Ok(HttpResponse::Accepted().json(super::in_name_order(&p)));
    }
    let (operator, token) = manage::create(&mut conn, &op.actor, &new).await?;
    Ok(HttpResponse::Created().json(super::in_name_order(&OperatorWithToken { operator, token })))
}

/// GET /admin/operators — every operator, revoked ones included: `{"operators": [...]}`.
#[utoipa::path(get, path = "/admin/operators", tag = "admin", operation_id = "adminListOperators",
    summary = "Every operator (never a token)",
    description = "Admin only (a viewer gets 403 `operator_only`): the list names who can administer the router.",
    security(("operatorToken" = [])),
    responses(
        (status = 200, description = "The operators, oldest first.", body = OperatorList),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 503, response = Unavailable),
    ))]
pub async fn list(state: web::Data<AppState>, _: Admin) -> Result<HttpResponse, ApiError> {
    let mut conn = state.conn().await?;
    let operators = manage::list(&mut conn).await?;
    Ok(HttpResponse::Ok().json(super::in_name_order(&OperatorList { operators })))
}

/// DELETE /admin/operators/{id} — revokes an operator: its token is refused by every router
/// from the commit on. Idempotent: a revoked operator is answered as it is, with no new event.
#[utoipa::path(delete, path = "/admin/operators/{id}", tag = "admin", operation_id = "adminRevokeOperator",
    summary = "Revoke an operator token",
    description = "Admin only. The token is refused (401) by every router from the moment the revocation commits (tokens are looked up in Postgres on every request), with an `operator.revoke` event in the same transaction. Revoking a revoked operator answers it unchanged (its first `revoked_at`), with no second event. The last live admin is not revoked while the router has no bootstrap `OPERATOR_TOKEN` (409 `last_admin`): create another admin first.",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The operator's id (not a uuid: 404).")),
    responses(
        (status = 200, description = "The operator, revoked.", body = OperatorInfo),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 404, response = NotFound),
        (status = 409, response = LastAdmin),
        (status = 503, response = Unavailable),
    ))]
pub async fn revoke(state: web::Data<AppState>, op: Admin, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let bootstrap = if state.config.operator_token.is_some() { Bootstrap::Configured } else { Bootstrap::Absent };
    let mut conn = state.conn().await?;
    Ok(HttpResponse::Ok().json(manage::revoke(&mut conn, &op.actor, id, bootstrap).await?))
}
