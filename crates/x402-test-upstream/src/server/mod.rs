//! `serve`: the x402 resource server (routes.rs: the route table; paid.rs: the paid steps;
//! respond.rs: plain answers and query parsing). [`ROUTES`] is the route table; each paid route runs the
//! same steps (402 without a payment header, decode, match the offer, verify, then its
//! [`Behaviour`]), rendered in the v1 or v2 wire format.
//!
//! Settlements run in a spawned task, so a client that hangs up mid-request does not cancel a
//! transfer that was already decided (an Express server, like the official one, does not cancel
//! its handlers either); the counters in `/_stats` are updated by that task.

use std::io::Write;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::web::{self};
use actix_web::{App, HttpServer};
use alloy::primitives::{Address, U256, address};
use alloy::sol_types::{Eip712Domain, SolCall};
use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::chain::{Chain, ITestToken};
use crate::cli::ServeArgs;
use crate::payment::{Facilitator, Offer, SignedAuthorization};
use crate::stats::Stats;
use crate::wire::{self};

mod hoard;
mod paid_routes;
mod pending_routes;
mod permit2_routes;
mod pid_cache;
mod respond;
mod routes;
mod siwx;

use hoard::settle_kept;
use paid_routes::*;
use respond::*;
pub use routes::*;

/// Asset of the `/v2/multi` entry that no token here answers for.
const FOREIGN_ASSET: Address = address!("0x000000000000000000000000000000000000dEaD");
/// Default and largest `?seconds=` of the slow routes.
const DEFAULT_SECONDS: u64 = 5;
const MAX_SECONDS: u64 = 3600;

/// Settings shared by every worker.
#[derive(Debug)]
struct Settings {
    network: String,
    network_v1: String,
    token: Address,
    /// A token without EIP-3009 (`/v2/permit2?token=plain`), if given.
    plain_token: Option<Address>,
    /// A token with EIP-2612 and without EIP-3009 (`/v2/permit2?token=permit`), if given.
    permit_token: Option<Address>,
    pay_to: Address,
    price: U256,
    echo_price: U256,
    max_timeout_seconds: u64,
    token_name: String,
    token_version: String,
}

#[derive(Clone)]
struct AppState {
    settings: Arc<Settings>,
    facilitator: Facilitator,
    stats: Stats,
    /// Authorizations kept by the hostile routes, submitted by `POST /_settle_kept`.
    kept: Arc<Mutex<Vec<SignedAuthorization>>>,
    /// 402s served by `/v2/reprice` (its price grows with each).
    reprices: Arc<std::sync::atomic::AtomicU64>,
    /// The payment-identifier response cache of `/v2/pid` (shared by all workers).
    pid_cache: pid_cache::PidCache,
    /// Sign-in-with-x challenges and payers of `/v2/siwx` and `/v2/pid-siwx`.
    siwx: siwx::SiwxState,
    /// Query parameters every paid request gets before its own (`POST /_defaults`), so a test
    /// can change what one exact URL does (its price, `keep`, `free`, `hold`) between calls.
    defaults: Arc<std::sync::Mutex<String>>,
}

