//! `serve`: the x402 resource server. [`ROUTES`] is the route table; each paid route runs the
//! same steps (402 without a payment header, decode, match the offer, verify, then its
//! [`Behaviour`]), rendered in the v1 or v2 wire format.
//!
//! Settlements run in a spawned task, so a client that hangs up mid-request does not cancel a
//! transfer that was already decided (an Express server, like the official one, does not cancel
//! its handlers either); the counters in `/_stats` are updated by that task.

use std::io::Write;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, MessageBody};
use actix_web::http::StatusCode;
use actix_web::http::header::CACHE_CONTROL;
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use alloy::primitives::{Address, B256, U256, address, keccak256};
use alloy::sol_types::Eip712Domain;
use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::chain::{Chain, ITestToken};
use crate::cli::ServeArgs;
use crate::payment::{Facilitator, Offer, Refusal, SignedAuthorization, error_chain};
use crate::stats::Stats;
use crate::wire::{self, PaymentPayloadV1, PaymentPayloadV2};

/// Asset of the `/v2/multi` entry that no token here answers for.
const FOREIGN_ASSET: Address = address!("0x000000000000000000000000000000000000dEaD");
/// Default and largest `?seconds=` of the slow routes.
const DEFAULT_SECONDS: u64 = 5;
const MAX_SECONDS: u64 = 3600;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// What a paid route does once the payment verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Settle, then 200 with a weather report.
    Weather,
    /// Settle, then 200 echoing the JSON request body (400 without settling if it is not JSON).
    Echo,
    /// Like `Weather`, with several offers of which one is payable and cheapest among payables.
    Multi,
    /// Like `Weather`, advertising the payment-identifier extension.
    PaymentIdentifier,
    /// 500 and no settlement.
    Error500,
    /// Settle first, then 500 carrying the settlement header.
    SettleThen500,
    /// Settle, then close the connection without any HTTP response.
    SettleThenDrop,
    /// Always refuse the payment (402 with a reason).
    Reject,
    /// Sleep `?seconds=N`, then settle and answer 200.
    Stall,
    /// 200 with a settlement header naming a made-up transaction; nothing is settled.
    Lie,
    /// Settle, sleep `?seconds=N`, then answer 200.
    SlowSettle,
}

pub struct RouteSpec {
    pub path: &'static str,
    pub method: Method,
    pub version: Version,
    pub behaviour: Behaviour,
    pub description: &'static str,
}

/// THE route table. Besides these: `GET /free` (no payment) and `GET /_stats` (counters).
pub const ROUTES: &[RouteSpec] = &[
    RouteSpec {
        path: "/v2/weather",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Weather,
        description: "Weather report (x402 v2)",
    },
    RouteSpec {
        path: "/v2/echo",
        method: Method::Post,
        version: Version::V2,
        behaviour: Behaviour::Echo,
        description: "Echoes the JSON body (x402 v2)",
    },
    RouteSpec {
        path: "/v2/error500",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Error500,
        description: "Fails with 500 after verifying; never settles (x402 v2)",
    },
    RouteSpec {
        path: "/v2/settle-then-500",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SettleThen500,
        description: "Settles up front, then fails with 500 (x402 v2)",
    },
    RouteSpec {
        path: "/v2/settle-then-drop",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SettleThenDrop,
        description: "Settles, then drops the connection without answering (x402 v2)",
    },
    RouteSpec {
        path: "/v2/reject",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Reject,
        description: "Refuses every payment (x402 v2)",
    },
    RouteSpec {
        path: "/v2/stall",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Stall,
        description: "Waits ?seconds=N after verifying, then settles and answers (x402 v2)",
    },
    RouteSpec {
        path: "/v2/lie",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Lie,
        description: "Claims a settlement that never happened (x402 v2)",
    },
    RouteSpec {
        path: "/v2/slow-settle",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SlowSettle,
        description: "Settles, then waits ?seconds=N before answering (x402 v2)",
    },
    RouteSpec {
        path: "/v2/multi",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Multi,
        description: "Offers several requirements; one cheapest payable (x402 v2)",
    },
    RouteSpec {
        path: "/v2/pid",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::PaymentIdentifier,
        description: "Advertises the payment-identifier extension (x402 v2)",
    },
    RouteSpec {
        path: "/v1/weather",
        method: Method::Get,
        version: Version::V1,
        behaviour: Behaviour::Weather,
        description: "Weather report (x402 v1)",
    },
    RouteSpec {
        path: "/v1/error500",
        method: Method::Get,
        version: Version::V1,
        behaviour: Behaviour::Error500,
        description: "Fails with 500 after verifying; never settles (x402 v1)",
    },
];

