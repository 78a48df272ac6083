//! Postgres settings shared by every sub-command (`DATABASE_URL`, the pool, the bounded waits):
//! the flags as given ([`DatabaseArgs`]) and the typed settings ([`DatabaseConfig`]).

use std::time::Duration;

use clap::Args;

use super::parse::{parse_ms, parse_num, required};
use super::{ConfigError, Secret};

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
        self.counted_pool(None)
    }

    /// [`Self::pool`], its connections counting their statements into `traffic`.
    pub fn counted_pool(&self, traffic: Option<crate::db::Traffic>) -> crate::db::PgPool {
        // Both were validated when the configuration was built.
        let session = self.session_url().ok();
        let connector = session
            .as_ref()
            .and_then(|u| crate::db::Connector::from_url(u.expose()).ok())
            .unwrap_or_else(|| self.connector.clone())
            .counting(traffic);
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
