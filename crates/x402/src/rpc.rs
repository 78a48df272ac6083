//! The JSON-RPC transport under [`super::Chain`]: a network's RPC URLs (`X402_RPC_URLS` may
//! list several per network) behind alloy's fallback and retry layers, each URL behind a
//! chain-id guard of its own.
//!
//! ```text
//! RetryBackoffLayer        rate limits (429, 503, "-32005"…): back off, try again
//!  └ FallbackLayer         one URL after another, best-ranked first (success rate, latency)
//!     └ UrlTransport × n   chain-id guard, per-attempt timeout, metrics of this URL
//!        └ Http<reqwest>
//! ```
//!
//! Invariants:
//! - A URL answers nothing until its own `eth_chainId` equals its network's chain id; a URL
//!   that serves another chain fails every request (the fallback moves on to the next URL),
//!   and is checked again after any failure (a load balancer may reach another node).
//! - Every method is tried on one URL at a time ([`SEQUENTIAL_METHODS`]): a read is never
//!   raced across nodes (the first, possibly lagging, answer would win) and a paid RPC
//!   provider is not billed n times.
//! - A URL is never logged or used as a metric label (URLs carry API keys): a URL is named by
//!   its position in `X402_RPC_URLS` among its network's URLs (`endpoint="0"`, `"1"`, …).

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use alloy::primitives::U64;
use alloy::rpc::client::RpcClient;
use alloy::rpc::json_rpc::{Id, Request, RequestPacket, ResponsePacket, ResponsePayload};
use alloy::transports::http::Http;
use alloy::transports::layers::{FallbackLayer, RetryBackoffLayer};
use alloy::transports::{TransportError, TransportErrorKind, TransportFut};
use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec};
use reqwest::Url;
use tower::{Layer, Service};

use super::network::Network;

/// The JSON-RPC methods the router calls: all of them are sent to one URL at a time.
pub const SEQUENTIAL_METHODS: [&str; 5] =
    ["eth_chainId", "eth_call", "eth_getTransactionReceipt", "eth_blockNumber", "eth_getLogs"];

/// Retries of a rate-limited request (after the first attempt), and the back-off between
/// them when the endpoint gives no hint. The per-call timeout of [`super::Chain`] bounds the
/// whole.
const RATE_LIMIT_RETRIES: u32 = 2;
const RATE_LIMIT_BACKOFF_MS: u64 = 100;
/// Compute units per second that alloy's retry layer budgets for (it only matters once
/// requests are being rate limited): high, so that it adds no queueing delay of its own.
const COMPUTE_UNITS_PER_SECOND: u64 = 100_000;

/// The per-endpoint metrics (clones of the registered vectors).
#[derive(Clone)]
pub struct EndpointMetrics {
    /// `x402_router_rpc_endpoint_requests_total{network, endpoint, outcome}`.
    pub requests: IntCounterVec,
    /// `x402_router_rpc_endpoint_seconds{network, endpoint}`.
    pub seconds: HistogramVec,
    /// `x402_router_rpc_endpoint_up{network, endpoint}`.
    pub up: IntGaugeVec,
}

/// A URL that answered with another chain's id.
#[derive(Debug, thiserror::Error)]
#[error("RPC endpoint {endpoint} of {network} serves chain id {actual}, not {}", network.chain_id())]
pub struct WrongChain {
    pub network: Network,
    pub endpoint: usize,
    pub actual: u64,
}

/// A URL's attempt that did not finish within its share of the per-call timeout.
#[derive(Debug, thiserror::Error)]
#[error("RPC attempt timed out")]
pub struct AttemptTimeout;

/// One RPC URL, guarded. Cheap to clone (the state is shared).
#[derive(Clone)]
pub struct UrlTransport {
    http: Http<reqwest::Client>,
    state: Arc<UrlState>,
}

struct UrlState {
    network: Network,
    index: usize,
    label: String,
    /// `eth_chainId` answered the network's id since the last failure.
    verified: AtomicBool,
    /// The chain id of the last mismatch (0: none since the last successful check).
    wrong_chain: AtomicU64,
    attempt_timeout: Duration,
    metrics: Option<EndpointMetrics>,
}

impl UrlTransport {
    fn new(
        network: Network,
        index: usize,
        url: Url,
        attempt_timeout: Duration,
        metrics: Option<EndpointMetrics>,
    ) -> Self {
        let state = UrlState {
            network,
            index,
            label: index.to_string(),
            verified: AtomicBool::new(false),
            wrong_chain: AtomicU64::new(0),
            attempt_timeout,
            metrics,
        };
        Self { http: Http::new(url), state: Arc::new(state) }
    }

    /// This URL's position among its network's URLs (its metric label).
    pub fn index(&self) -> usize {
        self.state.index
    }

    /// Whether this URL's chain id was checked since its last failure.
    pub fn verified(&self) -> bool {
        self.state.verified.load(Ordering::Acquire)
    }

