//! The command line: `serve`, `migrate`, `gc`, `agents …`, `reconcile`, `receipts verify`, `mcp`.
//!
//! Every setting can come from a flag or from the environment variable named in its
//! help. Values arrive here as raw strings on purpose: `config` turns them into typed
//! settings and reports a missing or malformed one in a single line that names it.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "x402-router", version, about = "Pays x402 APIs for AI agents, at most once per Idempotency-Key")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service (runs pending migrations first unless --no-migrate).
    Serve(Box<ServeArgs>),
    /// Apply pending database migrations and exit.
    Migrate(DatabaseArgs),
    /// Delete expired idempotency rows in bounded batches; prints how many were removed.
    Gc(GcArgs),
    /// Manage agents (the callers of POST /route).
    Agents(Box<AgentsArgs>),
    /// Manage operator tokens (the callers of /audit/*, the exports and /metrics).
    Operators(OperatorsArgs),
    /// Re-check stale payment intents against the chain (safe to run from cron, idempotent);
    /// prints one JSON line of counts, exits non-zero if any intent could not be checked.
    Reconcile(Box<ReconcileArgs>),
    /// Offline receipt tools.
    Receipts(ReceiptsArgs),
    /// Transactions from the router's own wallet (ROUTER_PRIVATE_KEY).
    Wallet(WalletArgs),
    /// Serve the MCP tools (fetch, call_tool, get_receipt, get_budget, discover) on stdin/stdout, as a client of
    /// a running router (no database access).
    Mcp(McpArgs),
    /// Print the OpenAPI 3.1 document (the one served at GET /openapi.json) on stdout.
    Openapi,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Base URL of the running router.
    #[arg(long, env = "X402_ROUTER_URL", default_value = "http://127.0.0.1:8080")]
    pub router_url: String,
    /// The agent's API key (`x4r_…`).
    #[arg(long, env = "X402_ROUTER_AGENT_KEY", hide_env_values = true)]
    pub agent_key: Option<String>,
    /// Longest a `fetch` waits before answering that the call goes on (with its
    /// idempotency_key to collect it), in seconds, 1–3600: MCP clients time tool calls out.
    #[arg(long, env = "MCP_FETCH_WAIT_SECONDS", default_value = "20")]
    pub mcp_fetch_wait_seconds: String,
}

#[derive(Debug, Args, Clone)]
pub struct DatabaseArgs {
    /// Postgres URL (the source of truth).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Largest number of pooled Postgres connections.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value = "16")]
    pub database_pool_size: String,
    /// How long to wait for a pooled Postgres connection before answering 503, in ms.
    #[arg(long, env = "DATABASE_ACQUIRE_TIMEOUT_MS", default_value = "2000")]
    pub database_acquire_timeout_ms: String,
    /// Longest wait of one statement for a lock (Postgres `lock_timeout`), in ms.
    #[arg(long, env = "DB_LOCK_TIMEOUT_MS", default_value = "5000")]
    pub db_lock_timeout_ms: String,
    /// Longest run of one statement (Postgres `statement_timeout`), in ms.
    #[arg(long, env = "DB_STATEMENT_TIMEOUT_MS", default_value = "15000")]
    pub db_statement_timeout_ms: String,
    /// Longest silence of a client inside a transaction before Postgres ends its session and
    /// releases its locks (`idle_in_transaction_session_timeout`), in ms.
    #[arg(long, env = "DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", default_value = "10000")]
    pub db_idle_in_transaction_timeout_ms: String,
}

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

#[derive(Debug, Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Rows deleted per statement.
    #[arg(long, env = "GC_BATCH_SIZE", default_value = "1000")]
    pub gc_batch_size: String,
    /// Average deletion rate limit, rows per second (0: no limit).
    #[arg(long, env = "GC_MAX_ROWS_PER_SECOND", default_value = "10000")]
    pub gc_max_rows_per_second: String,
    /// What agents forwarded (sealed) is dropped from payments older than this, in hours
    /// (the routers' setting).
    #[arg(long, env = "SECRETS_RETENTION_HOURS", default_value = "48")]
    pub secrets_retention_hours: String,
}

