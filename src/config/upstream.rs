//! How upstreams are reached: the SSRF policy and the client's limits (`UPSTREAM_*`).

use std::time::Duration;

use clap::Args;
use ipnet::IpNet;

use super::ConfigError;
use super::parse::{parse_bool, parse_cidrs, parse_ms, parse_num};

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