    /// The chain id this URL last answered when it did not match (None: no mismatch since
    /// its last successful check).
    pub fn wrong_chain(&self) -> Option<u64> {
        Some(self.state.wrong_chain.load(Ordering::Acquire)).filter(|id| *id != 0)
    }

    /// Asks this URL alone for its chain id and records the verdict.
    ///
    /// # Errors
    /// [`WrongChain`] (as a custom transport error) when it serves another chain; the
    /// transport's error when it does not answer.
    pub async fn check_chain_id(&self) -> Result<(), TransportError> {
        let request = Request::new("eth_chainId", Id::Number(0), ()).serialize().map_err(TransportError::SerError)?;
        let response = self.attempt(RequestPacket::from(request)).await?;
        let actual = match response {
            ResponsePacket::Single(r) => match r.payload {
                ResponsePayload::Success(raw) => serde_json::from_str::<U64>(raw.get())
                    .map_err(|e| TransportError::deser_err(e, raw.get()))?
                    .to::<u64>(),
                ResponsePayload::Failure(e) => return Err(TransportError::ErrorResp(e)),
            },
            ResponsePacket::Batch(_) => return Err(TransportErrorKind::custom_str("batch answer to eth_chainId")),
        };
        let s = &self.state;
        if actual == s.network.chain_id() {
            s.wrong_chain.store(0, Ordering::Release);
            s.verified.store(true, Ordering::Release);
            Ok(())
        } else {
            s.verified.store(false, Ordering::Release);
            s.wrong_chain.store(actual.max(1), Ordering::Release);
            self.record("wrong_chain", None);
            tracing::error!(
                payment.network = %s.network, rpc.endpoint = s.index, rpc.chain_id = actual,
                "an RPC URL serves another chain; it is not used until it serves its network again"
            );
            Err(TransportErrorKind::custom(WrongChain { network: s.network, endpoint: s.index, actual }))
        }
    }

    /// One request to this URL, under the per-attempt timeout; counted in the metrics.
    async fn attempt(&self, request: RequestPacket) -> Result<ResponsePacket, TransportError> {
        let started = Instant::now();
        let mut http = self.http.clone();
        let (result, outcome) = match tokio::time::timeout(self.state.attempt_timeout, http.call(request)).await {
            Ok(Ok(response)) => (Ok(response), "ok"),
            Ok(Err(e)) => (Err(e), "error"),
            Err(_) => (Err(TransportErrorKind::custom(AttemptTimeout)), "timeout"),
        };
        if result.is_err() {
            // Whatever answers next (a reconnect may reach another node) is checked again.
            self.state.verified.store(false, Ordering::Release);
        }
        self.record(outcome, Some(started.elapsed()));
        result
    }

    fn record(&self, outcome: &str, elapsed: Option<Duration>) {
        let Some(m) = &self.state.metrics else { return };
        let network = self.state.network.caip2();
        let labels = [network.as_str(), self.state.label.as_str()];
        m.requests.with_label_values(&[labels[0], labels[1], outcome]).inc();
        if let Some(elapsed) = elapsed {
            m.seconds.with_label_values(&labels).observe(elapsed.as_secs_f64());
        }
        m.up.with_label_values(&labels).set(i64::from(outcome == "ok"));
    }

    async fn send(self, request: RequestPacket) -> Result<ResponsePacket, TransportError> {
        if !self.state.verified.load(Ordering::Acquire) {
            self.check_chain_id().await?;
        }
        self.attempt(request).await
    }
}

impl Service<RequestPacket> for UrlTransport {
    type Response = ResponsePacket;
    type Error = TransportError;
    type Future = TransportFut<'static>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: RequestPacket) -> Self::Future {
        let this = self.clone();
        Box::pin(this.send(request))
    }
}

/// A network's URLs as one RPC client (fallback and retry), plus the guarded URLs
/// themselves (for the per-URL start-up check). `timeout` is the per-call limit: each of
/// the `n` URLs gets `timeout / n` per attempt, so that a silent first URL leaves time for
/// the next.
pub fn client(
    network: Network,
    urls: Vec<Url>,
    timeout: Duration,
    metrics: Option<&EndpointMetrics>,
) -> (RpcClient, Vec<UrlTransport>) {
    let n = urls.len().max(1);
    let attempt_timeout = timeout / u32::try_from(n).unwrap_or(u32::MAX);
    let transports: Vec<UrlTransport> = urls
        .into_iter()
        .enumerate()
        .map(|(i, url)| UrlTransport::new(network, i, url, attempt_timeout, metrics.cloned()))
        .collect();
    let fallback = FallbackLayer::default()
        .with_active_transport_count(NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN))
        .with_sequential_methods(SEQUENTIAL_METHODS.iter().map(|m| (*m).to_owned()).collect::<HashSet<_>>())
        .layer(transports.clone());
    let retry = RetryBackoffLayer::new(RATE_LIMIT_RETRIES, RATE_LIMIT_BACKOFF_MS, COMPUTE_UNITS_PER_SECOND);
    (RpcClient::new(retry.layer(fallback), false), transports)
}
