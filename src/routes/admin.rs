//! The operator's control plane over HTTP (`/admin/*`, an admin operator token). Parsing,
//! validation and the transactional writes with their audit events are `crate::admin`;
//! this only extracts, calls and shapes the JSON.

use actix_web::{HttpResponse, web};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::admin::AgentChange as AgentChangeBody;
use crate::admin::AgentView as AdminAgent;
use crate::admin::{self, AgentChange, Invalid, Proposal};
use crate::audit::reconcile::Report as ReconcileReport;
use crate::auth::{Admin, Viewer};
use crate::error::{ApiError, PoolConn};
use crate::routes::responses::{AdminOnly, BadInput, ForbiddenAgentKey, NotFound, Unauthorized, Unavailable};
use crate::state::AppState;

/// Most bytes an admin request body may hold (a change of one agent is well under 16 KiB).
const MAX_BODY: usize = 64 * 1024;

/// A JSON body of at most [`MAX_BODY`] bytes (413 beyond; an empty body is `{}`), or 400.
async fn json_body(payload: web::Payload) -> Result<Value, ApiError> {
    let body = super::read_limited(payload, MAX_BODY).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("the body is not JSON: {e}")))
}

/// The body of `GET /admin/agents`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentList {
    /// Every agent, oldest first.
    #[schema(value_type = Vec<AdminAgent>)]
    pub agents: Vec<admin::AgentView>,
}

/// An agent and its API key (`POST /admin/agents`, `POST /admin/agents/{id}/rotate-key`).
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentWithKey {
    /// The agent.
    #[schema(value_type = AdminAgent)]
    pub agent: admin::AgentView,
    /// `x4r_…`, shown this once.
    pub api_key: String,
    /// Under the two-person rule (`REQUIRE_SECOND_ADMIN`) a new agent is created disabled:
    /// the proposal to enable it, for another admin to confirm.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Proposal>)]
    pub enable_change: Option<admin::Proposal>,
}

/// The two-person rule of this router.
fn rule(state: &AppState) -> admin::Rule {
    admin::Rule { ttl: state.config.second_admin }
}

/// 200 with the applied result, or 202 with the proposal waiting for a second admin.
fn done<T: Serialize>(done: admin::Done<T>) -> HttpResponse {
    match done {
        admin::Done::Applied(t) => HttpResponse::Ok().json(super::in_name_order(&t)),
        admin::Done::Proposed(p) => HttpResponse::Accepted().json(super::in_name_order(&*p)),
    }
}

fn agent_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::NotFound)
}

/// POST /admin/agents — creates an agent: 201 `{"agent": {...}, "api_key": "x4r_…"}` (the
/// key is shown this once).
#[utoipa::path(post, path = "/admin/agents", tag = "admin", operation_id = "adminCreateAgent",
    summary = "Create an agent (its key shown once)",
    description = "`name` is required. Written with an `agent.create` operator event in one transaction.",
    security(("operatorToken" = [])),
    request_body(content = AgentChangeBody, content_type = "application/json"),
    responses(
        (status = 201, description = "The agent and its key.", body = AgentWithKey),
        (status = 400, response = BadInput),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 503, response = Unavailable),
    ))]
pub async fn create_agent(
    state: web::Data<AppState>,
    op: Admin,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let change = AgentChange::parse(&json_body(payload).await?)?;
    let mut conn = state.conn().await?;
    let (agent, key, enable_change) = admin::create_agent(&mut conn, &op.actor, rule(&state), &change).await?;
    Ok(HttpResponse::Created().json(super::in_name_order(&AgentWithKey { agent, api_key: key, enable_change })))
}

/// GET /admin/agents — every agent with its limits and spend: `{"agents": [...]}`.
#[utoipa::path(get, path = "/admin/agents", tag = "admin", operation_id = "adminListAgents",
    summary = "Every agent with its limits and spend",
    description = "Viewer or admin.",
    security(("operatorToken" = [])),
    responses(
        (status = 200, description = "The agents, oldest first.", body = AgentList),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 503, response = Unavailable),
    ))]
pub async fn list_agents(state: web::Data<AppState>, _: Viewer) -> Result<HttpResponse, ApiError> {
    let mut conn = state.conn().await?;
    let agents = admin::agents(&mut conn).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok().json(super::in_name_order(&AgentList { agents })))
}

