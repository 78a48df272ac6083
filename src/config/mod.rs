//! Typed settings, built once from the raw CLI/env strings.
//!
//! Start-up fails fast: a missing or malformed setting becomes one [`ConfigError`] line
//! that names the environment variable and the flag. Secrets live in [`Secret`], whose
//! `Debug` never prints the value.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use alloy::primitives::Address;
use alloy::signers::local::PrivateKeySigner;
use ipnet::IpNet;
use url::Url;

use crate::cli::{DatabaseArgs, KeyArgs, ServeArgs, UpstreamArgs};
pub use crate::idempotency::IdempotencyTiming;
use crate::x402::Network;

pub mod budget;
pub mod discovery;
mod parse;
pub mod secrets;
pub mod solana;
pub mod symbols;

pub use self::discovery::DiscoveryConfig;
pub use self::parse::{
    Assets, OperatorAuthLimits, parse_mcp_wait, parse_ms, parse_num, parse_operator_auth, parse_requirements_cache,
    parse_rpc_urls,
};
use self::parse::{parse_assets, parse_bool, parse_cidrs, parse_max_auth, required};
pub use self::secrets::SecretsConfig;

/// A setting that is missing or malformed. Displayed as one line naming the setting's
/// environment variable and flag (by default the variable in lower case with dashes).
#[derive(Debug, thiserror::Error)]
#[error("invalid setting {env} (--{}): {reason}", self.flag())]
pub struct ConfigError {
    env: &'static str,
    flag: Option<&'static str>,
    reason: String,
}

impl ConfigError {
    fn new(env: &'static str, reason: impl Into<String>) -> Self {
        Self { env, flag: None, reason: reason.into() }
    }

    /// The same error for a sub-command whose flag is not named after the variable.
    pub fn for_flag(mut self, flag: &'static str) -> Self {
        self.flag = Some(flag);
        self
    }

    fn flag(&self) -> String {
        self.flag.map_or_else(|| self.env.to_ascii_lowercase().replace('_', "-"), str::to_owned)
    }
}

/// A secret string: never printed by `Debug`.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// Postgres settings shared by every sub-command.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    pub url: Secret,
    /// The URL parsed, with its TLS settings (`sslmode`, `sslrootcert`): see `db::tls`.
    pub connector: crate::db::Connector,
    pub pool_size: u32,
    pub acquire_timeout: Duration,
    /// Bounded waits of every pooled session (see [`Self::session_url`]).
    pub lock_timeout: Duration,
    pub statement_timeout: Duration,
    pub idle_in_transaction_timeout: Duration,
}

impl DatabaseConfig {
    /// The connection pool of these settings (nothing is connected yet).
    /// Its sessions carry the bounded waits of [`Self::session_url`].
    pub fn pool(&self) -> crate::db::PgPool {
        // Both were validated when the configuration was built.
        let session = self.session_url().ok();
        let connector = session
            .as_ref()
            .and_then(|u| crate::db::Connector::from_url(u.expose()).ok())
            .unwrap_or_else(|| self.connector.clone());
        crate::db::pool(&crate::db::PoolSettings {
            url: session.as_ref().map_or(self.url.expose(), |u| u.expose()),
            connector: &connector,
            size: self.pool_size,
            acquire_timeout: self.acquire_timeout,
        })
    }