impl AppState {
    /// The query string a paid route reads for `req`: the defaults, then the request's own
    /// parameters (read later, so they win).
    fn query_of(&self, req: &actix_web::HttpRequest) -> String {
        let defaults = self.defaults.lock().map(|d| d.clone()).unwrap_or_default();
        if defaults.is_empty() { req.query_string().to_owned() } else { format!("{defaults}&{}", req.query_string()) }
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let chain_id = chain_id_of(&args.network)?;
    let network_v1 = match args.network_v1.clone() {
        Some(name) => name,
        None => v1_network_name(chain_id)
            .with_context(|| format!("no known x402 v1 name for chain {chain_id}; pass --network-v1"))?
            .to_owned(),
    };
    let rpc_timeout = Duration::from_secs(args.rpc_timeout_seconds.max(1));
    let settle_timeout = Duration::from_secs(args.settle_timeout_seconds.max(1));
    let signer = args.facilitator_key.0.clone();

    let chain = Chain::connect(args.rpc_url.clone(), signer.clone(), rpc_timeout);
    let domain = token_domain(&chain, &args, chain_id).await?;
    let eip712 = Eip712Domain::new(
        Some(domain.name.clone().into()),
        Some(domain.version.clone().into()),
        Some(domain.chainId),
        Some(args.token),
        None,
    );

    let settings = Arc::new(settings_of(&args, network_v1, domain));
    let permit2_paths = [permit2_routes::PERMIT2_PATH, permit2_routes::UPTO_PATH];
    let stats = Stats::with_routes(ROUTES.iter().map(|r| r.path).chain(permit2_paths));
    let send_lock = Arc::new(Mutex::new(()));
    tracing::info!(
        network = %settings.network,
        token = %settings.token,
        pay_to = %settings.pay_to,
        facilitator = %chain.sender(),
        price = %settings.price,
        "x402 test upstream configured"
    );

    let rpc_url = args.rpc_url.clone();
    let kept = Arc::new(Mutex::new(Vec::new()));
    let reprices = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let pid_cache = pid_cache::PidCache::default();
    let siwx_state = siwx::SiwxState::default();
    let defaults = Arc::new(std::sync::Mutex::new(String::new()));
    let server = HttpServer::new(move || {
        // One provider per worker: its connection pool lives on that worker's runtime.
        let chain = Chain::connect(rpc_url.clone(), signer.clone(), rpc_timeout);
        let facilitator = Facilitator::new(
            chain,
            settings.token,
            settings.network.clone(),
            eip712.clone(),
            settle_timeout,
            send_lock.clone(),
        );
        let state = AppState {
            settings: settings.clone(),
            facilitator,
            stats: stats.clone(),
            kept: kept.clone(),
            reprices: reprices.clone(),
            pid_cache: pid_cache.clone(),
            siwx: siwx_state.clone(),
            defaults: defaults.clone(),
        };
        App::new().app_data(web::Data::new(state)).configure(routes).default_service(web::to(not_found))
    })
    .workers(args.workers.max(1))
    // A fixture has nothing worth draining: stop at once on SIGTERM/SIGINT (see below).
    .disable_signals()
    .bind(args.bind)
    .with_context(|| format!("cannot listen on {}", args.bind))?;

    let Some(bound) = server.addrs().first().copied() else {
        bail!("the server bound no address");
    };
    serve_until_terminated(bound, server.run()).await
}

/// What every worker serves with, from the command line and the token's EIP-712 domain.
fn settings_of(
    args: &ServeArgs,
    network_v1: String,
    domain: <ITestToken::eip712DomainCall as SolCall>::Return,
) -> Settings {
    Settings {
        network: args.network.clone(),
        network_v1,
        token: args.token,
        plain_token: args.plain_token,
        permit_token: args.permit_token,
        pay_to: args.pay_to,
        price: args.price.0,
        echo_price: args.echo_price.0,
        max_timeout_seconds: args.max_timeout_seconds,
        token_name: domain.name,
        token_version: domain.version,
    }
}

/// The payment-identifier cache's answer to a paid request carrying `id` (a replay, 503 while
/// the first is handled, 409 for another request), counted in the route's stats; None: handle it.
fn cached_answer(
    state: &AppState,
    path: &'static str,
    req: &actix_web::HttpRequest,
    body: &[u8],
    id: &str,
    always_conflict: bool,
) -> Option<actix_web::HttpResponse> {
    let header = req.headers().get(wire::PAYMENT_SIGNATURE).map(|h| h.as_bytes()).unwrap_or_default();
    let bound = pid_cache::binding(req.method().as_str(), &req.uri().to_string(), &credentials(req), body, header);
    let pid_cache::Lookup::Answer(answer, hit) = state.pid_cache.lookup(id, bound, always_conflict) else {
        return None;
    };
    state.stats.update(path, |s| match hit {
        pid_cache::Hit::Replay => s.pid_replays += 1,
        pid_cache::Hit::InFlight => s.pid_in_flight += 1,
        pid_cache::Hit::Conflict => s.pid_conflicts += 1,
    });
    Some(answer)
}

/// The credentials a request carries (`Authorization`, `Cookie`, `X-Api-Key`, each value in
/// order): a cached answer goes back only to the same credentials, as an API's cache keyed per
/// caller would.
fn credentials(req: &actix_web::HttpRequest) -> Vec<u8> {
    let mut out = Vec::new();
    for name in ["authorization", "cookie", "x-api-key"] {
        for value in req.headers().get_all(name) {
            out.extend_from_slice(name.as_bytes());
            out.push(b':');
            out.extend_from_slice(value.as_bytes());
            out.push(b'\n');
        }
    }
    out
}

/// The routes of every worker: the free and bookkeeping ones, Permit2's, and [`ROUTES`].
fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/free", web::get().to(free))
        .route("/free", web::post().to(free))
        .route("/_stats", web::get().to(stats_handler))
        .route("/_settle_kept", web::post().to(settle_kept))
        .route("/_kept", web::get().to(hoard::kept_handler))
        .route("/_defaults", web::post().to(respond::set_defaults))
        .route(permit2_routes::PERMIT2_PATH, web::get().to(permit2_routes::permit2_paid))
        .route(permit2_routes::UPTO_PATH, web::get().to(permit2_routes::permit2_paid));
    for spec in ROUTES {
        let method = match spec.method {
            Method::Get => web::get(),
            Method::Post => web::post(),
        };
        cfg.route(spec.path, method.to(paid));
    }
}

