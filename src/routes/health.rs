//! Health, readiness, metrics and the public router description.

use actix_web::{HttpResponse, web};
use diesel_async::RunQueryDsl;
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Viewer;
use crate::routes::inline::Address;
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
    HttpResponse::Ok().json(super::in_name_order(&Health { status: Up::Ok }))
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
    let body = super::in_name_order(&body);
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
#[utoipa::path(get, path = "/.well-known/x402-router", tag = "public", operation_id = "wellKnown",
    summary = "Receipt signer, payer, version, networks and assets",
    description = "`receipt_signer` is the address that signs receipts: verify receipts against it, not only against their own `signer` member.",
    responses((status = 200, description = "The router's public description.", body = RouterDescription)))]
pub async fn well_known(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(super::in_name_order(&describe(&state)))
}

/// How the router pays an asset (`/.well-known/x402-router`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TransferMethod {
    /// EIP-3009 `transferWithAuthorization`.
    Eip3009,
    /// A Permit2 signature transfer.
    Permit2,
    /// Solana: an SPL `TransferChecked` in a transaction the router signs as the token owner
    /// (the upstream's facilitator pays the fees).
    Spl,
}

/// An x402 payment scheme the router pays with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// The exact amount asked.
    Exact,
    /// Up to the amount asked (Permit2 only).
    Upto,
}

/// The body of `GET /.well-known/x402-router`: what the running router pays with, derived
/// from its configuration: payable (network, asset) pairs of the router's unit.
#[derive(Debug, Serialize, ToSchema)]
pub struct RouterDescription {
    /// Always `x402-router`.
    pub name: &'static str,
    /// The router's version.
    pub version: &'static str,
    /// The address that signs receipts: verify receipts against it, not only against their
    /// own `signer` member.
    #[schema(value_type = Address)]
    pub receipt_signer: String,
    /// The router's wallet.
    #[schema(value_type = Address)]
    pub payer: String,
    /// The router's Solana wallet (the token owner of its Solana payments), when it pays on Solana.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Address>)]
    pub solana_payer: Option<String>,
    /// Versions some payable asset can be paid in (1 only for EIP-3009 assets on networks with
    /// a v1 name).
    #[schema(value_type = Vec<u8>)]
    pub x402_versions: Vec<u8>,
    /// The schemes some payable asset can be paid with.
    pub schemes: Vec<Scheme>,
    /// The transfer methods some payable asset can be paid with.
    pub asset_transfer_methods: Vec<TransferMethod>,
    /// Every network with a payable asset.
    pub networks: Vec<NetworkDescription>,
    /// The unit of every amount the router keeps (prices, caps, budgets): the decimals that
    /// every payable asset shares, and their symbol when they all have the same one; with a
    /// budget currency (`BUDGET_CURRENCY`), its decimals and name. `null` when the router pays
    /// with nothing.
    #[schema(required = true)]
    pub unit: Option<UnitDescription>,
}

/// The router's unit: what its atomic amounts (caps, budgets, payments) count.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnitDescription {
    /// An amount of `10^decimals` atomic units is one token.
    pub decimals: u8,
    /// The symbol of every payable asset, when they share one (e.g. `USDC`), or the budget
    /// currency (e.g. `USD`); else `null`.
    #[schema(required = true)]
    pub symbol: Option<String>,
}

/// A network the router pays on.
#[derive(Debug, Serialize, ToSchema)]
pub struct NetworkDescription {
    /// CAIP-2.
    pub network: String,
    /// The x402 v1 name of the network, if it has one.
    pub v1_name: Option<&'static str>,
    /// Its payable assets.
    pub assets: Vec<AssetDescription>,
}

/// An asset the router pays with on a network.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssetDescription {
    /// The token contract (EVM) or mint (Solana).
    #[schema(value_type = Address)]
    pub asset: String,
    /// Its decimals (the router's unit).
    pub decimals: u8,
    /// Its symbol, only ever shown (`USDC` for Circle's USDC, else the token's own
    /// `symbol()` read at start-up when it is a short plain word); `null` when unknown.
    #[schema(required = true)]
    pub symbol: Option<String>,
    /// How the router transfers it (`eip3009` unless the asset is Permit2-only).
    pub asset_transfer_methods: Vec<TransferMethod>,
    /// The schemes it is paid with.
    pub schemes: Vec<Scheme>,
    /// The x402 versions it is paid in.
    pub x402_versions: Vec<u8>,
}

