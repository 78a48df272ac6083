//! Prometheus metrics. One registry per application instance (no globals), rendered
//! at `GET /metrics` in the text exposition format.

use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// The service's metrics.
pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    /// `x402_router_http_request_duration_seconds{route, status}`.
    pub http_duration: HistogramVec,
    /// `x402_router_wallet_balance{network, asset}`: the paying wallet's token balance in
    /// atomic units, refreshed by `audit::balance::spawn_balance_refresh`.
    pub wallet_balance: GaugeVec,
    /// `x402_router_rpc_errors_total{method}`: chain reads that failed or timed out.
    pub rpc_errors: IntCounterVec,
    /// The payment ledger as `audit::ledger_gauges` last read it (all routers see the
    /// same ledger; alert on `max` across instances).
    pub paid_not_served: Gauge,
    pub stuck_intents: Gauge,
    /// Batch-settlement channels the router stopped signing on (a server contradicted its
    /// records, or claimed more than it counts as charged).
    pub channels_stopped: Gauge,
    pub budget_used: GaugeVec,
    pub idempotency: IntCounterVec,
    pub payments: IntCounterVec,
    /// Takeovers that found a payment settled and its answer lost:
    /// `x402_router_recoveries_total{outcome}`, outcome `recovered`, `reaccessed` or `lost`.
    pub recoveries: IntCounterVec,
    /// `x402_router_payments_recovery{outcome}`: payments of the last 24 h by how recovery of
    /// their lost answer ended (`recovered`, `reaccessed`, `lost`; takeovers and `reconcile`
    /// alike), as `audit::gauges` last read the ledger.
    pub recovery_outcomes: IntGaugeVec,
    /// Redis idempotency entries ignored because they failed authentication.
    pub cache_rejected: IntCounter,
    pub upstream_seconds: HistogramVec,
    pub rpc_seconds: HistogramVec,
    /// Per RPC URL (labelled by its position among its network's URLs, never by the URL,
    /// which may carry an API key): `x402_router_rpc_endpoint_requests_total{network,
    /// endpoint, outcome}` (outcome `ok`, `error`, `timeout`, `wrong_chain`),
    /// `x402_router_rpc_endpoint_seconds{network, endpoint}` and
    /// `x402_router_rpc_endpoint_up{network, endpoint}` (1: its last attempt answered).
    pub rpc_endpoint_requests: IntCounterVec,
    pub rpc_endpoint_seconds: HistogramVec,
    pub rpc_endpoint_up: IntGaugeVec,
    /// `x402_router_paid_amount_total{network, asset}`: atomic units paid by payments that
    /// became `settled` or `settled_response_lost` in this process. A counter is a u64: an
    /// amount beyond 2^64-1 adds 2^64-1 (saturates), and so does the sum.
    pub paid_amount: IntCounterVec,
    /// `x402_router_payments_by_status{status}`: payment intents per ledger status (all time),
    /// as `audit::gauges` last read the ledger.
    pub payments_by_status: IntGaugeVec,
    /// `x402_router_operator_auth_failures_total{reason}`: operator authentications refused,
    /// reason `missing` (no token), `unknown` (no live operator has it, nor is it
    /// `OPERATOR_TOKEN`) or `agent_key`.
    pub operator_auth_failures: IntCounterVec,
    /// `x402_router_operator_auth_throttled_total`: operator requests refused (429) because
    /// their address failed too often, the token not looked up.
    pub operator_auth_throttled: IntCounter,
    /// `x402_router_build_info{version}` = 1.
    pub build_info: IntGaugeVec,
    /// `x402_router_chain_index_live{network}`: 1 while the chain index answers.
    pub chain_index_live: IntGaugeVec,
    /// `x402_router_chain_index_answers_total{answer}`: what the chain index said instead of
    /// an RPC read (`used`, `unused`, `proof`), or that it could not (`unknown`, `no_proof`).
    pub chain_index_answers: IntCounterVec,
    /// `x402_router_db_statements_total{pool, kind}`: statements the pool's connections sent,
    /// `kind` `query` or `control` (BEGIN, COMMIT, ROLLBACK, savepoints); `pool` `main` or
    /// `heartbeat` (`db::traffic`).
    pub db_statements: IntCounterVec,
    /// `x402_router_db_transactions_total{pool}`: transactions they ran (a statement outside
    /// an explicit transaction counts as one).
    pub db_transactions: IntCounterVec,
}

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// # Errors
    /// Only on a programming error (duplicate or invalid metric definitions).
    pub fn new() -> Result<Self, prometheus::Error> {
        let r = Registered(Registry::new());
        let latency = vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
        let mut http_buckets = latency.clone();
        http_buckets.push(60.0);
        let build_info = r.int_gauges("x402_router_build_info", "The router's version (always 1)", &["version"])?;
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let metrics = Self {
            http_requests: r.counters("x402_router_http_requests_total", "HTTP requests by route and status", &["route", "status"])?,
            http_duration: r.histograms(HistogramOpts::new("x402_router_http_request_duration_seconds", "HTTP request duration by route and status").buckets(http_buckets), &["route", "status"])?,
            wallet_balance: r.add(GaugeVec::new(Opts::new("x402_router_wallet_balance", "The paying wallet's token balance, in atomic units"), &["network", "asset"])?)?,
            rpc_errors: r.counters("x402_router_rpc_errors_total", "Chain RPC reads that failed or timed out", &["method"])?,
            paid_not_served: r.add(Gauge::new("x402_router_payments_paid_not_served", "Payments settled in the last 24 h whose call was not served (see /audit/payments?status=paid_not_served)")?)?,
            stuck_intents: r.add(Gauge::new("x402_router_payments_stuck", "Payment intents still signed/unknown/unconfirmed 15 minutes after their last update")?)?,
            channels_stopped: r.add(Gauge::new("x402_router_batch_channels_stopped", "Batch-settlement channels the router stopped signing on: their server contradicted its records or claimed more than charged")?)?,
            budget_used: r.add(GaugeVec::new(Opts::new("x402_router_agent_budget_used_ratio", "Share of a budget spent or reserved: budget=24h, month, 7d or lifetime per agent, budget=wallet for the wallet-wide daily cap (agent_id empty)"), &["agent_id", "budget"])?)?,
            cache_rejected: r.add(IntCounter::new("x402_router_cache_entries_rejected_total", "Redis idempotency entries ignored because their MAC did not verify (forged, corrupt, of another key)")?)?,
            idempotency: r.counters("x402_router_idempotency_outcomes_total", "Idempotency decisions by outcome", &["outcome"])?,
            payments: r.counters("x402_router_payments_total", "Payments by outcome", &["outcome"])?,
            recoveries: r.counters("x402_router_recoveries_total", "Recoveries of paid answers that were lost, by outcome", &["outcome"])?,
            recovery_outcomes: r.int_gauges("x402_router_payments_recovery", "Payments of the last 24 h whose lost answer recovery tried, by outcome (recovered, reaccessed, lost)", &["outcome"])?,
            upstream_seconds: r.histograms(HistogramOpts::new("x402_router_upstream_seconds", "Upstream exchange latency").buckets(latency.clone()), &["kind"])?,
            rpc_seconds: r.histograms(HistogramOpts::new("x402_router_rpc_seconds", "Chain RPC latency").buckets(latency.clone()), &["method"])?,
            rpc_endpoint_requests: r.counters("x402_router_rpc_endpoint_requests_total", "JSON-RPC attempts per RPC URL (endpoint = its position among the network's URLs) by outcome", &["network", "endpoint", "outcome"])?,
            rpc_endpoint_seconds: r.histograms(HistogramOpts::new("x402_router_rpc_endpoint_seconds", "JSON-RPC attempt latency per RPC URL").buckets(latency), &["network", "endpoint"])?,
            rpc_endpoint_up: r.int_gauges("x402_router_rpc_endpoint_up", "1 when the RPC URL's last attempt answered, else 0", &["network", "endpoint"])?,
            paid_amount: r.counters("x402_router_paid_amount_total", "Atomic units paid by settled payments (saturates at 2^64-1)", &["network", "asset"])?,
            payments_by_status: r.int_gauges("x402_router_payments_by_status", "Payment intents in the ledger by status", &["status"])?,
            operator_auth_failures: r.counters("x402_router_operator_auth_failures_total", "Operator authentications refused, by reason (missing, unknown, agent_key)", &["reason"])?,
            operator_auth_throttled: r.add(IntCounter::new("x402_router_operator_auth_throttled_total", "Operator requests refused (429) because their client address failed to authenticate too often")?)?,
            build_info,
            chain_index_live: r.int_gauges("x402_router_chain_index_live", "1 while the chain index of the network answers (subscribed, caught up, not lagging)", &["network"])?,
            chain_index_answers: r.counters("x402_router_chain_index_answers_total", "Answers of the chain index instead of an RPC read (used, unused, proof) or not (unknown, no_proof)", &["answer"])?,
            db_statements: r.counters("x402_router_db_statements_total", "Statements sent to Postgres by pool (main, heartbeat) and kind (query, control: BEGIN/COMMIT/ROLLBACK/savepoints)", &["pool", "kind"])?,
            db_transactions: r.counters("x402_router_db_transactions_total", "Postgres transactions by pool (a statement outside an explicit transaction counts as one)", &["pool"])?,
            registry: r.0,
        };
        // Shown at 0 before the first failure (an alert on the rate needs the series).
        for reason in ["missing", "unknown", "agent_key"] {
            metrics.operator_auth_failures.with_label_values(&[reason]);
        }
        // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, … (Linux).
        #[cfg(target_os = "linux")]
        metrics.registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
        Ok(metrics)
    }

    /// Adds a settled payment's amount (atomic units) to `x402_router_paid_amount_total`,
    /// saturating at `u64::MAX` (a Prometheus counter holds no more).
    pub fn count_paid(&self, network: &str, asset: &str, amount: alloy::primitives::U256) {
        let counter = self.paid_amount.with_label_values(&[network, asset]);
        let add = u64::try_from(amount).unwrap_or(u64::MAX).min(u64::MAX - counter.get());
        counter.inc_by(add);
    }

    /// The counters a pool's connections count their statements into (`pool`: `main` or
    /// `heartbeat`).
    pub fn db_traffic(&self, pool: &str) -> crate::db::Traffic {
        crate::db::Traffic {
            queries: self.db_statements.with_label_values(&[pool, "query"]),
            control: self.db_statements.with_label_values(&[pool, "control"]),
            transactions: self.db_transactions.with_label_values(&[pool]),
        }
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

/// A registry that hands back each metric it registers.
struct Registered(Registry);

impl Registered {
    fn add<C: prometheus::core::Collector + Clone + 'static>(&self, metric: C) -> Result<C, prometheus::Error> {
        self.0.register(Box::new(metric.clone()))?;
        Ok(metric)
    }

    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
        self.add(IntCounterVec::new(Opts::new(name, help), labels)?)
    }

    fn int_gauges(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec, prometheus::Error> {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels)?)
    }

    fn histograms(&self, opts: HistogramOpts, labels: &[&str]) -> Result<HistogramVec, prometheus::Error> {
        self.add(HistogramVec::new(opts, labels)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paid_amounts_add_up_and_saturate_at_u64_max() {
        let m = Metrics::new().unwrap();
        m.count_paid("eip155:84532", "0xA", alloy::primitives::U256::from(10_000u64));
        m.count_paid("eip155:84532", "0xA", alloy::primitives::U256::from(5u64));
        assert_eq!(m.paid_amount.with_label_values(&["eip155:84532", "0xA"]).get(), 10_005);
        m.count_paid("eip155:84532", "0xB", alloy::primitives::U256::MAX);
        m.count_paid("eip155:84532", "0xB", alloy::primitives::U256::from(1u64));
        assert_eq!(m.paid_amount.with_label_values(&["eip155:84532", "0xB"]).get(), u64::MAX);
        let text = m.render();
        assert!(text.contains("x402_router_build_info{version=\""), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            assert!(line.starts_with("x402_router_") || line.starts_with("process_"), "{line}");
        }
    }
}
