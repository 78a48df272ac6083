//! Prometheus metrics. One registry per application instance (no globals), rendered
//! at `GET /metrics` in the text exposition format.

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

/// The service's metrics.
pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub idempotency: IntCounterVec,
    pub payments: IntCounterVec,
    /// Redis idempotency entries ignored because they failed authentication.
    pub cache_rejected: IntCounter,
    pub upstream_seconds: HistogramVec,
    pub rpc_seconds: HistogramVec,
}

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// # Errors
    /// Only on a programming error (duplicate or invalid metric definitions).
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let http_requests = IntCounterVec::new(
            Opts::new("x402_router_http_requests_total", "HTTP requests by route and status"),
            &["route", "status"],
        )?;
        let idempotency = IntCounterVec::new(
            Opts::new("x402_router_idempotency_outcomes_total", "Idempotency decisions by outcome"),
            &["outcome"],
        )?;
        let payments =
            IntCounterVec::new(Opts::new("x402_router_payments_total", "Payments by outcome"), &["outcome"])?;
        let cache_rejected = IntCounter::new(
            "x402_router_cache_entries_rejected_total",
            "Redis idempotency entries ignored because their MAC did not verify (forged, corrupt, of another key)",
        )?;
        let buckets = vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
        let upstream_seconds = HistogramVec::new(
            HistogramOpts::new("x402_router_upstream_seconds", "Upstream exchange latency").buckets(buckets.clone()),
            &["kind"],
        )?;
        let rpc_seconds = HistogramVec::new(
            HistogramOpts::new("x402_router_rpc_seconds", "Chain RPC latency").buckets(buckets),
            &["method"],
        )?;
        registry.register(Box::new(http_requests.clone()))?;
        registry.register(Box::new(idempotency.clone()))?;
        registry.register(Box::new(payments.clone()))?;
        registry.register(Box::new(cache_rejected.clone()))?;
        registry.register(Box::new(upstream_seconds.clone()))?;
        registry.register(Box::new(rpc_seconds.clone()))?;
        Ok(Self { registry, http_requests, idempotency, payments, cache_rejected, upstream_seconds, rpc_seconds })
    }

    /// Counts one idempotency decision (`outcome` is the decision path's label).
    pub fn idempotency_outcome(&self, outcome: &str) {
        self.idempotency.with_label_values(&[outcome]).inc();
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if TextEncoder::new().encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