/// Settings shared by every worker.
#[derive(Debug)]
struct Settings {
    network: String,
    network_v1: String,
    token: Address,
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

    // Fail fast on a wrong chain or a token that is not there, with the domain read from the
    // token itself (EIP-5267), so signatures are checked against what the contract will check.
    let chain = Chain::connect(args.rpc_url.clone(), signer.clone(), rpc_timeout);
    let rpc_chain_id = chain.chain_id().await.with_context(|| format!("cannot reach the chain at {}", args.rpc_url))?;
    ensure!(
        rpc_chain_id == chain_id,
        "--network {} says chain {chain_id}, but {} is chain {rpc_chain_id}",
        args.network,
        args.rpc_url
    );
    ensure!(!chain.code_at(args.token).await?.is_empty(), "no contract at --token {} on chain {chain_id}", args.token);
    let domain = chain
        .call(args.token, &ITestToken::eip712DomainCall {})
        .await
        .with_context(|| format!("--token {} has no eip712Domain()", args.token))?;
    ensure!(
        domain.verifyingContract == args.token && domain.chainId == U256::from(chain_id),
        "eip712Domain() of {} names another contract or chain",
        args.token
    );
    let eip712 = Eip712Domain::new(
        Some(domain.name.clone().into()),
        Some(domain.version.clone().into()),
        Some(domain.chainId),
        Some(args.token),
        None,
    );

    let settings = Arc::new(Settings {
        network: args.network.clone(),
        network_v1,
        token: args.token,
        pay_to: args.pay_to,
        price: args.price.0,
        echo_price: args.echo_price.0,
        max_timeout_seconds: args.max_timeout_seconds,
        token_name: domain.name,
        token_version: domain.version,
    });
    let stats = Stats::with_routes(ROUTES.iter().map(|r| r.path));
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
        let state = AppState { settings: settings.clone(), facilitator, stats: stats.clone() };
        let mut app = App::new()
            .app_data(web::Data::new(state))
            .route("/free", web::get().to(free))
            .route("/_stats", web::get().to(stats_handler));
        for spec in ROUTES {
            let method = match spec.method {
                Method::Get => web::get(),
                Method::Post => web::post(),
            };
            app = app.route(spec.path, method.to(paid));
        }
        app.default_service(web::to(not_found))
    })
    .workers(args.workers.max(1))
    // A fixture has nothing worth draining: stop at once on SIGTERM/SIGINT (see below).
    .disable_signals()
    .bind(args.bind)
    .with_context(|| format!("cannot listen on {}", args.bind))?;

    let Some(bound) = server.addrs().first().copied() else {
        bail!("the server bound no address");
    };
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", json!({ "listening": bound.to_string() }))?;
        out.flush()?;
    }
    tracing::info!(%bound, "listening");
    let server = server.run();
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

    /// The `accepts` of a route, in the order they are advertised.
    fn offers(&self, behaviour: Behaviour) -> Vec<Offer> {
        let s = &self.settings;
        match behaviour {
            Behaviour::Echo => vec![self.offer(s.echo_price, self.token_extra())],
            Behaviour::SettleThen500 => {
                let mut extra = self.token_extra();
                if let Some(map) = extra.as_object_mut() {
                    map.insert("paymentFlow".into(), json!("upfront"));
                }
                vec![self.offer(s.price, extra)]
            }
            Behaviour::Multi => {
                // Cheaper entries first that must NOT be chosen (wrong network, unknown asset,
                // unsupported scheme), a dearer payable one first of all, the right one last.
                let fraction = |d: u64| (s.price / U256::from(d)).max(U256::from(1u64));
                vec![
                    self.offer(s.price.saturating_mul(U256::from(3u64)), self.token_extra()),
                    Offer { network: "eip155:1".into(), ..self.offer(fraction(2), self.token_extra()) },
                    Offer {
                        asset: FOREIGN_ASSET,
                        ..self.offer(fraction(4), json!({ "name": "Other Coin", "version": "1" }))
                    },
                    Offer { scheme: "upto".into(), ..self.offer(fraction(10), self.token_extra()) },
                    self.offer(s.price, self.token_extra()),
                ]
            }
            _ => vec![self.offer(s.price, self.token_extra())],
        }
    }

    fn requirement_v2(&self, offer: &Offer) -> wire::RequirementV2 {
        wire::RequirementV2 {
            scheme: offer.scheme.clone(),
            network: offer.network.clone(),
            amount: offer.amount.to_string(),
            asset: offer.asset.to_checksum(None),
            pay_to: offer.pay_to.to_checksum(None),
            max_timeout_seconds: self.settings.max_timeout_seconds,
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

/// What the paid part of a request came to, before it is put in a wire format.
enum Outcome {
    Answer { status: StatusCode, body: Value, settlement: Option<Settled> },
    Refused(Refusal),
    Drop,
}

struct Settled {
    transaction: B256,
    payer: Address,
}

/// `GET /free`: no payment needed.
async fn free() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "free": true, "message": "no payment needed" }))
}

