//! Health, readiness, metrics and the public router description.

use actix_web::{HttpResponse, web};
use diesel_async::RunQueryDsl;
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::auth::Viewer;
use crate::routes::responses::{ForbiddenAgentKey, Unauthorized, Unavailable};
use crate::state::AppState;

/// The body of `GET /healthz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: Up,
}

/// The only answer of `/healthz`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Up {
    /// The process answers.
    Ok,
}

/// GET /healthz — the process is up.
#[utoipa::path(get, path = "/healthz", tag = "public", operation_id = "healthz", summary = "The process is up",
    responses((status = 200, description = "Up.", body = Health)))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: Up::Ok })
}

/// The body of `GET /readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready` (Postgres and Redis), `degraded` (Postgres only) or `unavailable` (no Postgres).
    pub status: ReadyStatus,
    /// Whether Postgres answers.
    pub postgres: Reach,
    /// Whether Redis answers.
    pub redis: Reach,
}

/// The router's readiness.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReadyStatus {
    /// Postgres and Redis answer.
    Ready,
    /// Postgres answers, Redis does not.
    Degraded,
    /// Postgres does not answer.
    Unavailable,
}

/// Whether a dependency answers.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Reach {
    /// It answers.
    Ok,
    /// It does not.
    Unreachable,
}

impl Reach {
    fn of(up: bool) -> Self {
        if up { Self::Ok } else { Self::Unreachable }
    }
}

/// GET /readyz — Postgres is required (503 without it); Redis is reported only.
#[utoipa::path(get, path = "/readyz", tag = "public", operation_id = "readyz",
    summary = "Readiness: Postgres required, Redis reported",
    responses(
        (status = 200, description = "Postgres reachable (`ready`, or `degraded` without Redis).", body = Readiness),
        (status = 503, description = "Postgres unreachable.", body = Readiness),
    ))]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let postgres = match state.pool.get().await {
        Ok(mut conn) => diesel::sql_query("SELECT 1").execute(&mut conn).await.is_ok(),
        Err(_) => false,
    };
    let redis = state.idempotency.cache.ping().await;
    let status = match (postgres, redis) {
        (true, true) => ReadyStatus::Ready,
        (true, false) => ReadyStatus::Degraded,
        (false, _) => ReadyStatus::Unavailable,
    };
    let body = Readiness { status, postgres: Reach::of(postgres), redis: Reach::of(redis) };
    if postgres { HttpResponse::Ok().json(body) } else { HttpResponse::ServiceUnavailable().json(body) }
}

/// GET /metrics — Prometheus text format, for operators (any operator token). Prometheus
/// without a token scrapes the `METRICS_ADDR` listener instead ([`metrics_open`]).
#[utoipa::path(get, path = "/metrics", tag = "audit", operation_id = "metrics", summary = "Prometheus metrics",
    description = "Every metric is prefixed `x402_router_` (and the `process_*` metrics). On the main listener this needs an operator token; `METRICS_ADDR` (e.g. `127.0.0.1:9464`) serves the same text without authentication on a listener of its own, for Prometheus on a private interface.",
    security(("operatorToken" = [])),
    responses(
        (status = 200, description = "Prometheus text format 0.0.4: requests, idempotency outcomes, payments, upstream and RPC latency.",
            body = String, content_type = "text/plain"),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 503, response = Unavailable),
    ))]
pub async fn metrics(state: web::Data<AppState>, _: Viewer) -> HttpResponse {
    metrics_open(state).await
}

/// GET /metrics on the `METRICS_ADDR` listener: no authentication (bind it to a private
/// interface). The metrics carry no secret, but label agents by id (the budget gauge).
pub async fn metrics_open(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.metrics.render())
}

/// GET /.well-known/x402-router — the receipt signer, version, and what this router pays
/// with, from its configuration: every payable `(network, asset)` (an RPC URL, an asset of the
/// router's unit), with its decimals, the asset transfer methods it signs (`eip3009` unless
/// the asset is marked `+permit2`; `permit2` always), the schemes (`exact`; `upto`, which is
/// Permit2 only) and the x402 versions (1 only where the network has a v1 name and the asset
/// EIP-3009: v1 carries neither Permit2 nor `upto`).
pub async fn well_known(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(describe(&state))
}

/// The body of `/.well-known/x402-router`.
fn describe(state: &AppState) -> serde_json::Value {
    let supported = &state.supported;
    let unit = supported.unit();
    let mut networks: std::collections::BTreeMap<_, Vec<serde_json::Value>> = std::collections::BTreeMap::new();
    for (network, asset) in supported.payable_assets() {
        let decimals = supported.decimals(network, asset);
        if unit.is_none() || decimals != unit {
            continue; // never paid: its decimals are unknown or not the router's unit
        }
        let eip3009 = !supported.is_permit2_only(network, asset);
        let methods: Vec<&str> = if eip3009 { vec!["eip3009", "permit2"] } else { vec!["permit2"] };
        let versions: Vec<u8> = if eip3009 && network.v1_name().is_some() { vec![1, 2] } else { vec![2] };
        networks.entry(network).or_default().push(json!({
            "asset": asset.to_checksum(None),
            "decimals": decimals,
            "asset_transfer_methods": methods,
            "schemes": ["exact", "upto"],
            "x402_versions": versions,
        }));
    }
    let any = |f: &dyn Fn(&serde_json::Value) -> bool| networks.values().flatten().any(f);
    let has = |field: &str, v: serde_json::Value| any(&|a| a[field].as_array().is_some_and(|l| l.contains(&v)));
    let x402_versions: Vec<u8> = [1u8, 2].into_iter().filter(|v| has("x402_versions", json!(v))).collect();
    let schemes: Vec<&str> = ["exact", "upto"].into_iter().filter(|s| has("schemes", json!(s))).collect();
    let methods: Vec<&str> =
        ["eip3009", "permit2"].into_iter().filter(|m| has("asset_transfer_methods", json!(m))).collect();
    let networks: Vec<_> = networks
        .into_iter()
        .map(|(n, assets)| json!({ "network": n.caip2(), "v1_name": n.v1_name(), "assets": assets }))
        .collect();
    json!({
        "name": "x402-router",
        "version": env!("CARGO_PKG_VERSION"),
        "receipt_signer": state.receipt_signer.address().to_checksum(None),
        "payer": state.config.signer.address().to_checksum(None),
        "x402_versions": x402_versions,
        "schemes": schemes,
        "asset_transfer_methods": methods,
        "networks": networks,
    })
}
