//! Parsing the raw CLI/env strings of settings, each error naming its setting.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::time::Duration;

use alloy::primitives::Address;
use ipnet::IpNet;
use url::Url;

use super::ConfigError;
use super::usdc::{USDC_DECIMALS, built_in_usdc};
use crate::x402::Network;

pub(super) fn required<'a>(env: &'static str, value: Option<&'a str>) -> Result<&'a str, ConfigError> {
    match value.map(str::trim) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(ConfigError::new(env, "is required")),
    }
}

/// A non-negative integer setting.
///
/// # Errors
/// A value that does not parse, naming the setting.
pub fn parse_num<T: FromStr>(env: &'static str, raw: &str) -> Result<T, ConfigError> {
    raw.trim().parse().map_err(|_| ConfigError::new(env, format!("expected a non-negative integer, got {raw:?}")))
}

/// `MCP_FETCH_WAIT_SECONDS`: 1 s to 1 h.
///
/// # Errors
/// A value that does not parse or is out of range, naming the setting.
pub fn parse_mcp_wait(raw: &str) -> Result<Duration, ConfigError> {
    let secs: u64 = parse_num("MCP_FETCH_WAIT_SECONDS", raw)?;
    if !(1..=3600).contains(&secs) {
        return Err(ConfigError::new("MCP_FETCH_WAIT_SECONDS", "must be between 1 and 3600 seconds"));
    }
    Ok(Duration::from_secs(secs))
}

/// `APPROVAL_TTL`: whole seconds, or a whole number with a unit `s`, `m`, `h` or `d`; from
/// 1 s to 7 days.
///
/// # Errors
/// A value that does not parse or is out of range, naming the setting.
pub fn parse_approval_ttl(raw: &str) -> Result<Duration, ConfigError> {
    parse_ttl("APPROVAL_TTL", raw)
}

/// `REQUIRE_SECOND_ADMIN` (a boolean) and `CHANGE_TTL` (as `APPROVAL_TTL`): the TTL of a
/// proposed change when the rule is on, `None` when off.
///
/// # Errors
/// A value that does not parse or is out of range, naming the setting.
pub fn parse_second_admin(on: &str, ttl: &str) -> Result<Option<Duration>, ConfigError> {
    let ttl = parse_ttl("CHANGE_TTL", ttl)?;
    Ok(parse_bool("REQUIRE_SECOND_ADMIN", on)?.then_some(ttl))
}

fn parse_ttl(env: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::new(env, "expected a duration from 1s to 7d: `3600`, `90s`, `30m`, `1h`, `2d`");
    let raw = raw.trim();
    let (digits, unit) = match raw.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&raw[..i], c),
        _ => (raw, 's'),
    };
    let per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(bad()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let secs = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(per)).ok_or_else(bad)?;
    if !(1..=7 * 86_400).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs(secs))
}

/// `REQUIREMENTS_CACHE_SECONDS` (0: off, at most a day) and `REQUIREMENTS_CACHE_ENTRIES`
/// (1 to a million).
///
/// # Errors
/// A value that does not parse or is out of range, naming the setting.
pub fn parse_requirements_cache(secs: &str, entries: &str) -> Result<Option<super::TermsLimits>, ConfigError> {
    let secs: u64 = parse_num("REQUIREMENTS_CACHE_SECONDS", secs)?;
    if secs > 86_400 {
        return Err(ConfigError::new("REQUIREMENTS_CACHE_SECONDS", "must be between 0 (off) and 86400 seconds"));
    }
    let entries: usize = parse_num("REQUIREMENTS_CACHE_ENTRIES", entries)?;
    if !(1..=1_000_000).contains(&entries) {
        return Err(ConfigError::new("REQUIREMENTS_CACHE_ENTRIES", "must be between 1 and 1000000"));
    }
    Ok((secs > 0).then(|| super::TermsLimits { ttl: Duration::from_secs(secs), entries }))
}

