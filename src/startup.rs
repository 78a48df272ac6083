//! Builds the application: state, listener, HTTP server. `port()` tells which port was
//! bound (port 0 works, for tests).

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::body::MessageBody;
use actix_web::dev::{Server, ServiceRequest, ServiceResponse};
use actix_web::middleware::{Next, from_fn};
use actix_web::{App, HttpMessage, HttpServer, web};
use tracing_actix_web::TracingLogger;

use crate::config::Config;
use crate::idempotency::{Cache, FaultHook, Idempotency};
use crate::metrics::Metrics;
use crate::state::AppState;
use crate::upstream::UpstreamClient;
use crate::x402::{Chain, Supported};

/// Optional fault-injection hooks; production passes `Hooks::default()`.
#[derive(Default, Clone)]
pub struct Hooks {
    /// Runs between a lost idempotency claim and the follow-up lookup (GC-race tests).
    pub after_conflict: Option<FaultHook>,
    /// Runs at each `faults::Point` of paying and recording.
    pub at: Option<crate::faults::Hook>,
}

/// A built, not yet running, application.
pub struct Application {
    port: u16,
    server: Server,
    state: AppState,
    /// The `METRICS_ADDR` listener's port and server (already running).
    metrics: Option<(u16, actix_web::dev::ServerHandle)>,
}

impl Application {
    /// Builds state and binds the listener.
    ///
    /// # Errors
    /// Bind failure, HTTP client or metrics construction failure.
    pub fn build(config: Config, hooks: Hooks) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(config.bind)?;
        let port = listener.local_addr()?.port();
        let metrics_listener = config.metrics_addr.map(TcpListener::bind).transpose()?;
        let mut state = build_state(config, hooks)?;
        state.indexes = Arc::new(crate::chains::evm_index::Indexes::spawn(
            &state.config,
            &state.supported,
            &state.chain,
            &state.metrics,
        ));
        state.idempotency.cache.connect_in_background();
        crate::audit::balance::spawn_balance_refresh(&state);
        crate::audit::gauges::spawn_refresh(&state);
        crate::discovery::spawn_refresh(&state.discovery, &state.upstream);
        let workers = if state.config.workers == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            state.config.workers
        };
        // Fits the orchestrator's grace period (SHUTDOWN_TIMEOUT_SECS), not the route
        // deadline: a call still running at the limit is cut off, its key stays in flight
        // and a retry takes it over (payments resume from the chain, never twice).
        let shutdown = state.config.shutdown_timeout;
        let app_state = web::Data::new(state.clone());
        let self_state = state.clone();
        // One agent cache per process, shared by the workers (see auth::cache).
        let agent_cache = web::Data::new(crate::auth::AgentCache::default());
        // One MCP endpoint per process: its sessions are shared by the workers.
        let mcp = web::Data::new(crate::mcp::http::McpEndpoint::new(state.clone()));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_state.clone())
                .app_data(agent_cache.clone())
                .app_data(mcp.clone())
                .wrap(from_fn(crate::error::problem::negotiate))
                .wrap(from_fn(crate::routes::no_store))
                .wrap(from_fn(count_requests))
                // Inside the request's span (wrapped before, so it runs after TracingLogger).
                .wrap(from_fn(crate::telemetry::record_trace_id))
                .wrap(TracingLogger::default())
                .configure(crate::routes::configure)
        })
        .workers(workers)
        .shutdown_timeout(shutdown.as_secs())
        .listen(listener)?
        .run();
        let metrics = match metrics_listener {
            None => None,
            Some(listener) => {
                let metrics_port = listener.local_addr()?.port();
                let data = web::Data::new(self_state.clone());
                let server = HttpServer::new(move || {
                    App::new().app_data(data.clone()).configure(crate::routes::configure_metrics)
                })
                .workers(1)
                .disable_signals()
                .shutdown_timeout(1)
                .listen(listener)?
                .run();
                let handle = server.handle();
                tokio::spawn(server);
                Some((metrics_port, handle))
            }
        };
        Ok(Self { port, server, state, metrics })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the `METRICS_ADDR` listener, when there is one.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics.as_ref().map(|(p, _)| *p)
    }

    /// The state handlers see (tests use it to inspect the pool and config).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Runs until the server stops (SIGINT/SIGTERM: graceful, in-flight requests finish).
    ///
    /// # Errors
    /// Server I/O errors.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        if let Some((_, handle)) = self.metrics {
            handle.stop(true).await;
        }
        result
    }

    /// The server handle and future, for callers that need to stop it themselves.
    pub fn into_server(self) -> Server {
        self.server
    }
}

