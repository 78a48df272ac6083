//! THE route table. Handlers only adapt HTTP: extract, call a feature module, map.
//!
//! [`ROUTES`] lists every endpoint once; [`configure`] registers exactly that list, and a
//! test holds the OpenAPI document ([`openapi`], served at `GET /openapi.json`) to the
//! same list.

mod admin;
mod agents;
mod approvals;
mod audit;
mod changes;
mod channels;
mod console;
mod discovery;
mod health;
mod inline;
pub mod openapi;
mod operators;
mod pages;
mod receipts;
mod responses;
mod route;

use actix_web::http::{Method, StatusCode};
use actix_web::{HttpResponse, Route, web};
use futures_util::StreamExt;

pub use console::no_store;

use crate::codes::Code;
use crate::error::{ApiError, json_error};

/// Attaches an endpoint's handler to a route that already matches its method.
pub type Handler = fn(Route) -> Route;

/// Every endpoint: method, path pattern, handler.
pub const ROUTES: &[(Method, &str, Handler)] = &[
    // Agents (Authorization: Bearer x4r_…).
    (Method::POST, "/route", |r| r.to(route::route)),
    (Method::GET, "/receipts/{id}", |r| r.to(receipts::get_own)),
    (Method::GET, "/receipts", |r| r.to(agents::receipts)),
    (Method::GET, "/agents/me", |r| r.to(agents::me)),
    (Method::GET, "/payments", |r| r.to(agents::payment)),
    (Method::GET, "/discovery", |r| r.to(discovery::discover)),
    // MCP over streamable HTTP (Authorization: Bearer x4r_…).
    (Method::POST, "/mcp", |r| r.to(crate::mcp::http::mcp)),
    (Method::GET, "/mcp", |r| r.to(crate::mcp::http::mcp)),
    (Method::DELETE, "/mcp", |r| r.to(crate::mcp::http::mcp)),
    // Operators (Authorization: Bearer x4o_… or $OPERATOR_TOKEN).
    (Method::GET, "/audit/receipts", |r| r.to(audit::receipts)),
    (Method::GET, "/audit/receipts/{id}", |r| r.to(audit::receipt)),
    (Method::GET, "/audit/idempotency", |r| r.to(audit::idempotency)),
    (Method::GET, "/audit/payments", |r| r.to(audit::payments)),
    (Method::GET, "/audit/payments.csv", |r| r.to(audit::payments_csv)),
    (Method::GET, "/audit/operator-events", |r| r.to(audit::operator_events)),
    (Method::GET, "/audit/agents/{id}/spend", |r| r.to(audit::spend)),
    (Method::GET, "/audit/upto", |r| r.to(audit::upto)),
    (Method::GET, "/audit/overview", |r| r.to(console::overview)),
    (Method::GET, "/audit/whoami", |r| r.to(audit::whoami)),
    // The control plane: viewers read, admins change (Authorization: Bearer x4o_…).
    (Method::POST, "/admin/agents", |r| r.to(admin::create_agent)),
    (Method::GET, "/admin/agents", |r| r.to(admin::list_agents)),
    (Method::GET, "/admin/agents/{id}", |r| r.to(admin::show_agent)),
    (Method::PATCH, "/admin/agents/{id}", |r| r.to(admin::update_agent)),
    (Method::POST, "/admin/agents/{id}/disable", |r| r.to(admin::disable_agent)),
    (Method::POST, "/admin/agents/{id}/enable", |r| r.to(admin::enable_agent)),
    (Method::POST, "/admin/agents/{id}/rotate-key", |r| r.to(admin::rotate_key)),
    (Method::GET, "/admin/settings", |r| r.to(admin::settings)),
    (Method::PATCH, "/admin/settings", |r| r.to(admin::update_settings)),
    (Method::POST, "/admin/pause", |r| r.to(admin::pause)),
    (Method::DELETE, "/admin/pause", |r| r.to(admin::resume)),
    (Method::POST, "/admin/reconcile", |r| r.to(admin::reconcile)),
    (Method::GET, "/admin/approvals", |r| r.to(approvals::list)),
    (Method::POST, "/admin/approvals/{id}/approve", |r| r.to(approvals::approve)),
    (Method::POST, "/admin/approvals/{id}/deny", |r| r.to(approvals::deny)),
    (Method::GET, "/admin/channels", |r| r.to(channels::list)),
    (Method::POST, "/admin/channels/{id}/close", |r| r.to(channels::close)),
    (Method::GET, "/admin/changes", |r| r.to(changes::list)),
    (Method::POST, "/admin/changes/{id}/confirm", |r| r.to(changes::confirm)),
    (Method::POST, "/admin/changes/{id}/reject", |r| r.to(changes::reject)),
    // Operator tokens: admins only, listing included.
    (Method::POST, "/admin/operators", |r| r.to(operators::create)),
    (Method::GET, "/admin/operators", |r| r.to(operators::list)),
    (Method::DELETE, "/admin/operators/{id}", |r| r.to(operators::revoke)),
    // Any operator token (Prometheus without one: the METRICS_ADDR listener).
    (Method::GET, "/metrics", |r| r.to(health::metrics)),
    // Anyone.
    (Method::GET, "/healthz", |r| r.to(health::healthz)),
    (Method::GET, "/readyz", |r| r.to(health::readyz)),
    (Method::GET, "/.well-known/x402-router", |r| r.to(health::well_known)),
    (Method::GET, "/openapi.json", |r| r.to(openapi)),
];

/// Registers every endpoint of [`ROUTES`]; anything else is a JSON 404.
pub fn configure(cfg: &mut web::ServiceConfig) {
    for (method, path, handler) in ROUTES {
        cfg.route(path, handler(web::route().method(method.clone())));
    }
    // The operator console's page and files: not API endpoints, so not in ROUTES or the
    // OpenAPI document.
    cfg.route("/console", web::get().to(console::index));
    cfg.route("/console/", web::get().to(console::index));
    cfg.route("/console/{file}", web::get().to(console::file));
    cfg.default_service(web::to(not_found));
}

/// The `METRICS_ADDR` listener: `GET /metrics` without authentication, nothing else.
pub fn configure_metrics(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(health::metrics_open));
    cfg.default_service(web::to(not_found));
}

/// A body as the `json!` bodies always were on the wire: through a `serde_json::Value`, so
/// its members are in name order whatever the order of the type's fields.
pub(crate) fn in_name_order<T: serde::Serialize>(body: &T) -> serde_json::Value {
    serde_json::to_value(body).unwrap_or_else(|_| serde_json::Value::Object(serde_json::Map::new()))
}

/// GET /openapi.json — the API description, generated by [`openapi`].
#[utoipa::path(get, path = "/openapi.json", tag = "public", operation_id = "openapi", summary = "This document",
    responses((status = 200, description = "OpenAPI 3.1 document.", body = Object)))]
async fn openapi() -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(openapi::json())
}

/// Reads the request body, refusing more than `limit` bytes with a JSON 413.
pub(crate) async fn read_limited(mut payload: web::Payload, limit: usize) -> Result<web::Bytes, ApiError> {
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

async fn not_found() -> HttpResponse {
    json_error(StatusCode::NOT_FOUND, Code::NotFound, "not found")
}