/// `GET /_stats`: per-route counters (see `stats::RouteStats`).
async fn stats_handler(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(state.stats.snapshot())
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(json!({ "error": "not found" }))
}

fn bad_request(message: &str) -> HttpResponse {
    HttpResponse::BadRequest().json(json!({ "error": message }))
}

/// Every route of [`ROUTES`].
async fn paid(req: HttpRequest, body: Bytes, state: web::Data<AppState>) -> HttpResponse {
    let Some(spec) = ROUTES.iter().find(|r| r.path == req.path()) else {
        return not_found().await;
    };
    state.stats.update(spec.path, |s| s.requests += 1);
    let query = Query::parse(req.query_string());
    let seconds = match spec.behaviour {
        Behaviour::Stall | Behaviour::SlowSettle => match query.seconds() {
            Ok(seconds) => seconds,
            Err(message) => return bad_request(&message),
        },
        _ => 0,
    };
    let url = resource_url(&req);
    match spec.version {
        Version::V2 => paid_v2(&req, spec, &state, &body, &url, seconds, &query).await,
        Version::V1 => paid_v1(&req, spec, &state, &body, &url, seconds).await,
    }
}

async fn paid_v2(
    req: &HttpRequest,
    spec: &'static RouteSpec,
    state: &AppState,
    body: &Bytes,
    url: &str,
    seconds: u64,
    query: &Query,
) -> HttpResponse {
    let offers = state.offers(spec.behaviour);
    let required = |error: &str| wire::PaymentRequiredV2 {
        x402_version: 2,
        error: error.to_owned(),
        resource: wire::ResourceInfo {
            url: url.to_owned(),
            description: spec.description.to_owned(),
            mime_type: "application/json".into(),
        },
        accepts: offers.iter().map(|o| state.requirement_v2(o)).collect(),
        extensions: (spec.behaviour == Behaviour::PaymentIdentifier).then(wire::payment_identifier_declaration),
    };

    // Like the official v2 server: no header, or one that does not decode, is no payment.
    let payload =
        req.headers().get(wire::PAYMENT_SIGNATURE).and_then(|h| wire::decode_header::<PaymentPayloadV2>(h.as_bytes()));
    let Some(payload) = payload else {
        return payment_required_v2(&required("Payment required"), json!({}));
    };
    let payment_id = payload.payment_identifier();
    state.stats.update(spec.path, |s| {
        s.payment_attempts += 1;
        if payment_id.is_some() {
            s.last_payment_identifier = payment_id.clone();
        }
    });
    let payer = Address::from_str(&payload.payload.authorization.from).ok();

    if spec.behaviour == Behaviour::Reject {
        let refusal = Refusal::Forced { reason: query.reason(), message: "this route refuses every payment".into() };
        let body = serde_json::to_value(wire::VerifyRefusal {
            is_valid: false,
            invalid_reason: refusal.reason().to_owned(),
            invalid_message: refusal.to_string(),
            payer: payer.map(|p| p.to_checksum(None)),
        })
        .unwrap_or_else(|_| json!({}));
        note_refusal(state, spec, &refusal);
        return payment_required_v2(&required(refusal.reason()), body);
    }

    let prepared = if payload.x402_version != 2 {
        Err(Refusal::InvalidVersion(payload.x402_version))
    } else {
        match_offer_v2(&offers, &payload.accepted)
            .and_then(|offer| SignedAuthorization::parse(&payload.payload).map(|auth| (offer.clone(), auth)))
    };
    let outcome = match prepared {
        Ok((offer, auth)) => execute(spec, state, &offer, auth, body, seconds).await,
        Err(refusal) => Outcome::Refused(refusal),
    };

    match outcome {
        Outcome::Refused(refusal) => {
            note_refusal(state, spec, &refusal);
            payment_required_v2(&required(refusal.reason()), json!({}))
        }
        Outcome::Drop => dropped_connection(),
        Outcome::Answer { status, body, settlement } => {
            let mut response = HttpResponse::build(status);
            if let Some(settled) = settlement {
                let header = wire::encode_header(&wire::SettlementV2 {
                    success: true,
                    payer: settled.payer.to_checksum(None),
                    transaction: format!("{:#x}", settled.transaction),
                    network: state.settings.network.clone(),
                });
                match header {
                    Ok(header) => {
                        response.insert_header((wire::PAYMENT_RESPONSE, header));
                    }
                    Err(err) => return internal_error(&err),
                }
                response.insert_header((CACHE_CONTROL, "private"));
            }
            response.json(body)
        }
    }
}

