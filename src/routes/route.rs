//! `POST /route`.

use actix_web::http::StatusCode;
use actix_web::http::header::ContentType;
use actix_web::{HttpRequest, HttpResponse, web};
use futures_util::StreamExt;

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
    let raw = read_limited(payload, state.config.request_max_bytes).await?;
    let call = RouteCall::parse(&raw, req.path(), req.query_string())?;
    let answer = relay::handle(&state, agent.id, key, call).await?;
    Ok(respond(answer))
}

/// Reads the request body, refusing more than `limit` bytes with a JSON 413.
async fn read_limited(mut payload: web::Payload, limit: usize) -> Result<web::Bytes, ApiError> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadRequest(format!("could not read the request body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
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