/// Fails fast on a wrong chain or a token that is not there, with the domain read from the
/// token itself (EIP-5267), so signatures are checked against what the contract will check.
async fn token_domain(
    chain: &Chain,
    args: &ServeArgs,
    chain_id: u64,
) -> anyhow::Result<<ITestToken::eip712DomainCall as SolCall>::Return> {
    let rpc_chain_id = chain.chain_id().await.with_context(|| format!("cannot reach the chain at {}", args.rpc_url))?;
    ensure!(
        rpc_chain_id == chain_id,
        "--network {} says chain {chain_id}, but {} is chain {rpc_chain_id}",
        args.network,
        args.rpc_url
    );
    ensure!(!chain.code_at(args.token).await?.is_empty(), "no contract at --token {} on chain {chain_id}", args.token);
    if let Some(plain) = args.plain_token {
        ensure!(!chain.code_at(plain).await?.is_empty(), "no contract at --plain-token {plain} on chain {chain_id}");
    }
    if let Some(permit) = args.permit_token {
        ensure!(!chain.code_at(permit).await?.is_empty(), "no contract at --permit-token {permit} on chain {chain_id}");
    }
    let domain = chain
        .call(args.token, &ITestToken::eip712DomainCall {})
        .await
        .with_context(|| format!("--token {} has no eip712Domain()", args.token))?;
    ensure!(
        domain.verifyingContract == args.token && domain.chainId == U256::from(chain_id),
        "eip712Domain() of {} names another contract or chain",
        args.token
    );
    Ok(domain)
}

/// Prints `{"listening": bound}` on stdout, then serves until SIGTERM or SIGINT.
async fn serve_until_terminated(bound: std::net::SocketAddr, server: actix_web::dev::Server) -> anyhow::Result<()> {
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", json!({ "listening": bound.to_string() }))?;
        out.flush()?;
    }
    tracing::info!(%bound, "listening");
    let handle = server.handle();
    actix_rt::spawn(async move {
        wait_for_termination().await;
        tracing::info!("stopping");
        handle.stop(false).await;
    });
    server.await?;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
async fn wait_for_termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    // Without a SIGTERM handler, Ctrl-C still stops the server; SIGTERM then kills the process.
    let _ = tokio::signal::ctrl_c().await;
}

/// `eip155:<chain id>` → chain id.
fn chain_id_of(network: &str) -> anyhow::Result<u64> {
    network
        .strip_prefix("eip155:")
        .and_then(|id| u64::from_str(id).ok())
        .with_context(|| format!("--network {network:?} is not eip155:<chain id>"))
}

/// The names x402 v1 uses for the EVM networks it knows.
fn v1_network_name(chain_id: u64) -> Option<&'static str> {
    Some(match chain_id {
        8453 => "base",
        84532 => "base-sepolia",
        43114 => "avalanche",
        43113 => "avalanche-fuji",
        137 => "polygon",
        80002 => "polygon-amoy",
        1 => "ethereum",
        11155111 => "sepolia",
        _ => return None,
    })
}

impl AppState {
    fn offer(&self, amount: U256, extra: Value) -> Offer {
        let s = &self.settings;
        Offer { scheme: "exact".into(), network: s.network.clone(), amount, asset: s.token, pay_to: s.pay_to, extra }
    }

    fn token_extra(&self) -> Value {
        json!({ "name": self.settings.token_name, "version": self.settings.token_version })
    }