async fn paid_v1(
    req: &HttpRequest,
    spec: &'static RouteSpec,
    state: &AppState,
    body: &Bytes,
    url: &str,
    seconds: u64,
) -> HttpResponse {
    let offers = state.offers(spec.behaviour);
    let required = |error: &str, payer: Option<Address>| wire::PaymentRequiredV1 {
        x402_version: 1,
        error: error.to_owned(),
        accepts: offers.iter().map(|o| state.requirement_v1(o, spec, url)).collect(),
        payer: payer.map(|p| p.to_checksum(None)),
    };

    let Some(header) = req.headers().get(wire::X_PAYMENT) else {
        return payment_required_v1(&required("X-PAYMENT header is required", None));
    };
    let Some(payload) = wire::decode_header::<PaymentPayloadV1>(header.as_bytes()) else {
        state.stats.update(spec.path, |s| s.refused += 1);
        return payment_required_v1(&required("Invalid or malformed payment header", None));
    };
    state.stats.update(spec.path, |s| s.payment_attempts += 1);
    let payer = Address::from_str(&payload.payload.authorization.from).ok();

    let prepared = if payload.x402_version != 1 {
        Err(Refusal::InvalidVersion(payload.x402_version))
    } else {
        offers
            .iter()
            .find(|o| {
                o.scheme == payload.scheme
                    && o.network == state.settings.network
                    && payload.network == state.settings.network_v1
            })
            .ok_or(Refusal::NoMatchingRequirement)
            .and_then(|offer| SignedAuthorization::parse(&payload.payload).map(|auth| (offer.clone(), auth)))
    };
    let outcome = match prepared {
        Ok((offer, auth)) => execute(spec, state, &offer, auth, body, seconds).await,
        Err(refusal) => Outcome::Refused(refusal),
    };

    match outcome {
        Outcome::Refused(refusal) => {
            note_refusal(state, spec, &refusal);
            payment_required_v1(&required(refusal.reason(), payer))
        }
        Outcome::Drop => dropped_connection(),
        Outcome::Answer { status, body, settlement } => {
            let mut response = HttpResponse::build(status);
            if let Some(settled) = settlement {
                let header = wire::encode_header(&wire::SettlementV1 {
                    success: true,
                    transaction: format!("{:#x}", settled.transaction),
                    network: state.settings.network_v1.clone(),
                    payer: settled.payer.to_checksum(None),
                });
                match header {
                    Ok(header) => {
                        response.insert_header((wire::X_PAYMENT_RESPONSE, header));
                    }
                    Err(err) => return internal_error(&err),
                }
            }
            response.json(body)
        }
    }
}

/// The offered entry a v2 client says it accepted (addresses compared as addresses).
fn match_offer_v2<'a>(offers: &'a [Offer], accepted: &wire::AcceptedV2) -> Result<&'a Offer, Refusal> {
    let asset = Address::from_str(&accepted.asset).ok();
    let pay_to = Address::from_str(&accepted.pay_to).ok();
    offers
        .iter()
        .find(|o| {
            o.scheme == accepted.scheme
                && o.network == accepted.network
                && o.amount.to_string() == accepted.amount
                && Some(o.asset) == asset
                && Some(o.pay_to) == pay_to
        })
        .ok_or(Refusal::NoMatchingRequirement)
}