#[derive(Debug, Args)]
pub struct AgentsArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(subcommand)]
    pub command: AgentsCommand,
}

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Create an agent and print `{"agent_id", "api_key", "agent"}` (the only time the key is shown).
    Create {
        /// A name for operators.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        limits: AgentLimitArgs,
    },
    /// Change an agent's name or limits (`none` removes a limit).
    Update {
        /// The agent's id.
        id: String,
        /// A new name.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        limits: AgentLimitArgs,
    },
    /// List agents with their limits and spend as JSON lines (never the keys).
    List,
    /// Disable an agent: its key is refused with 403 (by every router within 1 s).
    Disable {
        /// The agent's id.
        id: String,
    },
    /// Enable a disabled agent.
    Enable {
        /// The agent's id.
        id: String,
    },
    /// Give an agent a new key (printed once); the old one is refused within 1 s.
    RotateKey {
        /// The agent's id.
        id: String,
    },
}

/// An agent's limits on the command line; each as for `PATCH /admin/agents/{id}`, with
/// `none` for "no limit".
#[derive(Debug, Args)]
pub struct AgentLimitArgs {
    /// Most the agent may pay in one call, in the asset's atomic units, or `none`.
    #[arg(long)]
    pub max_per_call: Option<String>,
    /// Most the agent may pay in any rolling 24 hours, in atomic units, or `none`.
    #[arg(long)]
    pub daily_budget: Option<String>,
    /// Most the agent may pay in a calendar month (UTC), in atomic units, or `none`.
    #[arg(long)]
    pub month_budget: Option<String>,
    /// Upstream hosts the agent may call, comma-separated (`api.example.com`,
    /// `*.example.com`, either with `:port`), or `none` for any.
    #[arg(long)]
    pub allowed_hosts: Option<String>,
    /// `payTo` addresses the agent may pay, comma-separated, or `none` for any.
    #[arg(long)]
    pub allowed_pay_to: Option<String>,
    /// Calls per minute (paid or not), or `none`.
    #[arg(long)]
    pub calls_per_minute: Option<String>,
    /// Payments per minute, or `none`.
    #[arg(long)]
    pub payments_per_minute: Option<String>,
    /// Most the agent may pay in any rolling 7 days, in atomic units, or `none`.
    #[arg(long)]
    pub week_budget: Option<String>,
    /// Most the agent may ever pay, in atomic units, or `none`.
    #[arg(long)]
    pub lifetime_budget: Option<String>,
    /// Rolling 24 h budgets per upstream host, comma-separated `pattern=amount`
    /// (`api.example.com=50000,*.example.org=1000`), or `none`.
    #[arg(long)]
    pub host_budgets: Option<String>,
    /// `payTo` addresses the agent may never pay, comma-separated, or `none`.
    #[arg(long)]
    pub blocked_pay_to: Option<String>,
    /// A paid call above this price (atomic units) waits for an operator's approval, or `none`.
    #[arg(long)]
    pub approval_above: Option<String>,
}

#[derive(Debug, Args)]
pub struct OperatorsArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(subcommand)]
    pub command: OperatorsCommand,
}

#[derive(Debug, Subcommand)]
pub enum OperatorsCommand {
    /// Create an operator and print `{"operator_id", "name", "role", "token"}` (the only time
    /// the token is shown).
    Create {
        /// A name (it appears in the operator events).
        #[arg(long)]
        name: String,
        /// `viewer` (audit, receipts, exports, metrics) or `admin` (also changes).
        #[arg(long)]
        role: String,
    },
    /// List operators as JSON lines (never the tokens).
    List,
    /// Revoke an operator: its token is refused (401) from then on.
    Revoke {
        /// The operator's id.
        id: String,
    },
}

/// The router's key (`serve`: the paying wallet and the receipt signer; `reconcile`: the
/// receipt signer of recovered answers only).
#[derive(Debug, Args, Clone)]
pub struct KeyArgs {
    /// The paying wallet's secp256k1 key, hex. Prefer --router-private-key-file.
    #[arg(long, env = "ROUTER_PRIVATE_KEY", hide_env_values = true)]
    pub router_private_key: Option<String>,
    /// A file holding the paying wallet's key (hex).
    #[arg(long, env = "ROUTER_PRIVATE_KEY_FILE")]
    pub router_private_key_file: Option<String>,
}

