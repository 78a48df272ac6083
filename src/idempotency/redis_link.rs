//! How the cache reaches Redis: one server or a Redis Cluster, over TCP or TLS.
//!
//! `REDIS_URL` is `redis://` (plain) or `rediss://` (TLS). TLS takes the same parameters
//! as `DATABASE_URL` (see `db::tls`), in the query string:
//!
//! - `sslmode=verify-full` (the default for `rediss://`): chain and host name checked;
//! - `sslmode=verify-ca`: chain checked, host name not;
//! - `sslmode=require`: encrypted, certificate not checked (as `verify-ca` when
//!   `sslrootcert` is given, like libpq);
//! - `sslrootcert=<PEM file>`: the trusted roots (default: the system's).
//!
//! With `REDIS_CLUSTER=true`, `REDIS_URL` is a comma-separated list of seed nodes of a
//! Redis Cluster (one is enough; the others are found through `CLUSTER SLOTS`), and
//! commands follow `MOVED`/`ASK` redirections. The cache's keys carry a hash tag on the
//! agent id, so whatever one call touches lives in one slot.
//!
//! With `REDIS_SENTINEL_MASTER=<name>`, `REDIS_URL` is a comma-separated list of Redis
//! Sentinels: the master of that name is looked up through them on every (re)connection,
//! and the cache drops its connection on any error or timeout, so that after a failover
//! it reconnects to the new master (until then, requests go on through Postgres). The URL's
//! user and password, `sslmode=require|verify-full` and `sslrootcert` apply to the
//! Sentinels and to the master (`verify-ca` is not offered by the redis crate here).
//!
//! Every URL problem is found here, at start-up, and named: a `rediss://` URL that the
//! cache could not use would otherwise turn the cache off silently.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, TlsCertificates, TlsMode, Value};

use crate::db::tls::{RootCerts, SslMode, TlsParams};

/// A Redis URL or topology setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRedisUrl(pub String);

impl From<String> for BadRedisUrl {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<crate::db::tls::TlsSetupError> for BadRedisUrl {
    fn from(e: crate::db::tls::TlsSetupError) -> Self {
        Self(e.0)
    }
}

impl From<&str> for BadRedisUrl {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// A parsed `REDIS_URL`: ready to connect, not connected.
#[derive(Clone)]
pub enum RedisTarget {
    Single(Box<redis::Client>),
    Cluster(Box<redis::cluster::ClusterClient>),
    /// The master named in Sentinel (the client caches the Sentinel it last reached).
    Sentinel(Arc<tokio::sync::Mutex<SentinelClient>>),
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "RedisTarget::Single",
            Self::Cluster(_) => "RedisTarget::Cluster",
            Self::Sentinel(_) => "RedisTarget::Sentinel",
        })
    }
}

/// One seed URL made usable: the connection info and the TLS roots to trust.
struct Seed {
    info: redis::ConnectionInfo,
    tls: Option<TlsParams>,
}

fn parse_seed(url: &str) -> Result<Seed, BadRedisUrl> {
    let url = url.trim();
    let tls = url.starts_with("rediss://");
    if !tls && !url.starts_with("redis://") {
        return Err("must start with redis:// or rediss://".into());
    }
    let (mut plain_url, params) =
        TlsParams::take_from_url(url, if tls { SslMode::VerifyFull } else { SslMode::Disable })?;
    if !tls && params.mode != SslMode::Disable {
        return Err("sslmode other than disable needs a rediss:// URL".into());
    }
    if tls && matches!(params.mode, SslMode::Disable | SslMode::Prefer) {
        return Err("a rediss:// URL needs sslmode require, verify-ca or verify-full".into());
    }
    if tls && params.mode == SslMode::Require {
        // The redis crate's spelling of "encrypt, do not verify".
        plain_url.push_str("#insecure");
    }
    let info = plain_url.as_str().into_connection_info().map_err(|e| e.to_string())?;
    if tls && let RootCerts::File(_) = params.root_certs {
        // Read now, so that an unreadable or empty file stops start-up.
        params.root_store()?;
    }
    Ok(Seed { info, tls: tls.then_some(params) })
}