/// Verifies, then does what the route does. Shared by both wire versions.
async fn execute(
    spec: &'static RouteSpec,
    state: &AppState,
    offer: &Offer,
    auth: SignedAuthorization,
    body: &Bytes,
    seconds: u64,
) -> Outcome {
    if let Err(refusal) = state.facilitator.verify(offer, &auth).await {
        return Outcome::Refused(refusal);
    }
    let wait = Duration::from_secs(seconds);
    let payer = auth.from;
    match spec.behaviour {
        Behaviour::Weather | Behaviour::Multi | Behaviour::PaymentIdentifier => {
            settle_then(state, spec, auth, StatusCode::OK, weather(spec)).await
        }
        Behaviour::Echo => match serde_json::from_slice::<Value>(body) {
            Ok(echo) => settle_then(state, spec, auth, StatusCode::OK, echo).await,
            // The handler failed, so (like the official middleware) nothing is settled.
            Err(_) => Outcome::Answer {
                status: StatusCode::BAD_REQUEST,
                body: json!({ "error": "the request body must be JSON" }),
                settlement: None,
            },
        },
        Behaviour::Error500 => Outcome::Answer {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: json!({ "error": "the upstream failed (test route); the payment was not settled" }),
            settlement: None,
        },
        Behaviour::SettleThen500 => {
            let body = json!({ "error": "the upstream failed after settling (test route)" });
            settle_then(state, spec, auth, StatusCode::INTERNAL_SERVER_ERROR, body).await
        }
        Behaviour::SettleThenDrop => match settle(state, spec, auth, Duration::ZERO).await {
            Ok(_) => Outcome::Drop,
            Err(refusal) => Outcome::Refused(refusal),
        },
        Behaviour::Stall => {
            // The wait is part of the settlement task: a client that gives up does not stop it.
            match settle(state, spec, auth, wait).await {
                Ok(transaction) => Outcome::Answer {
                    status: StatusCode::OK,
                    body: json!({ "stalled_seconds": seconds, "report": weather(spec) }),
                    settlement: Some(Settled { transaction, payer }),
                },
                Err(refusal) => Outcome::Refused(refusal),
            }
        }
        Behaviour::SlowSettle => match settle(state, spec, auth, Duration::ZERO).await {
            Ok(transaction) => {
                tokio::time::sleep(wait).await;
                Outcome::Answer {
                    status: StatusCode::OK,
                    body: json!({ "slept_after_settling_seconds": seconds, "report": weather(spec) }),
                    settlement: Some(Settled { transaction, payer }),
                }
            }
            Err(refusal) => Outcome::Refused(refusal),
        },
        Behaviour::Lie => {
            // Looks like a transaction hash; no transaction has it.
            let made_up = keccak256([b"x402-test-upstream: never settled ".as_slice(), auth.nonce.as_slice()].concat());
            tracing::warn!(route = spec.path, payer = %auth.from, tx = %made_up, "claiming a settlement that did not happen");
            Outcome::Answer {
                status: StatusCode::OK,
                body: weather(spec),
                settlement: Some(Settled { transaction: made_up, payer }),
            }
        }
        Behaviour::Reject => Outcome::Refused(Refusal::Forced {
            reason: "invalid_exact_evm_signature".into(),
            message: "this route refuses every payment".into(),
        }),
    }
}

/// Settles now, then answers `status` with `body` and the settlement header.
async fn settle_then(
    state: &AppState,
    spec: &'static RouteSpec,
    auth: SignedAuthorization,
    status: StatusCode,
    body: Value,
) -> Outcome {
    let payer = auth.from;
    match settle(state, spec, auth, Duration::ZERO).await {
        Ok(transaction) => Outcome::Answer { status, body, settlement: Some(Settled { transaction, payer }) },
        Err(refusal) => Outcome::Refused(refusal),
    }
}