/// GET /admin/agents/{id} — one agent (404 when unknown).
#[utoipa::path(get, path = "/admin/agents/{id}", tag = "admin", operation_id = "adminShowAgent",
    summary = "One agent",
    description = "Viewer or admin.",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The agent's id (not a uuid: 404).")),
    responses(
        (status = 200, description = "The agent.", body = AdminAgent),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn show_agent(
    state: web::Data<AppState>,
    _: Viewer,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = agent_id(&id)?;
    let mut conn = state.conn().await?;
    let agent = admin::agent(&mut conn, id).await.map_err(ApiError::database)?.ok_or(ApiError::NotFound)?;
    Ok(HttpResponse::Ok().json(agent))
}

/// PATCH /admin/agents/{id} — changes name and limits (`null` removes a limit).
#[utoipa::path(patch, path = "/admin/agents/{id}", tag = "admin", operation_id = "adminUpdateAgent",
    summary = "Change an agent's name and limits",
    description = "At least one field. An `agent.update` event (before/after) in the same transaction; bad input changes nothing.",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The agent's id (not a uuid: 404).")),
    request_body(content = AgentChangeBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The agent after the change.", body = AdminAgent),
        (status = 202, description = "Under the two-person rule (`REQUIRE_SECOND_ADMIN`), a change that raises spending power: recorded as proposed, not applied; another admin confirms it (`POST /admin/changes/{id}/confirm`).", body = Proposal),
        (status = 400, response = BadInput),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn update_agent(
    state: web::Data<AppState>,
    op: Admin,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let id = agent_id(&id)?;
    let change = AgentChange::parse(&json_body(payload).await?)?;
    let mut conn = state.conn().await?;
    Ok(done(admin::update_agent(&mut conn, &op.actor, rule(&state), id, &change).await?))
}

/// POST /admin/agents/{id}/disable
#[utoipa::path(post, path = "/admin/agents/{id}/disable", tag = "admin", operation_id = "adminDisableAgent",
    summary = "Disable an agent",
    description = "Its key is refused (403 `agent_disabled`) by every router within the auth cache's window (1 s).",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The agent's id (not a uuid: 404).")),
    responses(
        (status = 200, description = "The agent.", body = AdminAgent),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn disable_agent(
    state: web::Data<AppState>,
    op: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_disabled(&state, &op, &id, true).await
}

/// POST /admin/agents/{id}/enable
#[utoipa::path(post, path = "/admin/agents/{id}/enable", tag = "admin", operation_id = "adminEnableAgent",
    summary = "Enable an agent",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The agent's id (not a uuid: 404).")),
    responses(
        (status = 200, description = "The agent.", body = AdminAgent),
        (status = 202, description = "Under the two-person rule (`REQUIRE_SECOND_ADMIN`), a change that raises spending power: recorded as proposed, not applied; another admin confirms it (`POST /admin/changes/{id}/confirm`).", body = Proposal),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn enable_agent(
    state: web::Data<AppState>,
    op: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_disabled(&state, &op, &id, false).await
}

async fn set_disabled(state: &AppState, op: &Admin, id: &str, disabled: bool) -> Result<HttpResponse, ApiError> {
    let id = agent_id(id)?;
    let mut conn = state.conn().await?;
    Ok(done(admin::set_disabled(&mut conn, &op.actor, rule(state), id, disabled).await?))
}

/// POST /admin/agents/{id}/rotate-key — a new key (shown this once); the old one is refused
/// within the auth cache's window (1 s).
#[utoipa::path(post, path = "/admin/agents/{id}/rotate-key", tag = "admin", operation_id = "adminRotateKey",
    summary = "Give an agent a new key",
    description = "The new key is shown once; the old one is refused (401) by every router within the auth cache's window (1 s).",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The agent's id (not a uuid: 404).")),
    responses(
        (status = 200, description = "The agent and its new key.", body = AgentWithKey),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn rotate_key(
    state: web::Data<AppState>,
    op: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = agent_id(&id)?;
    let mut conn = state.conn().await?;
    let (agent, key) = admin::rotate_key(&mut conn, &op.actor, id).await?;
    Ok(HttpResponse::Ok().json(super::in_name_order(&AgentWithKey { agent, api_key: key, enable_change: None })))
}

/// GET /admin/settings — pause state, the wallet-wide daily cap and what it counts, the
/// wallet-wide payTo block list.
#[utoipa::path(get, path = "/admin/settings", tag = "admin", operation_id = "adminSettings",
    summary = "Pause state, the wallet-wide daily cap and payTo block list", description = "Viewer or admin.",
    security(("operatorToken" = [])),
    responses(
        (status = 200, description = "The settings.", body = admin::RouterSettings),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 503, response = Unavailable),
    ))]
pub async fn settings(state: web::Data<AppState>, _: Viewer) -> Result<HttpResponse, ApiError> {
    let mut conn = state.conn().await?;
    Ok(HttpResponse::Ok().json(super::in_name_order(&admin::settings(&mut conn).await.map_err(ApiError::database)?)))
}

/// PATCH /admin/settings — `{"wallet_daily_cap": "…" | null, "blocked_pay_to": […] | null}`.
#[utoipa::path(patch, path = "/admin/settings", tag = "admin", operation_id = "adminUpdateSettings",
    summary = "Set or remove the wallet-wide daily cap and payTo block list",
    description = "Either member or both (absent: unchanged; null: removed). Both are enforced in the transaction that reserves each payment: the cap under one lock, so concurrent payments of all agents never exceed it; a blocked payTo is never signed for any agent (402 `payment_not_allowed`).",
    security(("operatorToken" = [])),
    request_body(content = admin::SettingsChange, content_type = "application/json"),
    responses(
        (status = 200, description = "The settings.", body = admin::RouterSettings),
        (status = 202, description = "Under the two-person rule (`REQUIRE_SECOND_ADMIN`), a change that raises spending power: recorded as proposed, not applied; another admin confirms it (`POST /admin/changes/{id}/confirm`).", body = Proposal),
        (status = 400, response = BadInput),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 503, response = Unavailable),
    ))]
