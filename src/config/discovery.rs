//! The discovery settings (`X402_DISCOVERY_*`, see `crate::discovery`).

use std::time::Duration;

use url::Url;

use super::ConfigError;
use super::parse::parse_num;
use clap::Args;

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

/// Most facilitator catalogues one router reads.
pub const MAX_DISCOVERY_URLS: usize = 16;

/// Where discovery reads and how much it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// Facilitators' base URLs (`<url>/discovery/resources` is read), in the order given.
    pub urls: Vec<Url>,
    /// How often each catalogue is read again.
    pub refresh: Duration,
    /// Entries older than this are dropped (and never shown).
    pub max_age: Duration,
    /// Most entries kept in all.
    pub max_entries: usize,
    /// Most bytes the kept entries take in all.
    pub max_bytes: usize,
}

impl DiscoveryConfig {
    /// # Errors
    /// The first malformed setting, naming it.
    pub fn from_args(args: &DiscoveryArgs) -> Result<Self, ConfigError> {
        let refresh: u64 = parse_num("X402_DISCOVERY_REFRESH_SECONDS", &args.x402_discovery_refresh_seconds)?;
        if !(10..=86_400).contains(&refresh) {
            return Err(ConfigError::new("X402_DISCOVERY_REFRESH_SECONDS", "must be between 10 and 86400 seconds"));
        }
        let max_age: u64 = parse_num("X402_DISCOVERY_MAX_AGE_SECONDS", &args.x402_discovery_max_age_seconds)?;
        if !(refresh..=7 * 86_400).contains(&max_age) {
            return Err(ConfigError::new(
                "X402_DISCOVERY_MAX_AGE_SECONDS",
                "must be at least X402_DISCOVERY_REFRESH_SECONDS and at most 604800 seconds",
            ));
        }
        let max_entries: usize = parse_num("X402_DISCOVERY_MAX_ENTRIES", &args.x402_discovery_max_entries)?;
        if !(1..=100_000).contains(&max_entries) {
            return Err(ConfigError::new("X402_DISCOVERY_MAX_ENTRIES", "must be between 1 and 100000"));
        }
        let max_bytes: usize = parse_num("X402_DISCOVERY_MAX_BYTES", &args.x402_discovery_max_bytes)?;
        if !(65_536..=268_435_456).contains(&max_bytes) {
            return Err(ConfigError::new("X402_DISCOVERY_MAX_BYTES", "must be between 65536 and 268435456 bytes"));
        }
        Ok(Self {
            urls: parse_urls(&args.x402_discovery_urls)?,
            refresh: Duration::from_secs(refresh),
            max_age: Duration::from_secs(max_age),
            max_entries,
            max_bytes,
        })
    }
}

/// `X402_DISCOVERY_URLS`: comma-separated `http(s)` base URLs without credentials, query or
/// fragment; duplicates refused.
fn parse_urls(raw: &str) -> Result<Vec<Url>, ConfigError> {
    let bad = |why: String| ConfigError::new("X402_DISCOVERY_URLS", why);
    let mut urls: Vec<Url> = Vec::new();
    for (i, item) in raw.split(',').map(str::trim).filter(|s| !s.is_empty()).enumerate() {
        let url = Url::parse(item).map_err(|e| bad(format!("entry {} is not a URL: {e}", i + 1)))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(bad(format!("entry {} must be an http(s) URL with a host", i + 1)));
        }
        if !url.username().is_empty() || url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
            return Err(bad(format!("entry {} must have no credentials, query or fragment", i + 1)));
        }
        if urls.contains(&url) {
            return Err(bad(format!("entry {} is listed twice", i + 1)));
        }
        urls.push(url);
    }
    if urls.len() > MAX_DISCOVERY_URLS {
        return Err(bad(format!("at most {MAX_DISCOVERY_URLS} URLs")));
    }
    Ok(urls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(urls: &str, refresh: &str, age: &str) -> DiscoveryArgs {
        DiscoveryArgs {
            x402_discovery_urls: urls.into(),
            x402_discovery_refresh_seconds: refresh.into(),
            x402_discovery_max_age_seconds: age.into(),
            x402_discovery_max_entries: "2000".into(),
            x402_discovery_max_bytes: "8388608".into(),
        }
    }

    #[test]
    fn urls_and_bounds_are_parsed_strictly() {
        let c =
            DiscoveryConfig::from_args(&args(" https://fac.example/x402 ,http://127.0.0.1:4022", "60", "600")).unwrap();
        assert_eq!(c.urls.len(), 2);
        assert_eq!(c.refresh, Duration::from_secs(60));
        assert!(DiscoveryConfig::from_args(&args("", "300", "3600")).unwrap().urls.is_empty());
        for bad in ["ftp://x", "https://u:p@x", "https://x/?q=1", "https://x/#f", "not a url", "https://x,https://x"] {
            assert!(DiscoveryConfig::from_args(&args(bad, "300", "3600")).is_err(), "{bad}");
        }
        assert!(DiscoveryConfig::from_args(&args("", "5", "3600")).is_err());
        assert!(DiscoveryConfig::from_args(&args("", "300", "299")).is_err());
        let many = (0..17).map(|i| format!("https://f{i}.example")).collect::<Vec<_>>().join(",");
        assert!(DiscoveryConfig::from_args(&args(&many, "300", "3600")).is_err());
    }
}