/// How failed operator authentications are throttled per client address (see
/// `auth_throttle`): `OPERATOR_AUTH_MAX_FAILURES` (0: off), `OPERATOR_AUTH_WINDOW_MS`,
/// `OPERATOR_AUTH_MAX_ADDRESSES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperatorAuthLimits {
    /// Failures (plus authentications still running) an address may have in one window.
    pub max_failures: u32,
    /// How long an address's failures count, from its first failure.
    pub window: Duration,
    /// Most addresses tracked at once (the oldest window is dropped first).
    pub max_addresses: usize,
}

/// The operator-auth throttle's settings: failures 0 (off) to 1000000, a window of 1 ms to a
/// day, 1 to 1000000 addresses.
///
/// # Errors
/// A value that does not parse or is out of range, naming the setting.
pub fn parse_operator_auth(
    failures: &str,
    window_ms: &str,
    addresses: &str,
) -> Result<OperatorAuthLimits, ConfigError> {
    let max_failures: u32 = parse_num("OPERATOR_AUTH_MAX_FAILURES", failures)?;
    if max_failures > 1_000_000 {
        return Err(ConfigError::new("OPERATOR_AUTH_MAX_FAILURES", "must be between 0 (off) and 1000000"));
    }
    let window = parse_ms("OPERATOR_AUTH_WINDOW_MS", window_ms)?;
    if window > Duration::from_secs(86_400) {
        return Err(ConfigError::new("OPERATOR_AUTH_WINDOW_MS", "must be between 1 and 86400000 ms"));
    }
    let max_addresses: usize = parse_num("OPERATOR_AUTH_MAX_ADDRESSES", addresses)?;
    if !(1..=1_000_000).contains(&max_addresses) {
        return Err(ConfigError::new("OPERATOR_AUTH_MAX_ADDRESSES", "must be between 1 and 1000000"));
    }
    Ok(OperatorAuthLimits { max_failures, window, max_addresses })
}

/// A duration in milliseconds, greater than zero.
///
/// # Errors
/// A value that does not parse or is zero, naming the setting.
pub fn parse_ms(env: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    let ms: u64 = parse_num(env, raw)?;
    if ms == 0 {
        return Err(ConfigError::new(env, "must be greater than 0"));
    }
    Ok(Duration::from_millis(ms))
}

pub(super) fn parse_bool(env: &'static str, raw: &str) -> Result<bool, ConfigError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" | "" => Ok(false),
        _ => Err(ConfigError::new(env, format!("expected true or false, got {raw:?}"))),
    }
}

pub(super) fn parse_cidrs(raw: &str) -> Result<Vec<IpNet>, ConfigError> {
    split_list(raw)
        .map(|item| {
            item.parse::<IpNet>()
                .or_else(|_| item.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| ConfigError::new("UPSTREAM_ALLOW_CIDRS", format!("{item:?} is not an IP or CIDR")))
        })
        .collect()
}

pub(super) fn split_list(raw: &str) -> impl Iterator<Item = &str> {
    raw.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// True for an `X402_RPC_URLS` / `X402_ASSETS` entry whose network is a Solana one (read by
/// `config::solana`; the EVM parsers skip it).
pub(super) fn is_solana_entry(item: &str) -> bool {
    item.split_once('=').is_some_and(|(network, _)| crate::x402::svm::SvmNetwork::parse(network.trim()).is_ok())
        || item.trim_start().to_ascii_lowercase().starts_with("solana")
}

pub(super) fn split_pair<'a>(env: &'static str, item: &'a str) -> Result<(Network, &'a str), ConfigError> {
    let (network, value) = item
        .split_once('=')
        .ok_or_else(|| ConfigError::new(env, format!("{item:?} is not of the form network=value")))?;
    let network = Network::parse(network.trim()).map_err(|e| ConfigError::new(env, format!("{network:?}: {e}")))?;
    Ok((network, value.trim()))
}