/// Secrets at rest (docs/operations.md, "Secrets at rest").
#[derive(Debug, Args, Clone)]
pub struct SecretsArgs {
    /// A file of the keys that seal what agents forward (headers, URLs, bodies) in the ledger:
    /// one per line, `<key id> <64 hex digits>`; the first seals, every one listed opens.
    /// Unset: a key derived from the wallet key (id `wallet`).
    #[arg(long, env = "SECRETS_KEY_FILE")]
    pub secrets_key_file: Option<String>,
    /// Query parameters whose values are redacted wherever a URL is shown or kept in the clear
    /// (receipts, the audit API, the ledger), comma-separated, any letter case.
    #[arg(long, env = "REDACT_QUERY_PARAMS", default_value = "api_key,key,token,sig")]
    pub redact_query_params: String,
    /// How long what an agent forwarded is kept (sealed) for a takeover or recovery to re-send
    /// it, in hours (1–8760); `gc` drops it after, and as soon as the payment is settled.
    #[arg(long, env = "SECRETS_RETENTION_HOURS", default_value = "48")]
    pub secrets_retention_hours: String,
}

/// The Solana wallet (x402 `exact` on `solana:` networks).
#[derive(Debug, Args, Clone)]
pub struct SolanaArgs {
    /// The paying Solana wallet's key: a JSON array of 64 bytes (as `solana-keygen` writes) or
    /// a base58 keypair. Prefer --solana-private-key-file.
    #[arg(long, env = "SOLANA_PRIVATE_KEY", hide_env_values = true)]
    pub solana_private_key: Option<String>,
    /// A file holding the paying Solana wallet's key.
    #[arg(long, env = "SOLANA_PRIVATE_KEY_FILE")]
    pub solana_private_key_file: Option<String>,
    /// The compute-unit price the router sets on its Solana payments, in micro-lamports (paid
    /// by the upstream's fee payer; at most 5000000). Never taken from an upstream.
    #[arg(long, env = "SOLANA_COMPUTE_UNIT_PRICE", default_value = "1")]
    pub solana_compute_unit_price: String,
}

/// What agents can discover (`GET /discovery`, MCP `discover`): facilitators' catalogues and
/// the Bazaar metadata of the 402s the router saw, kept in memory, bounded.
#[derive(Debug, Args, Clone)]
pub struct DiscoveryArgs {
    /// Base URLs of facilitators whose Bazaar catalogue (`GET <url>/discovery/resources`) the
    /// router reads, comma-separated (at most 16). Fetched like any upstream (SSRF guard,
    /// timeouts, size limits). Empty: only what the router's own 402s show.
    #[arg(long, env = "X402_DISCOVERY_URLS", default_value = "")]
    pub x402_discovery_urls: String,
    /// How often each catalogue is read again, in seconds (10–86400).
    #[arg(long, env = "X402_DISCOVERY_REFRESH_SECONDS", default_value = "300")]
    pub x402_discovery_refresh_seconds: String,
    /// An entry not read again (catalogue) or seen again (402) within this many seconds is
    /// dropped (at least the refresh interval, at most 7 days).
    #[arg(long, env = "X402_DISCOVERY_MAX_AGE_SECONDS", default_value = "3600")]
    pub x402_discovery_max_age_seconds: String,
    /// Most entries kept in all (the oldest dropped first), 1–100000.
    #[arg(long, env = "X402_DISCOVERY_MAX_ENTRIES", default_value = "2000")]
    pub x402_discovery_max_entries: String,
    /// Most bytes the kept entries may take in all (the oldest dropped first), 64 KiB–256 MiB.
    #[arg(long, env = "X402_DISCOVERY_MAX_BYTES", default_value = "8388608")]
    pub x402_discovery_max_bytes: String,
}