pub async fn update_settings(
    state: web::Data<AppState>,
    op: Admin,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let patch = admin::parse_settings(&json_body(payload).await?)?;
    let mut conn = state.conn().await?;
    Ok(done(admin::update_settings(&mut conn, &op.actor, rule(&state), &patch).await?))
}

/// POST /admin/pause — refuses every new payment (503 `payments_paused`); with
/// `{"unpaid": true}` every new call. In-flight payments finish.
#[utoipa::path(post, path = "/admin/pause", tag = "admin", operation_id = "adminPause",
    summary = "Pause every new payment",
    description = "New payments get 503 `payments_paused` (with `Retry-After`), nothing recorded; with `unpaid: true` every new call too. Payments already in flight finish.",
    security(("operatorToken" = [])),
    request_body(content = admin::PauseRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The settings.", body = admin::RouterSettings),
        (status = 400, response = BadInput),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 503, response = Unavailable),
    ))]
pub async fn pause(state: web::Data<AppState>, op: Admin, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let body = json_body(payload).await?;
    let obj = body.as_object().ok_or_else(|| Invalid("the body must be a JSON object".into()))?;
    if let Some(other) = obj.keys().find(|k| *k != "unpaid") {
        return Err(Invalid(format!("unknown field {other:?}")).into());
    }
    let unpaid = match obj.get("unpaid") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(Invalid("unpaid must be true or false".into()).into()),
    };
    let mut conn = state.conn().await?;
    Ok(done(admin::set_paused(&mut conn, &op.actor, rule(&state), true, unpaid).await?))
}

/// DELETE /admin/pause — resumes payments and calls.
#[utoipa::path(delete, path = "/admin/pause", tag = "admin", operation_id = "adminResume",
    summary = "Resume payments and calls",
    security(("operatorToken" = [])),
    responses(
        (status = 200, description = "The settings.", body = admin::RouterSettings),
        (status = 202, description = "Under the two-person rule (`REQUIRE_SECOND_ADMIN`), a change that raises spending power: recorded as proposed, not applied; another admin confirms it (`POST /admin/changes/{id}/confirm`).", body = Proposal),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 503, response = Unavailable),
    ))]
pub async fn resume(state: web::Data<AppState>, op: Admin) -> Result<HttpResponse, ApiError> {
    let mut conn = state.conn().await?;
    Ok(done(admin::set_paused(&mut conn, &op.actor, rule(&state), false, false).await?))
}

/// POST /admin/reconcile — `{"payment_id": "…"}` for one payment, `{}` for every open one:
/// reads the chain now and records what it shows (as `x402-router reconcile` does, without
/// its grace period); answers its report.
#[utoipa::path(post, path = "/admin/reconcile", tag = "admin", operation_id = "adminReconcile",
    summary = "Reconcile payments with the chain now",
    description = "One payment (`payment_id`) or every open one, as `x402-router reconcile` without its grace period (recovery of lost answers stays with the scheduled command). Recorded as a `payments.reconcile` event.",
    security(("operatorToken" = [])),
    request_body(content = admin::ReconcileRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "What was decided.", body = ReconcileReport),
        (status = 400, response = BadInput),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn reconcile(state: web::Data<AppState>, op: Admin, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let body = json_body(payload).await?;
    let obj = body.as_object().ok_or_else(|| Invalid("the body must be a JSON object".into()))?;
    if let Some(other) = obj.keys().find(|k| *k != "payment_id") {
        return Err(Invalid(format!("unknown field {other:?}")).into());
    }
    let only = match obj.get("payment_id") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_str()
                .and_then(|s| Uuid::parse_str(s).ok())
                .ok_or_else(|| Invalid("payment_id must be a payment's uuid".into()))?,
        ),
    };
    let mut conn = state.conn().await?;
    let solana = state.solana.as_ref().map(|s| std::sync::Arc::clone(&s.rpcs));
    let report =
        admin::reconcile(&mut conn, (&state.chain, solana), state.idempotency.timing.abandon_after, &op.actor, only)
            .await?;
    Ok(HttpResponse::Ok().json(report))
}
