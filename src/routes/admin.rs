//! The operator's control plane over HTTP (`/admin/*`, an admin operator token). Parsing,
//! validation and the transactional writes with their audit events are `crate::admin`;
//! this only extracts, calls and shapes the JSON.

use actix_web::{HttpResponse, web};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::admin::{self, AgentChange, Invalid};
use crate::auth::{Admin, Viewer};
use crate::error::ApiError;
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

fn agent_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::NotFound)
}

/// POST /admin/agents — creates an agent: 201 `{"agent": {...}, "api_key": "x4r_…"}` (the
/// key is shown this once).
pub async fn create_agent(
    state: web::Data<AppState>,
    op: Admin,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let change = AgentChange::parse(&json_body(payload).await?)?;
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    let (agent, key) = admin::create_agent(&mut conn, &op.actor, &change).await?;
    Ok(HttpResponse::Created().json(json!({ "agent": agent, "api_key": key })))
}

/// GET /admin/agents — every agent with its limits and spend: `{"agents": [...]}`.
pub async fn list_agents(state: web::Data<AppState>, _: Viewer) -> Result<HttpResponse, ApiError> {
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    let agents = admin::agents(&mut conn).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok().json(json!({ "agents": agents })))
}

/// GET /admin/agents/{id} — one agent (404 when unknown).
pub async fn show_agent(
    state: web::Data<AppState>,
    _: Viewer,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = agent_id(&id)?;
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    let agent = admin::agent(&mut conn, id).await.map_err(ApiError::database)?.ok_or(ApiError::NotFound)?;
    Ok(HttpResponse::Ok().json(agent))
}

/// PATCH /admin/agents/{id} — changes name and limits (`null` removes a limit).
pub async fn update_agent(
    state: web::Data<AppState>,
    op: Admin,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let id = agent_id(&id)?;
    let change = AgentChange::parse(&json_body(payload).await?)?;
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    Ok(HttpResponse::Ok().json(admin::update_agent(&mut conn, &op.actor, id, &change).await?))
}

/// POST /admin/agents/{id}/disable
pub async fn disable_agent(
    state: web::Data<AppState>,
    op: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_disabled(&state, &op, &id, true).await
}

/// POST /admin/agents/{id}/enable
pub async fn enable_agent(
    state: web::Data<AppState>,
    op: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    set_disabled(&state, &op, &id, false).await
}

async fn set_disabled(state: &AppState, op: &Admin, id: &str, disabled: bool) -> Result<HttpResponse, ApiError> {
    let id = agent_id(id)?;
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    Ok(HttpResponse::Ok().json(admin::set_disabled(&mut conn, &op.actor, id, disabled).await?))
}

/// POST /admin/agents/{id}/rotate-key — a new key (shown this once); the old one is refused
/// within the auth cache's window (1 s).
pub async fn rotate_key(
    state: web::Data<AppState>,
    op: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = agent_id(&id)?;
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    let (agent, key) = admin::rotate_key(&mut conn, &op.actor, id).await?;
    Ok(HttpResponse::Ok().json(json!({ "agent": agent, "api_key": key })))
}

/// GET /admin/settings — pause state, the wallet-wide daily cap and what it counts.
pub async fn settings(state: web::Data<AppState>, _: Viewer) -> Result<HttpResponse, ApiError> {
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    Ok(HttpResponse::Ok().json(admin::settings(&mut conn).await.map_err(ApiError::database)?))
}

/// PATCH /admin/settings — `{"wallet_daily_cap": "…" | null}`.
pub async fn update_settings(
    state: web::Data<AppState>,
    op: Admin,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let cap = admin::parse_settings(&json_body(payload).await?)?;
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    Ok(HttpResponse::Ok().json(admin::set_wallet_cap(&mut conn, &op.actor, cap).await.map_err(ApiError::database)?))
}

/// POST /admin/pause — refuses every new payment (503 `payments_paused`); with
/// `{"unpaid": true}` every new call. In-flight payments finish.
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
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    Ok(HttpResponse::Ok()
        .json(admin::set_paused(&mut conn, &op.actor, true, unpaid).await.map_err(ApiError::database)?))
}

/// DELETE /admin/pause — resumes payments and calls.
pub async fn resume(state: web::Data<AppState>, op: Admin) -> Result<HttpResponse, ApiError> {
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    Ok(HttpResponse::Ok()
        .json(admin::set_paused(&mut conn, &op.actor, false, false).await.map_err(ApiError::database)?))
}

/// POST /admin/reconcile — `{"payment_id": "…"}` for one payment, `{}` for every open one:
/// reads the chain now and records what it shows (as `x402-router reconcile` does, without
/// its grace period); answers its report.
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
    let mut conn = state.pool.get().await.map_err(ApiError::pool)?;
    let report =
        admin::reconcile(&mut conn, &state.chain, state.idempotency.timing.abandon_after, &op.actor, only).await?;
    Ok(HttpResponse::Ok().json(report))
}