fn root_pem(params: &TlsParams) -> Result<Option<Vec<u8>>, BadRedisUrl> {
    match &params.root_certs {
        RootCerts::System => Ok(None),
        RootCerts::File(path) => {
            std::fs::read(path).map(Some).map_err(|e| BadRedisUrl(format!("sslrootcert {}: {e}", path.display())))
        }
    }
}

impl RedisTarget {
    /// Parses `REDIS_URL`: one server, the seed nodes of a cluster (`cluster`), or the
    /// Sentinels that know the master `sentinel_master`.
    ///
    /// # Errors
    /// A one-line reason; the caller names the setting.
    pub fn parse(url: &str, cluster: bool, sentinel_master: Option<&str>) -> Result<Self, BadRedisUrl> {
        if let Some(master) = sentinel_master {
            if cluster {
                return Err("REDIS_CLUSTER and REDIS_SENTINEL_MASTER exclude each other".into());
            }
            return Self::sentinel(url, master);
        }
        if !cluster {
            if url.contains(',') {
                return Err("several URLs are only accepted with REDIS_CLUSTER=true".into());
            }
            let seed = parse_seed(url)?;
            let Some(tls) = seed.tls else {
                return redis::Client::open(seed.info)
                    .map(|c| Self::Single(Box::new(c)))
                    .map_err(|e| BadRedisUrl(e.to_string()));
            };
            let mut info = seed.info;
            if let Some(root_cert) = root_pem(&tls)? {
                let client = redis::Client::build_with_tls(
                    info,
                    TlsCertificates { client_tls: None, root_cert: Some(root_cert) },
                )
                .map_err(|e| e.to_string())?;
                info = client.get_connection_info().clone();
            }
            if tls.mode == SslMode::VerifyCa {
                let mut addr = info.addr().clone();
                addr.set_danger_accept_invalid_hostnames(true);
                info = info.set_addr(addr);
            }
            return redis::Client::open(info)
                .map(|c| Self::Single(Box::new(c)))
                .map_err(|e| BadRedisUrl(e.to_string()));
        }
        let seeds = url.split(',').map(parse_seed).collect::<Result<Vec<_>, _>>()?;
        let Some(first) = seeds.first() else {
            return Err("no seed node".into());
        };
        let first_tls = first.tls.clone();
        if seeds.iter().any(|s| s.tls != first_tls) {
            return Err("every seed node needs the same scheme and TLS parameters".into());
        }
        let mut builder = ClusterClientBuilder::new(seeds.into_iter().map(|s| s.info));
        if let Some(tls) = &first_tls {
            if let Some(root_cert) = root_pem(tls)? {
                builder = builder.certs(TlsCertificates { client_tls: None, root_cert: Some(root_cert) });
            }
            if tls.mode == SslMode::VerifyCa {
                builder = builder.danger_accept_invalid_hostnames(true);
            }
        }
        builder.build().map(|c| Self::Cluster(Box::new(c))).map_err(|e| BadRedisUrl(e.to_string()))
    }

