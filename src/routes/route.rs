//! `POST /route`.

use actix_web::http::StatusCode;
use actix_web::http::header::ContentType;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::auth::AuthenticatedAgent;
use crate::error::ApiError;
use crate::idempotency::IdempotencyKey;
use crate::relay::envelope_doc::{
    PaymentDeclinedDoc as PaymentDeclined, RouteEnvelopeDoc as RouteEnvelope, RouteErrorDoc as RouteError,
};
use crate::relay::request::RawRouteRequest as RouteRequest;
use crate::relay::{self, RouteResponse, request::Incoming};
use crate::routes::inline::{
    PayloadTooLarge, RateLimited, ReplayTrue, RouteBadRequest, RouteConflict, RouteForbidden, RouteHeld,
    RouteUnavailable, Seconds,
};
use crate::routes::responses::Unauthorized;
use crate::state::AppState;

/// POST /route — route one call to an upstream, paying if needed, at most once per
/// (agent, Idempotency-Key).
#[utoipa::path(post, path = "/route", tag = "agent", operation_id = "route",
    summary = "Route one call to an upstream, paying its x402 price if needed",
    description = "Executes the described upstream request (an HTTP request, or with `mcp` a tool call on an MCP server, paid with x402 over MCP) at most once per (agent, `Idempotency-Key`). A retry with the same key and the same request replays the stored answer (`X-Idempotent-Replay: true`), whether it was completed or errored; nothing is executed or paid again. The request is fingerprinted as the sha256 of the RFC 8785 (JCS) form of `{\"body\", \"path\", \"query\"}`; bodies that JCS could not keep distinct (duplicate keys, invalid Unicode, numbers a double cannot hold exactly) are refused with 400.",
    security(("agentKey" = [])),
    params(("Idempotency-Key" = String, Header, min_length = 16, max_length = 128, pattern = "^[!-~]{16,128}$",
        description = "16–128 visible ASCII characters (0x21–0x7E); one key per logical call.")),
    request_body(content = RouteRequest, example = json!({
        "url": "https://api.example.com/forecast?city=Paris",
        "method": "GET",
        "headers": { "accept": "application/json" },
        "max_amount": "50000"
    })),
    responses(
        (status = 200, description = "The upstream answered with a status below 500 (unpaid, or paid and answered). The key is `completed`.",
            body = RouteEnvelope, headers(("X-Receipt-Id" = Uuid, description = "The receipt of this call."), ("X-Idempotent-Replay" = inline(ReplayTrue), description = "`true` when this is the stored answer of an earlier request with the same key."))),
        (status = 202, description = "The price is above the agent's `approval_above`: the payment waits for an operator (`approval_pending`, with `approval`: its terms, id and the key); nothing was signed or recorded. Retry the same key after `Retry-After`: 202 until decided, then the call's answer.",
            body = inline(RouteHeld), headers(("Retry-After" = inline(Seconds)))),
        (status = 400, description = "Invalid JSON (incl. duplicate keys, imprecise numbers), url, method, header or amount; a forbidden upstream address; or a missing/malformed `Idempotency-Key` (`Idempotency-Key header required (16–128 chars)`). Nothing is written.",
            body = inline(RouteBadRequest)),
        (status = 401, response = Unauthorized),
        (status = 402, description = "The upstream asks for a payment the router will not make (over `max_amount` or the agent's limits; no supported scheme, network or asset). Nothing was signed. The key is `completed`.",
            body = PaymentDeclined, headers(("X-Receipt-Id" = Uuid, description = "The receipt of this call."), ("X-Idempotent-Replay" = inline(ReplayTrue), description = "`true` when this is the stored answer of an earlier request with the same key."))),
        (status = 403, description = "The agent is disabled (`agent_disabled`), or the upstream's host is not on its allowlist (`upstream_not_allowed`); nothing was written or sent. Or an operator denied the payment held for approval (`approval_denied`), or nobody decided in time (`approval_expired`): nothing was signed.",
            body = inline(RouteForbidden)),
        (status = 409, description = "Either `Idempotency-Key reused with different body`, or `Original request still in flight; retry shortly` (with `Retry-After: 5`), or this attempt was superseded by a retry of the same key. Or (`already_paid`) the same request was paid before under this key, which had expired: nothing is paid again.",
            body = inline(RouteConflict), headers(("Retry-After" = inline(Seconds), description = "Seconds to wait (in-flight case)."))),
        (status = 413, description = "The request body exceeds `REQUEST_MAX_BYTES`.", body = inline(PayloadTooLarge)),
        (status = 429, description = "The agent's calls or payments per minute are used up (`rate_limited`); nothing was recorded. Retry the same key after `Retry-After`.",
            body = inline(RateLimited), headers(("Retry-After" = inline(Seconds)))),
        (status = 502, description = "The upstream answered 5xx, was unreachable, sent an invalid 402, refused the payment, or settled and then lost its answer. The key is `errored` and replays this answer.",
            body = RouteError, headers(("X-Receipt-Id" = Uuid, description = "The receipt of this call."), ("X-Idempotent-Replay" = inline(ReplayTrue), description = "`true` when this is the stored answer of an earlier request with the same key."))),
        (status = 503, description = "Postgres (`database_unavailable`) or, on a takeover, the chain (`payment_network_unavailable`) cannot be read, or an operator paused payments (`payments_paused`); nothing was executed or paid. Retry the same key after `Retry-After`.",
            body = inline(RouteUnavailable), headers(("Retry-After" = inline(Seconds)))),
        (status = 504, description = "The upstream or the route deadline timed out. The key is `errored`.",
            body = RouteError, headers(("X-Idempotent-Replay" = inline(ReplayTrue), description = "`true` when this is the stored answer of an earlier request with the same key."))),
    ))]
pub async fn route(
    state: web::Data<AppState>,
    agent: AuthenticatedAgent,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let key = IdempotencyKey::parse(req.headers().get("idempotency-key").map(|v| v.as_bytes()))?;
    let raw = super::read_limited(payload, state.config.request_max_bytes).await?;
    let incoming = Incoming { raw: &raw, path: req.path(), query: req.query_string() };
    let answer = match relay::handle(&state, (agent.id, &agent.key_hash), key, incoming).await {
        Ok(answer) => answer,
        // A payment held for an operator's approval is an answer the agent expects (202, or
        // 403 once decided), not an error of the router: answered without the error log line.
        Err(held @ relay::Error::Held(_)) => {
            use actix_web::ResponseError;
            return Ok(ApiError::from(held).error_response());
        }
        Err(e) => return Err(e.into()),
    };
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