/// `X402_RPC_URLS`: `network=http(s)://…,…` (CAIP-2 ids or v1 names). A network may be
/// listed several times: its URLs, in the order given, are its endpoints (fallback). Solana
/// entries are read by `config::solana`.
///
/// # Errors
/// A malformed entry or the same URL listed twice for a network. Messages never quote a URL
/// (it may carry an API key); they name the network and the URL's position.
pub fn parse_rpc_urls(raw: &str) -> Result<BTreeMap<Network, Vec<Url>>, ConfigError> {
    let mut out: BTreeMap<Network, Vec<Url>> = BTreeMap::new();
    for item in split_list(raw).filter(|item| !is_solana_entry(item)) {
        let (network, url) = split_pair("X402_RPC_URLS", item)?;
        let list = out.entry(network).or_default();
        let position = list.len();
        let parsed = Url::parse(url).ok().filter(|u| matches!(u.scheme(), "http" | "https")).ok_or_else(|| {
            ConfigError::new("X402_RPC_URLS", format!("URL {position} of {network} is not an http(s) URL"))
        })?;
        if list.contains(&parsed) {
            return Err(ConfigError::new("X402_RPC_URLS", format!("URL {position} of {network} is listed twice")));
        }
        list.push(parsed);
    }
    Ok(out)
}

/// `X402_WS_URLS`: `network=ws(s)://…,…`, one per EVM network, each a network of
/// `X402_RPC_URLS` (the index catches up over HTTP).
pub fn parse_ws_urls(raw: &str, rpc: &BTreeMap<Network, Vec<Url>>) -> Result<BTreeMap<Network, Url>, ConfigError> {
    let mut out = BTreeMap::new();
    for item in split_list(raw).filter(|item| !is_solana_entry(item)) {
        let (network, url) = split_pair("X402_WS_URLS", item)?;
        let parsed = Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "ws" | "wss"))
            .ok_or_else(|| ConfigError::new("X402_WS_URLS", format!("the URL of {network} is not a ws(s) URL")))?;
        if !rpc.contains_key(&network) {
            return Err(ConfigError::new("X402_WS_URLS", format!("{network} has no URL in X402_RPC_URLS")));
        }
        if out.insert(network, parsed).is_some() {
            return Err(ConfigError::new("X402_WS_URLS", format!("{network} is listed twice")));
        }
    }
    Ok(out)
}

/// Assets per network, the decimals known of them, and those paid only via Permit2.
pub type Assets = (BTreeMap<Network, Vec<Address>>, BTreeMap<(Network, Address), u8>, BTreeSet<(Network, Address)>);

/// Suffix of an `X402_ASSETS` entry whose token has no EIP-3009 (paid only via Permit2).
pub(super) const PERMIT2_ONLY: &str = "+permit2";

/// `X402_ASSETS`: `network=0x…[@decimals][+permit2],…`. Decimals given here win; built-in
/// USDC is known. `+permit2`: the token has no EIP-3009.
pub(super) fn parse_assets(raw: &str) -> Result<Assets, ConfigError> {
    let mut out: BTreeMap<Network, Vec<Address>> = BTreeMap::new();
    let mut decimals = BTreeMap::new();
    let mut permit2_only = BTreeSet::new();
    for item in split_list(raw).filter(|item| !is_solana_entry(item)) {
        let (network, spec) = split_pair("X402_ASSETS", item)?;
        let (spec, only_permit2) = match spec.trim().strip_suffix(PERMIT2_ONLY) {
            Some(rest) => (rest, true),
            None => (spec, false),
        };
        let (addr, dec) = match spec.split_once('@') {
            Some((a, d)) => {
                let d = d.trim().parse::<u8>().ok().filter(|d| *d <= 36).ok_or_else(|| {
                    ConfigError::new("X402_ASSETS", format!("{d:?} is not a number of decimals (0 to 36)"))
                })?;
                (a.trim(), Some(d))
            }
            None => (spec, None),
        };
        let asset = Address::from_str(addr)
            .map_err(|_| ConfigError::new("X402_ASSETS", format!("{addr:?} is not a 0x address")))?;
        let known = (built_in_usdc(network) == Some(asset)).then_some(USDC_DECIMALS);
        if let Some(d) = dec.or(known) {
            decimals.insert((network, asset), d);
        }
        if only_permit2 {
            permit2_only.insert((network, asset));
        }
        let list = out.entry(network).or_default();
        if !list.contains(&asset) {
            list.push(asset);
        }
    }
    Ok((out, decimals, permit2_only))
}

