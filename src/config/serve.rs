//! The flags of `serve`: every setting of a serving router, as given (strings, parsed by
//! [`super::Config::from_args`]).

use clap::Args;

use super::{DatabaseArgs, DiscoveryArgs, KeyArgs, SecretsArgs, SolanaArgs, UpstreamArgs};

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Redis URL (hot cache only; the service keeps answering correctly without it).
    /// `rediss://` for TLS, with `?sslmode=require|verify-ca|verify-full&sslrootcert=FILE`;
    /// with --redis-cluster, a comma-separated list of seed nodes.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// REDIS_URL names Redis Cluster nodes (follows MOVED/ASK redirections).
    #[arg(long, env = "REDIS_CLUSTER", default_value = "false")]
    pub redis_cluster: String,
    /// REDIS_URL names Redis Sentinels; the cache uses the master of this name (and follows
    /// its failovers).
    #[arg(long, env = "REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,
    /// Timeout of every Redis call, in ms. Past it the request continues on Postgres.
    #[arg(long, env = "REDIS_TIMEOUT_MS", default_value = "50")]
    pub redis_timeout_ms: String,
    /// Prefix of every Redis key (lets several deployments or tests share one Redis).
    #[arg(long, env = "REDIS_KEY_PREFIX", default_value = "")]
    pub redis_key_prefix: String,
    /// Address to listen on.
    #[arg(long, env = "BIND", default_value = "127.0.0.1:8080")]
    pub bind: String,
    #[command(flatten)]
    pub key: KeyArgs,
    #[command(flatten)]
    pub secrets: SecretsArgs,
    #[command(flatten)]
    pub solana: SolanaArgs,
    /// Networks the router pays on and their RPC URLs: `eip155:84532=http://…,…`; a network
    /// listed again gets another URL (fallback, in the order given). Solana networks:
    /// `solana:<genesis hash prefix>=http://…` (one URL each).
    #[arg(long, env = "X402_RPC_URLS", default_value = "")]
    pub x402_rpc_urls: String,
    /// WebSocket JSON-RPC URLs of EVM networks for the chain index (`eip155:84532=wss://…,…`;
    /// one per network, which must also have an RPC URL): the paid path then reads nothing
    /// from the chain in the common case (docs/DESIGN.md §6). Empty: no index.
    #[arg(long, env = "X402_WS_URLS", default_value = "")]
    pub x402_ws_urls: String,
    /// How many blocks back the chain index reads at start-up (what it knows of payments older
    /// than that comes from the chain itself).
    #[arg(long, env = "X402_INDEX_LOOKBACK_BLOCKS", default_value = "100000")]
    pub x402_index_lookback_blocks: String,
    /// Token contracts the router pays with, per network: `eip155:84532=0x…[@decimals][+permit2],…`
    /// (decimals read from the token when not given; `+permit2`: no EIP-3009, paid only via
    /// Permit2). Empty: USDC on Base and Base Sepolia. Solana: `solana:<ref>=<mint>@<decimals>`
    /// (USDC on mainnet and devnet when none is given).
    #[arg(long, env = "X402_ASSETS", default_value = "")]
    pub x402_assets: String,
    /// The currency agents' caps and budgets are counted in when the assets have different
    /// decimals (e.g. `USD`); empty: budgets are atomic units of the one unit every asset shares.
    #[arg(long, env = "BUDGET_CURRENCY", default_value = "")]
    pub budget_currency: String,
    /// Decimals of the budget currency's atomic unit (with `BUDGET_CURRENCY`).
    #[arg(long, env = "BUDGET_DECIMALS", default_value = "6")]
    pub budget_decimals: String,
    /// With `BUDGET_CURRENCY`: what one whole token of each asset is worth in it,
    /// `eip155:84532=0x…=1,eip155:1=0x…=123/100` (whole numbers or fractions; Circle's USDC: 1
    /// when not given; every other asset must be given).
    #[arg(long, env = "X402_ASSET_VALUES", default_value = "")]
    pub x402_asset_values: String,
    /// Timeout of each chain RPC call, in ms.
    #[arg(long, env = "X402_RPC_TIMEOUT_MS", default_value = "5000")]
    pub x402_rpc_timeout_ms: String,
    /// Longest lifetime of a signed authorization in seconds, whatever an upstream's
    /// maxTimeoutSeconds asks (validBefore = now + min(maxTimeoutSeconds, this)).
    #[arg(long, env = "X402_MAX_AUTH_SECONDS", default_value = "300")]
    pub x402_max_auth_seconds: String,
    /// Payment schemes the operator opts into beside `exact` and `upto` (comma-separated;
    /// `batch-settlement`). Empty: none.
    #[arg(long, env = "X402_SCHEMES", default_value = "")]
    pub x402_schemes: String,
    /// A batch-settlement deposit is this many times the price (at least 1).
    #[arg(long, env = "X402_BATCH_DEPOSIT_MULTIPLIER", default_value = "10")]
    pub x402_batch_deposit_multiplier: String,
    /// The most one batch-settlement channel may hold deposited, in atomic units.
    #[arg(long, env = "X402_BATCH_MAX_DEPOSIT", default_value = "1000000")]
    pub x402_batch_max_deposit: String,
    /// The longest withdraw delay (seconds) a batch-settlement channel may have.
    #[arg(long, env = "X402_BATCH_MAX_WITHDRAW_DELAY_SECONDS", default_value = "86400")]
    pub x402_batch_max_withdraw_delay_seconds: String,
    /// Channels (lanes) per upstream for parallel calls.
    #[arg(long, env = "X402_BATCH_LANES", default_value = "4")]
    pub x402_batch_lanes: String,
    /// Bootstrap admin bearer token for the operator API (/audit/*, /metrics); operator
    /// tokens made by `operators create` work with or without it.
    #[arg(long, env = "OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<String>,
    /// Failed operator authentications (unknown, revoked or missing tokens, agent keys) one
    /// client address (the TCP peer) may make per window; past it every operator request
    /// from it gets 429 with Retry-After, the token not even looked up. 0 turns it off.
    #[arg(long, env = "OPERATOR_AUTH_MAX_FAILURES", default_value = "10")]
    pub operator_auth_max_failures: String,
    /// The window of OPERATOR_AUTH_MAX_FAILURES, in ms, from an address's first failure.
    #[arg(long, env = "OPERATOR_AUTH_WINDOW_MS", default_value = "60000")]
    pub operator_auth_window_ms: String,
    /// Most client addresses whose failures are tracked at once (the oldest dropped first).
    #[arg(long, env = "OPERATOR_AUTH_MAX_ADDRESSES", default_value = "10000")]
    pub operator_auth_max_addresses: String,
    /// A second listener serving only GET /metrics, without authentication, for Prometheus on
    /// a private interface (e.g. 127.0.0.1:9464). The main listener's /metrics always needs an
    /// operator token.
    #[arg(long, env = "METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    #[command(flatten)]
    pub upstream: UpstreamArgs,
    /// Largest POST /route request body, in bytes.
    #[arg(long, env = "REQUEST_MAX_BYTES", default_value = "262144")]
    pub request_max_bytes: String,
    /// An in-flight idempotency row whose heartbeat is older than this is abandoned, in ms.
    #[arg(long, env = "IDEMPOTENCY_ABANDON_AFTER_MS", default_value = "60000")]
    pub idempotency_abandon_after_ms: String,
    /// How often a running request refreshes its in-flight row, in ms.
    #[arg(long, env = "IDEMPOTENCY_HEARTBEAT_MS", default_value = "10000")]
    pub idempotency_heartbeat_ms: String,
    /// Deadline of one routed call (payment + upstream), in ms.
    #[arg(long, env = "ROUTE_DEADLINE_MS", default_value = "50000")]
    pub route_deadline_ms: String,
    /// Log format: `text` or `json`.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// HTTP worker threads (0: one per core).
    #[arg(long, env = "WORKERS", default_value = "0")]
    pub workers: String,
    /// On SIGTERM/SIGINT, how long in-flight requests may finish before the process exits,
    /// in seconds. Keep it below the orchestrator's grace period (Kubernetes: 30 s by
    /// default). A request cut off here stays in flight and is taken over by a retry.
    #[arg(long, env = "SHUTDOWN_TIMEOUT_SECS", default_value = "25")]
    pub shutdown_timeout_secs: String,
    /// Recover a paid answer lost to a crash when a takeover finds its payment used: re-send
    /// the stored request and payment byte for byte to an upstream that advertised
    /// payment-identifier (never a new payment). `false`: such answers are reported lost.
    #[arg(long, env = "RECOVER_LOST_ANSWERS", default_value = "true")]
    pub recover_lost_answers: String,
    /// Longest an MCP `fetch` (`/mcp`) waits before answering that the call goes on (with its
    /// idempotency_key to collect it), in seconds, 1–3600: MCP clients time tool calls out.
    #[arg(long, env = "MCP_FETCH_WAIT_SECONDS", default_value = "20")]
    pub mcp_fetch_wait_seconds: String,
    /// How long a payment held for an operator's approval waits for a decision before it
    /// expires (403 `approval_expired`): whole seconds, or with a unit (`90s`, `30m`, `1h`,
    /// `2d`), from 1 s to 7 d.
    #[arg(long, env = "APPROVAL_TTL", default_value = "1h")]
    pub approval_ttl: String,
    /// The two-person rule: an admin change that raises spending power waits for a second
    /// admin's confirmation (`/admin/changes`).
    #[arg(long, env = "REQUIRE_SECOND_ADMIN", default_value = "false")]
    pub require_second_admin: String,
    /// How long a proposed change waits for a second admin before it expires: as
    /// `APPROVAL_TTL`, from 1 s to 7 d.
    #[arg(long, env = "CHANGE_TTL", default_value = "24h")]
    pub change_ttl: String,
    /// Pay ahead: remember each upstream's last payment requirements (per agent, method and
    /// URL without query) this many seconds, at most, and pay the next call on its first
    /// request instead of probing unpaid first. 0 turns it off; at most 86400.
    #[arg(long, env = "REQUIREMENTS_CACHE_SECONDS", default_value = "300")]
    pub requirements_cache_seconds: String,
    /// Most payment requirements remembered at once (the oldest is dropped first), 1–1000000.
    #[arg(long, env = "REQUIREMENTS_CACHE_ENTRIES", default_value = "4096")]
    pub requirements_cache_entries: String,
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
    /// Do not run pending migrations at start.
    #[arg(long, env = "NO_MIGRATE", default_value = "false")]
    pub no_migrate: String,
}