/// Checks the payment networks before serving. Every RPC URL that answers must serve its
/// network's chain id, else the router refuses to start with one line naming the network and
/// the URL's position (never the URL: it may carry an API key). A URL that does not answer yet
/// is logged and checked on first use (no request goes through it until it passes), so one
/// dead URL among several does not stop the router. The decimals of assets not given in
/// `X402_ASSETS` are read from the tokens; an asset whose decimals cannot be read is never
/// paid; assets of different decimals refuse to start (one budget cannot span them). The
/// symbols amounts are shown in are read last ([`read_symbols`]; never a reason to stop).
///
/// # Errors
/// A chain id mismatch, or assets of different units.
pub async fn preflight(config: &mut Config) -> anyhow::Result<()> {
    let payments = &mut config.payments;
    let chain = Chain::new(payments.rpc_urls.clone(), payments.rpc_timeout);
    let mut answering = std::collections::BTreeSet::new();
    for network in chain.networks() {
        for checked in chain.verify_chain_ids(network).await? {
            match checked {
                Ok(()) => {
                    answering.insert(network);
                }
                Err(crate::x402::ChainError::ChainIdMismatch { network, endpoint, actual }) => anyhow::bail!(
                    "X402_RPC_URLS: URL {endpoint} of {network} serves chain id {actual}, not {}; refusing to start",
                    network.chain_id()
                ),
                Err(e) => tracing::warn!(
                    error = %e,
                    "an RPC URL is not reachable at start-up; its chain id is checked before its first use"
                ),
            }
        }
    }
    let unknown: Vec<_> = payments
        .assets
        .iter()
        .flat_map(|(n, list)| list.iter().map(|a| (*n, *a)))
        .filter(|key| !payments.decimals.contains_key(key) && payments.rpc_urls.contains_key(&key.0))
        .collect();
    for (network, asset) in unknown {
        match chain.decimals(network, asset).await {
            Ok(d) => {
                payments.decimals.insert((network, asset), d);
            }
            Err(e) => tracing::error!(
                payment.network = %network, payment.asset = %asset, error = %e,
                "cannot read the asset's decimals; it will not be paid (give them in X402_ASSETS as 0x…@decimals)"
            ),
        }
    }
    payments.check_one_unit()?;
    read_symbols(&chain, payments, &answering).await;
    Ok(())
}

/// Reads the `symbol()` of each asset that has none yet (not the built-in USDC), on the
/// networks whose RPC answered. Only ever shown (`config::symbols`): one that cannot be read,
/// or is not a short plain word, leaves the asset shown by its address.
async fn read_symbols(
    chain: &Chain,
    payments: &mut crate::config::PaymentConfig,
    answering: &std::collections::BTreeSet<crate::x402::Network>,
) {
    use crate::config::symbols::shown_symbol;
    let unknown: Vec<_> = payments
        .assets
        .iter()
        .filter(|(n, _)| answering.contains(*n))
        .flat_map(|(n, list)| list.iter().map(|a| (*n, *a)))
        .filter(|key| !payments.symbols.contains_key(key))
        .collect();
    for (network, asset) in unknown {
        match chain.symbol(network, asset).await.map(|s| shown_symbol(&s)) {
            Ok(Some(symbol)) => {
                payments.symbols.insert((network, asset), symbol);
            }
            Ok(None) => tracing::warn!(
                payment.network = %network, payment.asset = %asset,
                "the asset's symbol is not a short plain word; amounts are shown without it"
            ),
            Err(e) => tracing::warn!(
                payment.network = %network, payment.asset = %asset, error = %e,
                "cannot read the asset's symbol; amounts are shown without it"
            ),
        }
    }
}