/// `X402_MAX_AUTH_SECONDS`: 10 s to 24 h (an authorization must outlive one exchange, and
/// must not outlive the rolling budget window).
pub(super) fn parse_max_auth(raw: &str) -> Result<u64, ConfigError> {
    let v: u64 = parse_num("X402_MAX_AUTH_SECONDS", raw)?;
    if !(10..=86_400).contains(&v) {
        return Err(ConfigError::new("X402_MAX_AUTH_SECONDS", "must be between 10 and 86400 seconds"));
    }
    Ok(v)
}

/// `X402_SCHEMES` and, when it names `batch-settlement`, the `X402_BATCH_*` bounds.
///
/// # Errors
/// An unknown scheme, or a bound that does not parse or is out of range, naming the setting.
pub fn parse_batch(args: &super::ServeArgs) -> Result<Option<super::BatchConfig>, ConfigError> {
    let mut batch = false;
    for s in args.x402_schemes.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match s {
            "batch-settlement" => batch = true,
            "exact" | "upto" => {}
            other => return Err(ConfigError::new("X402_SCHEMES", format!("unknown scheme {other:?}"))),
        }
    }
    if !batch {
        return Ok(None);
    }
    let deposit_multiplier: u64 = parse_num("X402_BATCH_DEPOSIT_MULTIPLIER", &args.x402_batch_deposit_multiplier)?;
    if !(1..=1000).contains(&deposit_multiplier) {
        return Err(ConfigError::new("X402_BATCH_DEPOSIT_MULTIPLIER", "must be between 1 and 1000"));
    }
    let max_deposit = crate::money::Amount::parse(args.x402_batch_max_deposit.trim())
        .ok()
        .filter(|a| !a.is_zero())
        .ok_or_else(|| ConfigError::new("X402_BATCH_MAX_DEPOSIT", "expected a positive decimal amount"))?;
    let max_withdraw_delay: u64 =
        parse_num("X402_BATCH_MAX_WITHDRAW_DELAY_SECONDS", &args.x402_batch_max_withdraw_delay_seconds)?;
    if max_withdraw_delay < crate::x402::batch::MIN_WITHDRAW_DELAY {
        return Err(ConfigError::new(
            "X402_BATCH_MAX_WITHDRAW_DELAY_SECONDS",
            "must be at least 900 (the contract's minimum)",
        ));
    }
    let lanes: u32 = parse_num("X402_BATCH_LANES", &args.x402_batch_lanes)?;
    if !(1..=64).contains(&lanes) {
        return Err(ConfigError::new("X402_BATCH_LANES", "must be between 1 and 64"));
    }
    Ok(Some(super::BatchConfig { deposit_multiplier, max_deposit, max_withdraw_delay, lanes }))
}

#[cfg(test)]
mod approval_ttl_tests {
    use super::*;

    #[test]
    fn approval_ttl_takes_seconds_or_a_unit_within_a_week() {
        for (raw, secs) in
            [("3600", 3600), ("90s", 90), ("30m", 1800), (" 1h ", 3600), ("2d", 172_800), ("7d", 604_800)]
        {
            assert_eq!(parse_approval_ttl(raw).unwrap(), Duration::from_secs(secs), "{raw}");
        }
        for bad in ["", "0", "0s", "8d", "1.5h", "-1h", "h", "1w", "1hh", "99999999999999999999d"] {
            assert!(parse_approval_ttl(bad).unwrap_err().to_string().contains("APPROVAL_TTL"), "{bad}");
        }
    }

    #[test]
    fn the_two_person_rule_is_off_by_default_and_its_ttl_checked() {
        assert_eq!(parse_second_admin("false", "24h").unwrap(), None);
        assert_eq!(parse_second_admin("true", "24h").unwrap(), Some(Duration::from_secs(86_400)));
        assert!(parse_second_admin("true", "8d").unwrap_err().to_string().contains("CHANGE_TTL"));
        assert!(parse_second_admin("maybe", "1h").unwrap_err().to_string().contains("REQUIRE_SECOND_ADMIN"));
    }
}