/// The body of `/.well-known/x402-router`.
fn describe(state: &AppState) -> RouterDescription {
    let supported = &state.supported;
    let unit = supported.unit();
    let mut networks: std::collections::BTreeMap<_, Vec<AssetDescription>> = std::collections::BTreeMap::new();
    for (network, asset) in supported.payable_assets() {
        let decimals = supported.decimals(network, asset);
        let Some(decimals) = decimals.filter(|_| supported.rate(network, asset).is_some()) else {
            continue; // never paid: its decimals are unknown, not the router's unit, or it has no value
        };
        let eip3009 = !supported.is_permit2_only(network, asset);
        let methods = if eip3009 {
            vec![TransferMethod::Eip3009, TransferMethod::Permit2]
        } else {
            vec![TransferMethod::Permit2]
        };
        let versions: Vec<u8> = if eip3009 && network.v1_name().is_some() { vec![1, 2] } else { vec![2] };
        networks.entry(network).or_default().push(AssetDescription {
            asset: asset.to_checksum(None),
            decimals,
            symbol: state.config.payments.symbols.get(&(network, asset)).cloned(),
            asset_transfer_methods: methods,
            schemes: vec![Scheme::Exact, Scheme::Upto],
            x402_versions: versions,
        });
    }
    let mut networks: Vec<NetworkDescription> = networks
        .into_iter()
        .map(|(n, assets)| NetworkDescription { network: n.caip2(), v1_name: n.v1_name(), assets })
        .collect();
    if let Some(solana) = state.solana.as_deref() {
        let unit_ok = unit.is_none_or(|u| u == solana.config.unit);
        for (network, config) in solana.config.networks.iter().filter(|_| unit_ok) {
            let versions: Vec<u8> = if network.v1_name().is_some() { vec![1, 2] } else { vec![2] };
            let assets = config
                .mints
                .iter()
                .map(|(mint, decimals)| AssetDescription {
                    asset: mint.to_string(),
                    decimals: *decimals,
                    symbol: solana.config.symbol(network, mint),
                    asset_transfer_methods: vec![TransferMethod::Spl],
                    schemes: vec![Scheme::Exact],
                    x402_versions: versions.clone(),
                })
                .collect();
            networks.push(NetworkDescription { network: network.caip2(), v1_name: network.v1_name(), assets });
        }
    }
    let assets = || networks.iter().flat_map(|n| &n.assets);
    let x402_versions: Vec<u8> =
        [1u8, 2].into_iter().filter(|v| assets().any(|a| a.x402_versions.contains(v))).collect();
    let schemes: Vec<Scheme> =
        [Scheme::Exact, Scheme::Upto].into_iter().filter(|s| assets().any(|a| a.schemes.contains(s))).collect();
    let methods: Vec<TransferMethod> = [TransferMethod::Eip3009, TransferMethod::Permit2, TransferMethod::Spl]
        .into_iter()
        .filter(|m| assets().any(|a| a.asset_transfer_methods.contains(m)))
        .collect();
    // With a budget currency, amounts the router keeps (caps, budgets) are counted in it.
    let unit = match &state.config.payments.budget {
        Some(b) => Some(UnitDescription { decimals: b.decimals, symbol: Some(b.currency.clone()) }),
        None => unit_of(assets()),
    };
    RouterDescription {
        name: "x402-router",
        version: env!("CARGO_PKG_VERSION"),
        receipt_signer: state.receipt_signer.address().to_checksum(None),
        payer: state.config.signer.address().to_checksum(None),
        solana_payer: state.solana.as_ref().map(|s| s.config.signer.address().to_string()),
        x402_versions,
        schemes,
        asset_transfer_methods: methods,
        networks,
        unit,
    }
}

/// The unit of `assets` (all of the router's unit): their decimals, and their symbol when
/// every one has the same.
fn unit_of<'a>(mut assets: impl Iterator<Item = &'a AssetDescription>) -> Option<UnitDescription> {
    let first = assets.next()?;
    let mut symbol = first.symbol.clone();
    for a in assets {
        if a.symbol != symbol {
            symbol = None;
        }
    }
    Some(UnitDescription { decimals: first.decimals, symbol })
}
