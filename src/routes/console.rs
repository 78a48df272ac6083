//! `GET /console` and its embedded files (`crate::console`), with the console's security
//! headers, and `GET /audit/overview`, the one read-only aggregate the console needs beyond
//! the audit API (behind the operator token like the rest of `/audit/*`).

use actix_web::{HttpResponse, HttpResponseBuilder, web};

use crate::auth::Viewer;
use crate::console::{Asset, INDEX, SECURITY_HEADERS, asset};
use crate::error::{ApiError, PoolConn};
use crate::state::AppState;

/// GET /audit/overview — calls, paid calls, payments and settled payments per hour (24 h)
/// and per day (30 d), money moved per asset, and the paid-not-served, stuck and pending
/// counts (`audit::overview`).
#[utoipa::path(get, path = "/audit/overview", tag = "audit", operation_id = "auditOverview",
    summary = "The operator console's overview: activity per hour and per day, money moved, queues",
    security(("operatorToken" = [])),
    responses(
        (status = 200, description = "24 hourly and 30 daily buckets (with the amount settled per asset and the paid-not-served and stuck counts of each) (UTC, oldest first, empty ones as zeros), money moved per asset, and the paid-not-served, stuck and settlement-pending counts.",
            body = crate::audit::overview::Overview),
        (status = 401, response = crate::routes::responses::Unauthorized),
        (status = 403, response = crate::routes::responses::ForbiddenAgentKey),
        (status = 404, response = crate::routes::responses::AuditDisabledOrNotFound),
        (status = 503, response = crate::routes::responses::Unavailable),
    ))]
pub async fn overview(state: web::Data<AppState>, _: Viewer) -> Result<HttpResponse, ApiError> {
    let mut conn = state.conn().await?;
    let o = crate::audit::overview::overview(&mut conn).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok().json(o))
}

fn serve(a: Asset) -> HttpResponse {
    let mut resp = HttpResponseBuilder::new(actix_web::http::StatusCode::OK);
    for (name, value) in SECURITY_HEADERS {
        resp.insert_header((*name, *value));
    }
    resp.content_type(a.content_type).body(a.body)
}

/// GET /console — the console page.
pub async fn index() -> HttpResponse {
    serve(INDEX)
}

/// GET /console/{file} — one of the page's embedded files (404 for any other name).
pub async fn file(name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    asset(&name).map(serve).ok_or(ApiError::NotFound)
}

/// Middleware: `Cache-Control: no-store` on every response that does not set its own, so that
/// no browser or proxy keeps operator or agent data (the console's own files set it too).
///
/// # Errors
/// Only those of the wrapped service.
pub async fn no_store(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    use actix_web::http::header::{CACHE_CONTROL, HeaderValue};
    let mut res = next.call(req).await?;
    if !res.headers().contains_key(CACHE_CONTROL) {
        res.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    Ok(res)
}