    pub fn from_args(args: &DatabaseArgs) -> Result<Self, ConfigError> {
        let url = required("DATABASE_URL", args.database_url.as_deref())?;
        crate::db::conninfo::ConnInfo::parse(url).map_err(|e| ConfigError::new("DATABASE_URL", e.0))?;
        let connector = crate::db::Connector::from_url(url).map_err(|e| ConfigError::new("DATABASE_URL", e.0))?;
        let pool_size = parse_num::<u32>("DATABASE_POOL_SIZE", &args.database_pool_size)?;
        if pool_size == 0 {
            return Err(ConfigError::new("DATABASE_POOL_SIZE", "must be at least 1"));
        }
        let config = Self {
            url: Secret::new(url.to_owned()),
            connector,
            pool_size,
            acquire_timeout: parse_ms("DATABASE_ACQUIRE_TIMEOUT_MS", &args.database_acquire_timeout_ms)?,
            lock_timeout: parse_ms("DB_LOCK_TIMEOUT_MS", &args.db_lock_timeout_ms)?,
            statement_timeout: parse_ms("DB_STATEMENT_TIMEOUT_MS", &args.db_statement_timeout_ms)?,
            idle_in_transaction_timeout: parse_ms(
                "DB_IDLE_IN_TRANSACTION_TIMEOUT_MS",
                &args.db_idle_in_transaction_timeout_ms,
            )?,
        };
        let session = config.session_url()?;
        crate::db::Connector::from_url(session.expose()).map_err(|e| ConfigError::new("DATABASE_URL", e.0))?;
        Ok(config)
    }

    /// The URL the pools connect with: `DATABASE_URL` plus the session settings that bound
    /// every wait, passed as the connection's `options` (so they hold from the first
    /// statement, whatever code opens the connection): `lock_timeout`, `statement_timeout`
    /// and `idle_in_transaction_session_timeout`. The last one is what frees the locks of a
    /// router that stopped inside a transaction (frozen VM, SIGSTOP, debugger): Postgres ends
    /// its session, the transaction rolls back, and every other router may proceed.
    /// Options already in the URL are kept (later `-c` settings win).
    ///
    /// # Errors
    /// A `DATABASE_URL` that is neither a URL nor key/value pairs.
    pub fn session_url(&self) -> Result<Secret, ConfigError> {
        let mut info = crate::db::conninfo::ConnInfo::parse(self.url.expose())
            .map_err(|e| ConfigError::new("DATABASE_URL", e.0))?;
        let ms = |d: Duration| d.as_millis();
        let ours = format!(
            "-c lock_timeout={} -c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            ms(self.lock_timeout),
            ms(self.statement_timeout),
            ms(self.idle_in_transaction_timeout),
        );
        info.append("options", &ours);
        Ok(Secret::new(info.to_string()))
    }
}

/// Upstream HTTP client settings and the SSRF policy.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub allow_private: bool,
    pub allow_cidrs: Vec<IpNet>,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub max_response_bytes: usize,
}

impl UpstreamConfig {
    /// # Errors
    /// The first malformed setting, naming it.
    pub fn from_args(args: &UpstreamArgs) -> Result<Self, ConfigError> {
        Ok(Self {
            allow_private: parse_bool("UPSTREAM_ALLOW_PRIVATE", &args.upstream_allow_private)?,
            allow_cidrs: parse_cidrs(&args.upstream_allow_cidrs)?,
            connect_timeout: parse_ms("UPSTREAM_CONNECT_TIMEOUT_MS", &args.upstream_connect_timeout_ms)?,
            timeout: parse_ms("UPSTREAM_TIMEOUT_MS", &args.upstream_timeout_ms)?,
            max_response_bytes: parse_num("UPSTREAM_MAX_RESPONSE_BYTES", &args.upstream_max_response_bytes)?,
        })
    }
}