/// Connections of the heartbeat pool: one beat is one short UPDATE per running request and
/// `IDEMPOTENCY_HEARTBEAT_MS` (100 per second for 1000 running requests at the default).
const HEARTBEAT_POOL_SIZE: u32 = 2;

fn build_state(config: Config, hooks: Hooks) -> anyhow::Result<AppState> {
    crate::db::tls::install_default_crypto_provider();
    let metrics = Arc::new(Metrics::new()?);
    let pool = config.database.counted_pool(Some(metrics.db_traffic("main")));
    let heartbeat_pool = crate::config::DatabaseConfig { pool_size: HEARTBEAT_POOL_SIZE, ..config.database.clone() }
        .counted_pool(Some(metrics.db_traffic("heartbeat")));
    let cache_key = crate::idempotency::cache::mac_key(&config.signer.credential().to_bytes());
    let cache = Cache::new(config.redis.clone(), config.redis_timeout, config.redis_key_prefix.clone(), cache_key);
    let upstream = UpstreamClient::new(&config.upstream)?;
    let receipt_signer = Arc::new(config.signer.clone());
    let idempotency = Idempotency {
        cache,
        timing: config.idempotency,
        after_conflict: hooks.after_conflict,
        metrics: Arc::clone(&metrics),
    };
    let payments = &config.payments;
    let rpc_metrics = crate::x402::rpc::EndpointMetrics {
        requests: metrics.rpc_endpoint_requests.clone(),
        seconds: metrics.rpc_endpoint_seconds.clone(),
        up: metrics.rpc_endpoint_up.clone(),
    };
    let chain = Chain::with_metrics(payments.rpc_urls.clone(), payments.rpc_timeout, rpc_metrics);
    let assets = payments.assets.iter().flat_map(|(n, list)| list.iter().map(|a| (*n, *a)));
    let mut supported = Supported::new(payments.rpc_urls.keys().copied(), assets)
        .with_decimals(payments.decimals.clone())
        .with_permit2_only(payments.permit2_only.iter().copied());
    if let Some(budget) = &payments.budget {
        supported = supported.with_budget(budget.decimals, budget.values.clone());
    }
    let nonce_secret = Arc::new(crate::x402::nonce::nonce_secret(&config.signer));
    let terms = Arc::new(crate::upstream::known_terms::Terms::new(config.requirements_cache));
    let solana = match config.solana.clone() {
        Some(c) => Some(Arc::new(crate::chains::solana::Solana::new(c, payments.rpc_timeout)?)),
        None => None,
    };
    let operator_auth = Arc::new(crate::auth_throttle::AuthThrottle::new(config.operator_auth));
    let discovery = Arc::new(crate::discovery::Discovery::new(config.discovery.clone()));
    Ok(AppState {
        operator_auth,
        discovery,
        solana,
        terms,
        config: Arc::new(config),
        pool,
        heartbeat_pool,
        idempotency,
        upstream,
        receipt_signer,
        metrics,
        chain,
        supported,
        nonce_secret,
        indexes: Arc::default(),
        faults: hooks.at,
    })
}

/// Counts requests by matched route pattern and status, and returns tracing-actix-web's
/// request id as `X-Request-Id` (the same id is in every log line of the request).
async fn count_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let metrics = req.app_data::<web::Data<AppState>>().map(|s| Arc::clone(&s.metrics));
    let request_id = req.extensions().get::<tracing_actix_web::RequestId>().map(|id| id.to_string());
    let started = std::time::Instant::now();
    let mut res = next.call(req).await?;
    if let Some(id) = request_id.and_then(|id| actix_web::http::header::HeaderValue::from_str(&id).ok()) {
        res.headers_mut().insert(actix_web::http::header::HeaderName::from_static("x-request-id"), id);
    }
    if let Some(m) = metrics {
        let route = res.request().match_pattern().unwrap_or_else(|| "unmatched".to_owned());
        let status = res.status();
        let labels = [route.as_str(), status.as_str()];
        m.http_requests.with_label_values(&labels).inc();
        m.http_duration.with_label_values(&labels).observe(started.elapsed().as_secs_f64());
    }
    Ok(res)
}