    fn sentinel(url: &str, master: &str) -> Result<Self, BadRedisUrl> {
        let seeds = url.split(',').map(parse_seed).collect::<Result<Vec<_>, _>>()?;
        let Some(first) = seeds.first() else {
            return Err("no Sentinel address".into());
        };
        let (tls, settings) = (first.tls.clone(), first.info.redis_settings().clone());
        if seeds.iter().any(|s| s.tls != tls) {
            return Err("every Sentinel needs the same scheme and TLS parameters".into());
        }
        let addrs = seeds.into_iter().map(|s| s.info.addr().clone());
        let mut b = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master).map_err(|e| e.to_string())?;
        if let Some(user) = settings.username() {
            b = b.set_client_to_redis_username(user).set_client_to_sentinel_username(user);
        }
        if let Some(password) = settings.password() {
            b = b.set_client_to_redis_password(password).set_client_to_sentinel_password(password);
        }
        if let Some(tls) = &tls {
            let mode = match tls.mode {
                SslMode::Require => TlsMode::Insecure,
                SslMode::VerifyFull => TlsMode::Secure,
                _ => return Err("with Sentinel, sslmode must be require or verify-full".into()),
            };
            b = b.set_client_to_redis_tls_mode(mode).set_client_to_sentinel_tls_mode(mode);
            if let Some(root_cert) = root_pem(tls)? {
                let certs = || TlsCertificates { client_tls: None, root_cert: Some(root_cert.clone()) };
                b = b.set_client_to_redis_certificates(certs()).set_client_to_sentinel_certificates(certs());
            }
        }
        let client = b.build().map_err(|e| e.to_string())?;
        Ok(Self::Sentinel(Arc::new(tokio::sync::Mutex::new(client))))
    }

    /// True when a failed command should drop the connection: a Sentinel-resolved master may
    /// have been replaced (the others reconnect by themselves).
    pub fn reconnect_after_errors(&self) -> bool {
        matches!(self, Self::Sentinel(_))
    }

    /// Connects, with `timeout` per command and a short connection timeout.
    ///
    /// # Errors
    /// The server or cluster cannot be reached, or TLS fails.
    pub async fn connect(&self, timeout: Duration) -> redis::RedisResult<RedisConn> {
        match self {
            Self::Single(client) => {
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_millis(500)))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                ConnectionManager::new_with_config(redis::Client::clone(client), cfg).await.map(RedisConn::Single)
            }
            Self::Cluster(client) => {
                let cfg = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(Duration::from_millis(500))
                    .set_response_timeout(timeout);
                client.get_async_connection_with_config(cfg).await.map(|c| RedisConn::Cluster(Box::new(c)))
            }
            Self::Sentinel(sentinel) => {
                let master = sentinel.lock().await.async_get_client().await?;
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_millis(500)))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(0)
                    .set_max_delay(Duration::from_millis(500));
                ConnectionManager::new_with_config(master, cfg).await.map(RedisConn::Single)
            }
        }
    }
}

/// A live connection to a server or a cluster; cheap to clone (both sides multiplex).
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(Box<ClusterConnection>),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_that_the_cache_could_not_use_are_refused_at_start_up() {
        for (url, cluster) in [
            ("http://127.0.0.1:6379", false),
            ("redis://127.0.0.1:6379?sslmode=require", false),
            ("rediss://127.0.0.1:6379?sslmode=disable", false),
            ("rediss://127.0.0.1:6379?sslmode=bogus", false),
            ("rediss://127.0.0.1:6379?sslrootcert=/nonexistent/ca.pem", false),
            ("redis://a:1,redis://b:2", false),
            ("redis://a:1,rediss://b:2", true),
        ] {
            assert!(RedisTarget::parse(url, cluster, None).is_err(), "{url} must be refused");
        }
    }

    #[test]
    fn plain_tls_and_cluster_urls_are_accepted() {
        assert!(matches!(RedisTarget::parse("redis://127.0.0.1:6379/0", false, None), Ok(RedisTarget::Single(_))));
        assert!(matches!(RedisTarget::parse("rediss://127.0.0.1:6379", false, None), Ok(RedisTarget::Single(_))));
        assert!(matches!(
            RedisTarget::parse("rediss://127.0.0.1:6379?sslmode=require", false, None),
            Ok(RedisTarget::Single(_))
        ));
        assert!(matches!(
            RedisTarget::parse("redis://127.0.0.1:7000,redis://127.0.0.1:7001", true, None),
            Ok(RedisTarget::Cluster(_))
        ));
        assert!(matches!(
            RedisTarget::parse("redis://127.0.0.1:26379,redis://127.0.0.1:26380", false, Some("mymaster")),
            Ok(RedisTarget::Sentinel(_))
        ));
        assert!(RedisTarget::parse("redis://127.0.0.1:26379", true, Some("mymaster")).is_err());
        assert!(RedisTarget::parse("rediss://127.0.0.1:26379?sslmode=verify-ca", false, Some("m")).is_err());
    }
}
