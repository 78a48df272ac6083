//! `POST /route`.

use actix_web::http::StatusCode;
use actix_web::http::header::ContentType;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::auth::AuthenticatedAgent;
use crate::error::ApiError;
use crate::idempotency::IdempotencyKey;
use crate::relay::{self, RouteResponse, request::RouteCall};
use crate::state::AppState;

/// POST /route — route one call to an upstream, paying if needed, at most once per
/// (agent, Idempotency-Key).
pub async fn route(
    state: web::Data<AppState>,
    agent: AuthenticatedAgent,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let key = IdempotencyKey::parse(req.headers().get("idempotency-key").map(|v| v.as_bytes()))?;
    let raw = super::read_limited(payload, state.config.request_max_bytes).await?;
    let call = RouteCall::parse(&raw, req.path(), req.query_string())?;
    let answer = relay::handle(&state, agent.id, key, call).await?;
    Ok(respond(answer))
}

fn respond(answer: RouteResponse) -> HttpResponse {
    let status = StatusCode::from_u16(answer.http_status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut resp = HttpResponse::build(status);
    if let Some(id) = answer.receipt_id {
        resp.insert_header(("X-Receipt-Id", id.to_string()));
    }
    if answer.replay {
        resp.insert_header(("X-Idempotent-Replay", "true"));
    }
    resp.content_type(ContentType::json()).body(answer.body)
}