    /// The `accepts` of a route, in the order they are advertised (`price`: `?price=N`).
    fn offers(&self, behaviour: Behaviour, price: Option<U256>) -> Vec<Offer> {
        let s = &self.settings;
        let echo_price = price.unwrap_or(s.echo_price);
        let price = price.unwrap_or(s.price);
        match behaviour {
            Behaviour::Echo => vec![self.offer(echo_price, self.token_extra())],
            Behaviour::Reprice => {
                let n = self.reprices.load(std::sync::atomic::Ordering::SeqCst);
                vec![self.offer(price.saturating_mul(U256::from(n + 1)), self.token_extra())]
            }
            Behaviour::SettleThen500 => {
                let mut extra = self.token_extra();
                if let Some(map) = extra.as_object_mut() {
                    map.insert("paymentFlow".into(), json!("upfront"));
                }
                vec![self.offer(price, extra)]
            }
            Behaviour::Hostile => {
                let mut extra = self.token_extra();
                if let Some(map) = extra.as_object_mut() {
                    map.insert("note".into(), json!(HOSTILE_NOTE));
                }
                vec![self.offer(price, extra)]
            }
            Behaviour::Multi => {
                // Cheaper entries first that must NOT be chosen (wrong network, unknown asset,
                // unsupported scheme), a dearer payable one first of all, the right one last.
                let fraction = |d: u64| (price / U256::from(d)).max(U256::from(1u64));
                vec![
                    self.offer(price.saturating_mul(U256::from(3u64)), self.token_extra()),
                    Offer { network: "eip155:1".into(), ..self.offer(fraction(2), self.token_extra()) },
                    Offer {
                        asset: FOREIGN_ASSET,
                        ..self.offer(fraction(4), json!({ "name": "Other Coin", "version": "1" }))
                    },
                    Offer { scheme: "upto".into(), ..self.offer(fraction(10), self.token_extra()) },
                    self.offer(price, self.token_extra()),
                ]
            }
            _ => vec![self.offer(price, self.token_extra())],
        }
    }

    fn requirement_v2(&self, offer: &Offer, max_timeout: Option<u64>) -> wire::RequirementV2 {
        wire::RequirementV2 {
            scheme: offer.scheme.clone(),
            network: offer.network.clone(),
            amount: offer.amount.to_string(),
            asset: offer.asset.to_checksum(None),
            pay_to: offer.pay_to.to_checksum(None),
            max_timeout_seconds: max_timeout.unwrap_or(self.settings.max_timeout_seconds),
            extra: offer.extra.clone(),
        }
    }

    fn requirement_v1(&self, offer: &Offer, spec: &RouteSpec, url: &str) -> wire::RequirementV1 {
        let network = if offer.network == self.settings.network {
            self.settings.network_v1.clone()
        } else {
            offer.network.clone()
        };
        let method = match spec.method {
            Method::Get => "GET",
            Method::Post => "POST",
        };
        wire::RequirementV1 {
            scheme: offer.scheme.clone(),
            network,
            max_amount_required: offer.amount.to_string(),
            resource: url.to_owned(),
            description: spec.description.to_owned(),
            mime_type: "application/json".into(),
            pay_to: offer.pay_to.to_checksum(None),
            max_timeout_seconds: self.settings.max_timeout_seconds,
            asset: offer.asset.to_checksum(None),
            output_schema: json!({ "input": { "type": "http", "method": method, "discoverable": true } }),
            extra: offer.extra.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_path_is_unique() {
        let mut paths: Vec<_> = ROUTES.iter().map(|r| r.path).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), ROUTES.len());
    }

    #[test]
    fn seconds_are_bounded_whole_numbers() {
        assert_eq!(Query::parse("").seconds(), Ok(DEFAULT_SECONDS));
        assert_eq!(Query::parse("seconds=0").seconds(), Ok(0));
        assert_eq!(Query::parse("seconds=3600").seconds(), Ok(3600));
        assert!(Query::parse("seconds=3601").seconds().is_err());
        assert!(Query::parse("seconds=1.5").seconds().is_err());
        assert!(Query::parse("seconds=-1").seconds().is_err());
    }

    #[test]
    fn reject_reason_is_sanitised() {
        assert_eq!(Query::parse("").reason(), "invalid_exact_evm_signature");
        assert_eq!(Query::parse("reason=insufficient_funds").reason(), "insufficient_funds");
        assert_eq!(Query::parse("reason=%0d%0aX:1").reason(), "invalid_exact_evm_signature");
    }

    #[test]
    fn network_names() {
        assert_eq!(chain_id_of("eip155:84532").unwrap(), 84532);
        assert!(chain_id_of("base-sepolia").is_err());
        assert_eq!(v1_network_name(84532), Some("base-sepolia"));
        assert_eq!(v1_network_name(31337), None);
    }
}
