//! Typed settings, built once from the raw CLI/env strings: one concern per file (the flags
//! as given beside the settings they become), re-exported here; [`Config`] is all of `serve`'s.
//!
//! Start-up fails fast: a missing or malformed setting becomes one [`ConfigError`] line
//! that names the environment variable and the flag. Secrets live in [`Secret`], whose
//! `Debug` never prints the value.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use alloy::signers::local::PrivateKeySigner;

pub use crate::idempotency::IdempotencyTiming;

pub mod budget;
mod database;
pub mod discovery;
mod parse;
mod payment;
pub mod secrets;
mod serve;
pub mod solana;
pub mod symbols;
mod upstream;
mod usdc;
mod wallet;

pub use self::database::{DatabaseArgs, DatabaseConfig};
pub use self::discovery::DiscoveryArgs;
pub use self::payment::{BatchConfig, PaymentConfig, configured_assets};
pub use self::secrets::SecretsArgs;
pub use self::serve::ServeArgs;
pub use self::solana::SolanaArgs;
pub use self::upstream::{UpstreamArgs, UpstreamConfig};
pub use self::usdc::{BUILT_IN_USDC, DEFAULT_ASSETS, built_in_usdc};
pub use self::wallet::{KeyArgs, load_signer};

pub use self::discovery::DiscoveryConfig;
pub use self::parse::{
    Assets, OperatorAuthLimits, parse_mcp_wait, parse_ms, parse_num, parse_operator_auth, parse_requirements_cache,
    parse_rpc_urls,
};
use self::parse::{parse_bool, parse_max_auth, required};
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x402::Network;
    use alloy::primitives::Address;
    use parse::parse_assets;
    use url::Url;

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