/// What the router is willing to pay with.
#[derive(Debug, Clone)]
pub struct PaymentConfig {
    /// Network → its RPC URLs, in order of preference (fallback, see `x402::rpc`). A network
    /// without one is never paid on.
    pub rpc_urls: BTreeMap<Network, Vec<Url>>,
    /// Network → token contracts the router pays with.
    pub assets: BTreeMap<Network, Vec<Address>>,
    /// Decimals of the assets that are configured (`@6`) or built in; the others are read
    /// from the token before serving (`startup::preflight`).
    pub decimals: BTreeMap<(Network, Address), u8>,
    /// Assets configured `+permit2` (no EIP-3009): paid only via Permit2, and their
    /// `authorizationState` is never asked.
    pub permit2_only: BTreeSet<(Network, Address)>,
    /// Symbols of the assets, only ever shown: `USDC` for the built-in USDC, the others read
    /// from the token before serving (`startup::preflight`; none when unreadable).
    pub symbols: BTreeMap<(Network, Address), String>,
    pub rpc_timeout: Duration,
    /// Network → its WebSocket URL for the chain index (`X402_WS_URLS`; none: no index).
    pub ws_urls: BTreeMap<Network, Url>,
    /// How many blocks back the chain index reads at start-up.
    pub index_lookback_blocks: u64,
    /// Longest lifetime of a signed authorization, whatever an upstream asks
    /// (`validBefore = now + min(maxTimeoutSeconds, this)`).
    pub max_auth_secs: u64,
    /// Paying with x402 `batch-settlement` channels (`X402_SCHEMES` names it); `None`: off.
    pub batch: Option<BatchConfig>,
    /// The budget currency (`BUDGET_CURRENCY`): assets of different decimals share budgets
    /// counted in it; `None`: every asset shares one unit (checked by [`Self::check_one_unit`]).
    pub budget: Option<budget::BudgetConfig>,
}

/// The operator's bounds on batch-settlement channels (`X402_BATCH_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// A new deposit is this many times the price (or the server's announced minimum, if more).
    pub deposit_multiplier: u64,
    /// The most one channel's deposits may hold (atomic units).
    pub max_deposit: crate::money::Amount,
    /// The longest withdraw delay a channel may lock the deposit for (seconds).
    pub max_withdraw_delay: u64,
    /// Lanes (channels) per upstream: parallel calls beyond this wait.
    pub lanes: u32,
}