/// How upstreams are reached (the SSRF policy and limits).
#[derive(Debug, Args, Clone)]
pub struct UpstreamArgs {
    /// Allow upstreams on loopback/private/link-local addresses (local development and tests).
    #[arg(long, env = "UPSTREAM_ALLOW_PRIVATE", default_value = "false")]
    pub upstream_allow_private: String,
    /// Comma-separated CIDRs that are allowed even though they are private (e.g. `10.1.2.0/24`).
    #[arg(long, env = "UPSTREAM_ALLOW_CIDRS", default_value = "")]
    pub upstream_allow_cidrs: String,
    /// Upstream connect timeout, in ms.
    #[arg(long, env = "UPSTREAM_CONNECT_TIMEOUT_MS", default_value = "5000")]
    pub upstream_connect_timeout_ms: String,
    /// Upstream timeout for one whole exchange (request and response body), in ms.
    #[arg(long, env = "UPSTREAM_TIMEOUT_MS", default_value = "30000")]
    pub upstream_timeout_ms: String,
    /// Largest upstream response body the router accepts, in bytes.
    #[arg(long, env = "UPSTREAM_MAX_RESPONSE_BYTES", default_value = "1048576")]
    pub upstream_max_response_bytes: String,
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Networks and their RPC URLs: `eip155:84532=http://…,…` (the routers' setting).
    #[arg(long, env = "X402_RPC_URLS", default_value = "")]
    pub x402_rpc_urls: String,
    /// Timeout of each chain RPC call, in ms.
    #[arg(long, env = "X402_RPC_TIMEOUT_MS", default_value = "5000")]
    pub x402_rpc_timeout_ms: String,
    /// Only intents last written longer ago than this, in seconds (the grace period).
    #[arg(long, env = "RECONCILE_OLDER_THAN_SECS", default_value = "120")]
    pub older_than_secs: String,
    /// An in-flight key whose heartbeat is older than this has no live owner, in ms
    /// (the routers' IDEMPOTENCY_ABANDON_AFTER_MS).
    #[arg(long, env = "IDEMPOTENCY_ABANDON_AFTER_MS", default_value = "60000")]
    pub abandon_after_ms: String,
    /// With the router's key (used only to sign the receipt of a recovered answer), also try
    /// to recover answers lost after a settled payment (byte-identical re-send to upstreams
    /// that advertised payment-identifier; never a new payment). Without it: no recovery.
    #[command(flatten)]
    pub key: KeyArgs,
    /// The keys that open what recovery re-sends (the routers' settings).
    #[command(flatten)]
    pub secrets: SecretsArgs,
    /// How upstreams are reached by recovery (the routers' settings).
    #[command(flatten)]
    pub upstream: UpstreamArgs,
    /// Most payments one run tries to recover.
    #[arg(long, env = "RECONCILE_MAX_RECOVERIES", default_value = "50")]
    pub max_recoveries: String,
    /// Longest time one run spends recovering, in seconds.
    #[arg(long, env = "RECONCILE_RECOVERY_SECS", default_value = "120")]
    pub recovery_secs: String,
}

#[derive(Debug, Args)]
pub struct WalletArgs {
    #[command(subcommand)]
    pub command: WalletCommand,
}

#[derive(Debug, Subcommand)]
pub enum WalletCommand {
    /// Let Uniswap Permit2 move a configured token from the router's wallet (ERC-20
    /// `approve`), for upstreams that answer 412 `permit2_allowance_required`; waits for the
    /// receipt and prints one JSON line with the transaction hash and the new allowance.
    ApprovePermit2(ApprovePermit2Args),
}

#[derive(Debug, Args)]
pub struct ApprovePermit2Args {
    /// The network (CAIP-2 id or v1 name); it must have an RPC URL in X402_RPC_URLS.
    #[arg(long)]
    pub network: String,
    /// The token: one the router pays with on that network (X402_ASSETS, or the built-in USDC).
    #[arg(long)]
    pub asset: String,
    /// The allowance, in the token's atomic units, or `max` (2^256-1, never decremented).
    #[arg(long, default_value = "max")]
    pub amount: String,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Networks and their RPC URLs: `eip155:84532=http://…,…` (the routers' setting).
    #[arg(long, env = "X402_RPC_URLS", default_value = "")]
    pub x402_rpc_urls: String,
    /// Token contracts per network (the routers' setting).
    #[arg(long, env = "X402_ASSETS", default_value = "")]
    pub x402_assets: String,
    /// Timeout of each chain RPC call, in ms.
    #[arg(long, env = "X402_RPC_TIMEOUT_MS", default_value = "5000")]
    pub x402_rpc_timeout_ms: String,
    /// How long to wait for the approval to be mined, in seconds.
    #[arg(long, default_value = "120")]
    pub wait_secs: String,
}

#[derive(Debug, Args)]
pub struct ReceiptsArgs {
    #[command(subcommand)]
    pub command: ReceiptsCommand,
}

#[derive(Debug, Subcommand)]
pub enum ReceiptsCommand {
    /// Verify a receipt's signature offline: prints `valid: signed by 0x…` (exit 0) or
    /// `invalid: <reason>` (exit 1); exit 2 if the file cannot be read. Compare the signer
    /// with `receipt_signer` of GET /.well-known/x402-router.
    Verify {
        /// A receipt JSON file (as served by GET /receipts/{id}), or `-` for stdin.
        file: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