/// Waits `delay`, settles, and counts the settlement, in a task of its own so that a client
/// hanging up cannot cancel it half way.
async fn settle(
    state: &AppState,
    spec: &'static RouteSpec,
    auth: SignedAuthorization,
    delay: Duration,
) -> Result<B256, Refusal> {
    let facilitator = state.facilitator.clone();
    let stats = state.stats.clone();
    let task = actix_rt::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let result = facilitator.settle(&auth).await;
        match &result {
            Ok(tx) => {
                tracing::info!(route = spec.path, payer = %auth.from, amount = %auth.value, %tx, "settled");
                stats.update(spec.path, |s| {
                    s.paid += 1;
                    s.last_paid_amount = Some(auth.value.to_string());
                    s.last_transaction = Some(format!("{tx:#x}"));
                });
            }
            Err(refusal) => {
                tracing::warn!(route = spec.path, payer = %auth.from, reason = refusal.reason(), error = %refusal, "settlement failed");
            }
        }
        result
    });
    match task.await {
        Ok(result) => result,
        Err(join) => Err(Refusal::SettleRpc(format!("the settlement task failed: {join}"))),
    }
}

fn note_refusal(state: &AppState, spec: &RouteSpec, refusal: &Refusal) {
    tracing::info!(route = spec.path, reason = refusal.reason(), error = %refusal, "payment refused");
    state.stats.update(spec.path, |s| s.refused += 1);
}

fn weather(spec: &RouteSpec) -> Value {
    json!({
        "route": spec.path,
        "city": "Paris",
        "forecast": "sunny",
        "temperature_c": 21
    })
}

fn payment_required_v2(required: &wire::PaymentRequiredV2, body: Value) -> HttpResponse {
    match wire::encode_header(required) {
        Ok(header) => HttpResponse::PaymentRequired()
            .insert_header((wire::PAYMENT_REQUIRED, header))
            .insert_header((CACHE_CONTROL, "no-store"))
            .json(body),
        Err(err) => internal_error(&err),
    }
}

fn payment_required_v1(required: &wire::PaymentRequiredV1) -> HttpResponse {
    HttpResponse::PaymentRequired().insert_header((CACHE_CONTROL, "no-store")).json(required)
}

fn internal_error(err: &dyn std::error::Error) -> HttpResponse {
    tracing::error!(error = %error_chain(err), "could not build the response");
    HttpResponse::InternalServerError().json(json!({ "error": "internal error" }))
}

/// `scheme://host/path?query` of this request, as the client addressed it.
fn resource_url(req: &HttpRequest) -> String {
    let info = req.connection_info();
    let path = req.uri().path_and_query().map_or_else(|| req.path().to_owned(), |pq| pq.as_str().to_owned());
    format!("{}://{}{}", info.scheme(), info.host(), path)
}

/// The query parameters the test routes understand.
struct Query {
    seconds: Option<String>,
    reason: Option<String>,
}

impl Query {
    fn parse(raw: &str) -> Self {
        let mut query = Self { seconds: None, reason: None };
        for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
            match &*key {
                "seconds" => query.seconds = Some(value.into_owned()),
                "reason" => query.reason = Some(value.into_owned()),
                _ => {}
            }
        }
        query
    }

    /// `?seconds=N`, whole seconds, at most an hour.
    fn seconds(&self) -> Result<u64, String> {
        match &self.seconds {
            None => Ok(DEFAULT_SECONDS),
            Some(raw) => match u64::from_str(raw) {
                Ok(n) if n <= MAX_SECONDS => Ok(n),
                _ => Err(format!("seconds must be a whole number from 0 to {MAX_SECONDS}")),
            },
        }
    }

    /// `/v2/reject?reason=…` (letters, digits, `_`, `-`), default `invalid_exact_evm_signature`.
    fn reason(&self) -> String {
        self.reason
            .as_deref()
            .filter(|r| {
                !r.is_empty()
                    && r.len() <= 100
                    && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            })
            .unwrap_or("invalid_exact_evm_signature")
            .to_owned()
    }
}

/// A response whose body fails before its first byte. actix-http encodes the head into its
/// write buffer, polls the body in the same turn, and on the error tears the connection down
/// before flushing, so the client sees the connection close with no HTTP response at all.
fn dropped_connection() -> HttpResponse {
    tracing::info!("closing the connection without a response");
    HttpResponse::Ok().body(AbortBody)
}

struct AbortBody;

impl MessageBody for AbortBody {
    type Error = std::io::Error;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Poll::Ready(Some(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "settle-then-drop: closing the connection without a response",
        ))))
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