impl PaymentConfig {
    /// Checks that every asset whose decimals are known has the same decimals: caps and
    /// budgets are numbers of atomic units, so one budget can only span assets whose atomic
    /// units are equal.
    ///
    /// # Errors
    /// [`ConfigError`] naming two assets of different decimals.
    pub fn check_one_unit(&self) -> Result<(), ConfigError> {
        if self.budget.is_some() {
            return Ok(()); // budgets are counted in the budget currency
        }
        let mut first: Option<(&(Network, Address), u8)> = None;
        for (asset, d) in &self.decimals {
            match first {
                None => first = Some((asset, *d)),
                Some((a, d0)) if d0 != *d => {
                    return Err(ConfigError::new(
                        "X402_ASSETS",
                        format!(
                            "mixes assets of different units: {}={} has {d0} decimals, {}={} has {d}; agents' caps \
                             and budgets are in atomic units, so one budget cannot span them (set BUDGET_CURRENCY \
                             and X402_ASSET_VALUES, or run one router per unit)",
                            a.0, a.1, asset.0, asset.1
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub database: DatabaseConfig,
    pub redis_url: Secret,
    /// `redis_url` parsed: one server or a cluster, TLS settings read.
    pub redis: crate::idempotency::redis_link::RedisTarget,
    pub redis_timeout: Duration,
    pub redis_key_prefix: String,
    pub bind: SocketAddr,
    pub signer: PrivateKeySigner,
    pub payments: PaymentConfig,
    pub operator_token: Option<Secret>,
    /// Throttling of failed operator authentications per client address.
    pub operator_auth: OperatorAuthLimits,
    /// The unauthenticated metrics listener (`METRICS_ADDR`), if any.
    pub metrics_addr: Option<SocketAddr>,
    pub upstream: UpstreamConfig,
    pub request_max_bytes: usize,
    pub idempotency: IdempotencyTiming,
    pub json_logs: bool,
    pub workers: usize,
    pub run_migrations: bool,
    /// Graceful shutdown limit (`SHUTDOWN_TIMEOUT_SECS`).
    pub shutdown_timeout: Duration,
    /// Takeovers try to recover a lost paid answer (`RECOVER_LOST_ANSWERS`).
    pub recover_lost_answers: bool,
    /// How long an MCP `fetch` waits before answering that the call goes on
    /// (`MCP_FETCH_WAIT_SECONDS`).
    pub mcp_fetch_wait: Duration,
    /// How long a payment held for approval waits for a decision (`APPROVAL_TTL`).
    pub approval_ttl: Duration,
    /// The two-person rule: `Some(CHANGE_TTL)` with `REQUIRE_SECOND_ADMIN`.
    pub second_admin: Option<Duration>,
    /// Paying ahead on known terms (`REQUIREMENTS_CACHE_SECONDS`, `_ENTRIES`); `None`: off.
    pub requirements_cache: Option<TermsLimits>,
    /// Paying on Solana networks (`None`: no Solana network has an RPC URL).
    pub solana: Option<solana::SolanaConfig>,
    /// Sealing, redacting and keeping what agents forward (`crate::secrets`).
    pub secrets: SecretsConfig,
    /// What agents can discover (`X402_DISCOVERY_*`, `crate::discovery`).
    pub discovery: DiscoveryConfig,
}

/// The bounds of the known payment terms (`REQUIREMENTS_CACHE_SECONDS`,
/// `REQUIREMENTS_CACHE_ENTRIES`; see `terms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermsLimits {
    pub ttl: Duration,
    pub entries: usize,
}

/// USDC as deployed by Circle: the default `X402_ASSETS`.
pub const DEFAULT_ASSETS: &str = "eip155:8453=0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913,\
eip155:84532=0x036CbD53842c5426634e7929541eC2318f3dCF7e";

/// Circle's USDC (EIP-3009, 6 decimals) by chain id: the asset paid on a network of
/// `X402_RPC_URLS` for which `X402_ASSETS` names none, and assets whose decimals are known
/// without asking the chain. From `DEFAULT_ASSETS` of the official `@x402/evm` 2.27.0 (OP
/// Mainnet, which that table lacks: Circle's list of USDC contract addresses).
pub const BUILT_IN_USDC: [(u64, &str); 8] = [
    (8453, "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"),    // Base
    (84_532, "0x036CbD53842c5426634e7929541eC2318f3dCF7e"),  // Base Sepolia
    (1, "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"),       // Ethereum
    (137, "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359"),     // Polygon PoS
    (42_161, "0xaf88d065e77c8cC2239327C5EDb3A432268e5831"),  // Arbitrum One
    (421_614, "0x75faf114eafb1BDbe2F0316DF893fd58CE46AA4d"), // Arbitrum Sepolia
    (10, "0x0b2C639c533813f4Aa9D7837CAf62653d097Ff85"),      // OP Mainnet
    (43_114, "0xB97EF9Ef8734C71904D8002F8b6Bc66Dd9c48a6E"),  // Avalanche C-Chain
];
/// Decimals of every built-in USDC.
const USDC_DECIMALS: u8 = 6;

/// The built-in USDC of `network`, if it has one.
pub fn built_in_usdc(network: Network) -> Option<Address> {
    BUILT_IN_USDC.iter().find(|(id, _)| *id == network.chain_id()).and_then(|(_, a)| Address::from_str(a).ok())
}

/// The assets the router pays with: `X402_ASSETS` (empty: USDC on Base and Base Sepolia),
/// plus the built-in USDC of every network of `rpc_urls` that `X402_ASSETS` gives no asset
/// for. A network with neither gets nothing (it is never paid on).
///
/// # Errors
/// A malformed `X402_ASSETS`.
pub fn configured_assets(raw: &str, rpc_urls: &BTreeMap<Network, Vec<Url>>) -> Result<Assets, ConfigError> {
    let raw = if raw.trim().is_empty() { DEFAULT_ASSETS } else { raw };
    let (mut assets, mut decimals, permit2_only) = parse_assets(raw)?;
    for network in rpc_urls.keys() {
        if !assets.contains_key(network)
            && let Some(usdc) = built_in_usdc(*network)
        {
            assets.insert(*network, vec![usdc]);
            decimals.insert((*network, usdc), USDC_DECIMALS);
        }
    }
    Ok((assets, decimals, permit2_only))
}

impl Config {
    /// Builds the typed configuration.
    ///
    /// # Errors
    /// The first missing or malformed setting, naming it.
    pub fn from_args(args: &ServeArgs) -> Result<Self, ConfigError> {
        let database = DatabaseConfig::from_args(&args.db)?;
        let redis_url = required("REDIS_URL", args.redis_url.as_deref())?;
        let redis_cluster = parse_bool("REDIS_CLUSTER", &args.redis_cluster)?;
        let sentinel_master = args.redis_sentinel_master.as_deref().map(str::trim).filter(|m| !m.is_empty());
        let redis = crate::idempotency::redis_link::RedisTarget::parse(redis_url, redis_cluster, sentinel_master)
            .map_err(|e| ConfigError::new("REDIS_URL", e.0))?;
        let bind = SocketAddr::from_str(args.bind.trim())
            .map_err(|_| ConfigError::new("BIND", "expected host:port, e.g. 127.0.0.1:8080"))?;
        let signer = load_signer(&args.key)?
            .ok_or_else(|| ConfigError::new("ROUTER_PRIVATE_KEY", "is required (or ROUTER_PRIVATE_KEY_FILE)"))?;
        let secrets = SecretsConfig::from_args(&args.secrets, &signer)?;
        let rpc_urls = parse_rpc_urls(&args.x402_rpc_urls)?;
        let (assets, decimals, permit2_only) = configured_assets(&args.x402_assets, &rpc_urls)?;
        let operator_token = operator_token(args.operator_token.as_deref())?;
        let metrics_addr = metrics_addr(args.metrics_addr.as_deref(), bind)?;
        let upstream = UpstreamConfig::from_args(&args.upstream)?;
        let idempotency = idempotency_timing(args)?;
        let json_logs = json_logs(&args.log_format)?;
        let symbols = symbols::built_in_symbols(&assets);
        let ws_urls = parse::parse_ws_urls(&args.x402_ws_urls, &rpc_urls)?;
        let payments = PaymentConfig {
            budget: budget::parse(&args.budget_currency, &args.budget_decimals, &args.x402_asset_values, &assets)?,
            ws_urls,
            index_lookback_blocks: parse_num("X402_INDEX_LOOKBACK_BLOCKS", &args.x402_index_lookback_blocks)?,
            rpc_urls,
            assets,
            rpc_timeout: parse_ms("X402_RPC_TIMEOUT_MS", &args.x402_rpc_timeout_ms)?,
            max_auth_secs: parse_max_auth(&args.x402_max_auth_seconds)?,
            decimals,
            permit2_only,
            symbols,
            batch: parse::parse_batch(args)?,
        };
        payments.check_one_unit()?;
        let unit = payments.decimals.values().next().copied();
        let solana = solana::config(&args.x402_rpc_urls, &args.x402_assets, &args.solana, unit)?;
        budget::only_exact_on_evm(payments.budget.as_ref(), payments.batch.is_some(), solana.is_some())?;
        Ok(Self {
            database,
            redis_url: Secret::new(redis_url.to_owned()),
            redis,
            redis_timeout: parse_ms("REDIS_TIMEOUT_MS", &args.redis_timeout_ms)?,
            redis_key_prefix: args.redis_key_prefix.clone(),
            bind,
            signer,
            payments,
            operator_token,
            operator_auth: parse_operator_auth(
                &args.operator_auth_max_failures,
                &args.operator_auth_window_ms,
                &args.operator_auth_max_addresses,
            )?,
            metrics_addr,
            upstream,
            request_max_bytes: parse_num("REQUEST_MAX_BYTES", &args.request_max_bytes)?,
            idempotency,
            json_logs,
            workers: parse_num("WORKERS", &args.workers)?,
            run_migrations: !parse_bool("NO_MIGRATE", &args.no_migrate)?,
            shutdown_timeout: Duration::from_secs(parse_num::<u64>(
                "SHUTDOWN_TIMEOUT_SECS",
                &args.shutdown_timeout_secs,
            )?),
            recover_lost_answers: parse_bool("RECOVER_LOST_ANSWERS", &args.recover_lost_answers)?,
            mcp_fetch_wait: parse_mcp_wait(&args.mcp_fetch_wait_seconds)?,
            approval_ttl: parse::parse_approval_ttl(&args.approval_ttl)?,
            second_admin: parse::parse_second_admin(&args.require_second_admin, &args.change_ttl)?,
            requirements_cache: parse_requirements_cache(
                &args.requirements_cache_seconds,
                &args.requirements_cache_entries,
            )?,
            solana,
            secrets,
            discovery: DiscoveryConfig::from_args(&args.discovery)?,
        })
    }
}

/// `LOG_FORMAT`: `text` (false) or `json` (true).
fn json_logs(format: &str) -> Result<bool, ConfigError> {
    match format.trim() {
        "text" => Ok(false),
        "json" => Ok(true),
        _ => Err(ConfigError::new("LOG_FORMAT", "expected `text` or `json`")),
    }
}

/// The idempotency timings. The heartbeat must beat well inside the abandonment window, or a
/// live owner could be taken over between two beats.
fn idempotency_timing(args: &ServeArgs) -> Result<IdempotencyTiming, ConfigError> {
    let idempotency = IdempotencyTiming {
        abandon_after: parse_ms("IDEMPOTENCY_ABANDON_AFTER_MS", &args.idempotency_abandon_after_ms)?,
        heartbeat: parse_ms("IDEMPOTENCY_HEARTBEAT_MS", &args.idempotency_heartbeat_ms)?,
        deadline: parse_ms("ROUTE_DEADLINE_MS", &args.route_deadline_ms)?,
    };
    if idempotency.heartbeat * 2 > idempotency.abandon_after {
        return Err(ConfigError::new(
            "IDEMPOTENCY_HEARTBEAT_MS",
            "must be at most half of IDEMPOTENCY_ABANDON_AFTER_MS",
        ));
    }
    Ok(idempotency)
}

/// `OPERATOR_TOKEN`: unset, or at least 16 characters.
fn operator_token(raw: Option<&str>) -> Result<Option<Secret>, ConfigError> {
    Ok(match raw.map(str::trim) {
        None | Some("") => None,
        Some(t) if t.len() < 16 => {
            return Err(ConfigError::new("OPERATOR_TOKEN", "must be at least 16 characters"));
        }
        Some(t) => Some(Secret::new(t.to_owned())),
    })
}

/// `METRICS_ADDR`: unset, or an address other than `bind`.
fn metrics_addr(raw: Option<&str>, bind: SocketAddr) -> Result<Option<SocketAddr>, ConfigError> {
    Ok(match raw.map(str::trim) {
        None | Some("") => None,
        Some(a) => {
            let addr = SocketAddr::from_str(a)
                .map_err(|_| ConfigError::new("METRICS_ADDR", "expected host:port, e.g. 127.0.0.1:9464"))?;
            if addr.port() != 0 && addr == bind {
                return Err(ConfigError::new("METRICS_ADDR", "must differ from BIND"));
            }
            Some(addr)
        }
    })
}

/// A secret given inline or in a file, each named by its setting: the setting it came from and
/// its text; `None` when neither is set.
///
/// # Errors
/// Both set, or an unreadable file.
pub(crate) fn secret_text(
    (inline_env, inline): (&'static str, Option<&String>),
    (file_env, file): (&'static str, Option<&String>),
) -> Result<Option<(&'static str, String)>, ConfigError> {
    match (inline, file) {
        (Some(k), None) => Ok(Some((inline_env, k.clone()))),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map(|text| Some((file_env, text)))
            .map_err(|e| ConfigError::new(file_env, format!("cannot read {path:?}: {e}"))),
        (Some(_), Some(_)) => Err(ConfigError::new(inline_env, format!("set {inline_env} or {file_env}, not both"))),
        (None, None) => Ok(None),
    }
}

/// The router's key from `ROUTER_PRIVATE_KEY` or `ROUTER_PRIVATE_KEY_FILE`; `None` when
/// neither is set.
///
/// # Errors
/// Both set, an unreadable file, or a value that is not a key.
pub fn load_signer(args: &KeyArgs) -> Result<Option<PrivateKeySigner>, ConfigError> {
    let Some((env, raw)) = secret_text(
        ("ROUTER_PRIVATE_KEY", args.router_private_key.as_ref()),
        ("ROUTER_PRIVATE_KEY_FILE", args.router_private_key_file.as_ref()),
    )?
    else {
        return Ok(None);
    };
    let hex = raw.trim();
    PrivateKeySigner::from_str(hex)
        .map(Some)
        .map_err(|_| ConfigError::new(env, "is not a 32-byte hex secp256k1 private key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mcp_wait_is_one_second_to_one_hour() {
        assert_eq!(parse_mcp_wait("20").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_mcp_wait(" 1 ").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_mcp_wait("3600").unwrap(), Duration::from_secs(3600));
        for bad in ["0", "3601", "-1", "1.5", "", "20s", "18446744073709551616"] {
            let e = parse_mcp_wait(bad).unwrap_err().to_string();
            assert!(e.contains("MCP_FETCH_WAIT_SECONDS"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_operator_auth_throttle_settings_are_bounded_and_named() {
        let d = parse_operator_auth("10", "60000", "10000").unwrap();
        assert_eq!((d.max_failures, d.window, d.max_addresses), (10, Duration::from_secs(60), 10_000));
        assert_eq!(parse_operator_auth("0", "1", "1").unwrap().max_failures, 0, "0 turns it off");
        for (f, w, a, name) in [
            ("-1", "60000", "10", "OPERATOR_AUTH_MAX_FAILURES"),
            ("1000001", "60000", "10", "OPERATOR_AUTH_MAX_FAILURES"),
            ("10", "0", "10", "OPERATOR_AUTH_WINDOW_MS"),
            ("10", "86400001", "10", "OPERATOR_AUTH_WINDOW_MS"),
            ("10", "60000", "0", "OPERATOR_AUTH_MAX_ADDRESSES"),
            ("10", "60000", "x", "OPERATOR_AUTH_MAX_ADDRESSES"),
        ] {
            let e = parse_operator_auth(f, w, a).unwrap_err().to_string();
            assert!(e.contains(name), "{f} {w} {a}: {e}");
        }
    }

    fn database(url: &str) -> DatabaseConfig {
        DatabaseConfig {
            url: Secret::new(url.into()),
            connector: crate::db::Connector::from_url(url).unwrap(),
            pool_size: 1,
            acquire_timeout: Duration::from_secs(1),
            lock_timeout: Duration::from_millis(5000),
            statement_timeout: Duration::from_millis(15000),
            idle_in_transaction_timeout: Duration::from_millis(10000),
        }
    }

    #[test]
    fn a_network_listed_again_gets_another_rpc_url_in_order_and_no_url_is_quoted() {
        let urls = parse_rpc_urls("base-sepolia=http://a:1,eip155:8453=https://b,eip155:84532=http://c:2/k").unwrap();
        let sepolia: Vec<&str> = urls[&Network::BASE_SEPOLIA].iter().map(Url::as_str).collect();
        assert_eq!(sepolia, ["http://a:1/", "http://c:2/k"]);
        assert_eq!(urls[&Network::BASE].len(), 1);
        let twice = parse_rpc_urls("eip155:84532=http://a/secret,eip155:84532=http://a/secret").unwrap_err();
        assert_eq!(
            twice.to_string(),
            "invalid setting X402_RPC_URLS (--x402-rpc-urls): URL 1 of eip155:84532 is listed twice"
        );
        let bad = parse_rpc_urls("eip155:84532=ftp://a/secret").unwrap_err().to_string();
        assert!(bad.contains("URL 0 of eip155:84532") && !bad.contains("secret"), "{bad}");
    }

    #[test]
    fn a_permit2_suffix_marks_a_token_without_eip3009_after_its_decimals() {
        let (plain, usdc) =
            ("0x5FbDB2315678afecb367f032d93F642f64180aa3", "0x036CbD53842c5426634e7929541eC2318f3dCF7e");
        let (assets, decimals, only) =
            parse_assets(&format!("eip155:84532={usdc},eip155:84532={plain}@6+permit2")).unwrap();
        let plain: Address = plain.parse().unwrap();
        assert_eq!(assets[&Network::BASE_SEPOLIA].len(), 2);
        assert_eq!(decimals[&(Network::BASE_SEPOLIA, plain)], 6);
        assert_eq!(only.into_iter().collect::<Vec<_>>(), [(Network::BASE_SEPOLIA, plain)]);
        let bad = parse_assets(&format!("eip155:84532={plain}+permit3")).unwrap_err().to_string();
        assert!(bad.contains("is not a 0x address"), "{bad}");
    }

    #[test]
    fn a_network_without_an_asset_pays_its_built_in_usdc_and_any_chain_id_is_a_network() {
        let rpc = parse_rpc_urls("eip155:10=http://a,arbitrum=http://b,eip155:4242=http://c,base=http://d").unwrap();
        let mine: Address = "0x5FbDB2315678afecb367f032d93F642f64180aa3".parse().unwrap();
        let (assets, decimals, _) = configured_assets(&format!("eip155:4242={mine}@6"), &rpc).unwrap();
        let op = Network::parse("eip155:10").unwrap();
        let arbitrum = Network::parse("eip155:42161").unwrap();
        let any = Network::parse("eip155:4242").unwrap();
        assert_eq!(assets[&op], vec![built_in_usdc(op).unwrap()]);
        assert_eq!(assets[&arbitrum], vec!["0xaf88d065e77c8cC2239327C5EDb3A432268e5831".parse::<Address>().unwrap()]);
        assert_eq!(assets[&Network::BASE], vec![built_in_usdc(Network::BASE).unwrap()]);
        assert_eq!(assets[&any], vec![mine], "a configured asset is not joined by a built-in one");
        assert_eq!(decimals[&(op, built_in_usdc(op).unwrap())], 6);
        assert_eq!(decimals[&(any, mine)], 6);
        // Without X402_ASSETS: USDC on Base and Base Sepolia, and on every listed network that has one.
        let (assets, _, _) = configured_assets("", &rpc).unwrap();
        assert!(assets.contains_key(&Network::BASE_SEPOLIA) && assets.contains_key(&op));
        assert!(!assets.contains_key(&any), "no built-in asset for an unknown chain");
        for (id, addr) in BUILT_IN_USDC {
            let a: Address = addr.parse().unwrap();
            assert_eq!(a.to_checksum(None), addr, "{id}: checksummed as written");
        }
    }

    #[test]
    fn session_url_bounds_every_wait_and_keeps_what_the_url_had() {
        let ours = "-c%20lock_timeout%3D5000%20-c%20statement_timeout%3D15000\
                    %20-c%20idle_in_transaction_session_timeout%3D10000";
        assert_eq!(
            database("postgres://u:p@db:5432/app").session_url().unwrap().expose(),
            format!("postgres://u:p@db:5432/app?options={ours}")
        );
        assert_eq!(
            database("postgres://db/app?sslmode=require&options=-c%20search_path%3Dx%2By")
                .session_url()
                .unwrap()
                .expose(),
            format!("postgres://db/app?sslmode=require&options=-c%20search_path%3Dx%2By%20{ours}")
        );
        // Key/value pairs with several hosts keep their form and their hosts.
        let kv = database("host=a,b port=5432,5433 dbname=app target_session_attrs=read-write options='-c x=1'");
        assert_eq!(
            kv.session_url().unwrap().expose(),
            "host='a,b' port='5432,5433' dbname='app' target_session_attrs='read-write' options='-c x=1 \
             -c lock_timeout=5000 -c statement_timeout=15000 -c idle_in_transaction_session_timeout=10000'"
        );
    }
}
