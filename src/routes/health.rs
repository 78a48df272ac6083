//! Health, readiness, metrics and the public router description.

use actix_web::{HttpResponse, web};
use diesel_async::RunQueryDsl;
use serde_json::json;

use crate::state::AppState;

/// GET /healthz — the process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// GET /readyz — Postgres is required (503 without it); Redis is reported only.
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let postgres = match state.pool.get().await {
        Ok(mut conn) => diesel::sql_query("SELECT 1").execute(&mut conn).await.is_ok(),
        Err(_) => false,
    };
    let redis = state.idempotency.cache.ping().await;
    let body = json!({
        "status": if postgres { if redis { "ready" } else { "degraded" } } else { "unavailable" },
        "postgres": if postgres { "ok" } else { "unreachable" },
        "redis": if redis { "ok" } else { "unreachable" },
    });
    if postgres { HttpResponse::Ok().json(body) } else { HttpResponse::ServiceUnavailable().json(body) }
}

/// GET /metrics — Prometheus text format.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.metrics.render())
}

/// GET /.well-known/x402-router — the receipt signer, version and payable networks.
pub async fn well_known(state: web::Data<AppState>) -> HttpResponse {
    let payments = &state.config.payments;
    let networks: Vec<_> = payments
        .rpc_urls
        .keys()
        .map(|n| json!({ "network": n.caip2(), "assets": payments.assets.get(n).cloned().unwrap_or_default() }))
        .collect();
    HttpResponse::Ok().json(json!({
        "name": "x402-router",
        "version": env!("CARGO_PKG_VERSION"),
        "receipt_signer": state.receipt_signer.address().to_checksum(None),
        "payer": state.config.signer.address().to_checksum(None),
        "x402_versions": [1, 2],
        "schemes": ["exact"],
        "networks": networks,
    }))
}
