//! Postgres plumbing: the bb8 pool of diesel-async connections, the embedded migrations
//! and the schema. No business logic lives here.

pub mod prepared;
pub mod schema;
pub mod storable;

pub use prepared::PrepareExt;

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::bb8::{Pool, PooledConnection};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, PoolableConnection, RecyclingMethod,
};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use crate::config::DatabaseConfig;

/// The migrations in `migrations/`, compiled into the binary.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

pub type PgPool = Pool<AsyncPgConnection>;
pub type PgConn<'a> = PooledConnection<'a, AsyncPgConnection>;

/// Builds the pool without connecting: the service starts even while Postgres is down
/// (requests then get 503 until it is back). Every session has bounded waits
/// ([`DatabaseConfig::session_url`]).
///
/// A connection is checked on checkout without a round trip: it is discarded (and replaced)
/// when its socket was closed (e.g. Postgres restarted) or a transaction was left open.
/// diesel-async's default check runs `SELECT 1` on every checkout, one extra round trip per
/// pool use: a third of the Postgres traffic of a replay (BENCHMARKS.md).
pub fn pool(config: &DatabaseConfig) -> PgPool {
    // Validated when the configuration was built; an unparsable URL here fails every checkout.
    let url = config.session_url().map_or_else(|_| config.url.expose().to_owned(), |u| u.expose().to_owned());
    let mut manager_config = ManagerConfig::<AsyncPgConnection>::default();
    manager_config.recycling_method = RecyclingMethod::CustomFunction(Box::new(|conn| {
        let broken = conn.is_broken();
        Box::pin(async move { if broken { Err(diesel::result::Error::BrokenTransactionManager) } else { Ok(()) } })
    }));
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(url, manager_config);
    Pool::builder()
        .max_size(config.pool_size)
        .min_idle(Some(0))
        .connection_timeout(config.acquire_timeout)
        .idle_timeout(Some(Duration::from_secs(300)))
        .build_unchecked(manager)
}

/// Applies pending migrations; returns the versions applied.
///
/// Runs on a blocking thread: diesel's migration harness is synchronous and
/// `AsyncConnectionWrapper` drives its own small runtime there.
///
/// # Errors
/// Connection or migration failure.
pub async fn run_migrations(url: &str) -> anyhow::Result<Vec<String>> {
    let url = url.to_owned();
    let applied = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        let mut conn: AsyncConnectionWrapper<AsyncPgConnection> = diesel::Connection::establish(&url)?;
        let versions = conn.run_pending_migrations(MIGRATIONS).map_err(|e| anyhow::anyhow!("migration failed: {e}"))?;
        Ok(versions.into_iter().map(|v| v.to_string()).collect())
    })
    .await??;
    Ok(applied)
}

/// Reverts every migration (used by the migration round-trip test).
///
/// # Errors
/// Connection or migration failure.
pub async fn revert_all_migrations(url: &str) -> anyhow::Result<usize> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<usize> {
        let mut conn: AsyncConnectionWrapper<AsyncPgConnection> = diesel::Connection::establish(&url)?;
        let versions = conn.revert_all_migrations(MIGRATIONS).map_err(|e| anyhow::anyhow!("revert failed: {e}"))?;
        Ok(versions.len())
    })
    .await?
}

/// Whether a query error is the database being unreachable or briefly unable to serve
/// (connection lost, failover to a read-only node, shutdown, lock or statement timeout,
/// serialization conflict): the same request may succeed later. Anything else (a
/// constraint, a type mismatch, a broken invariant) would fail again.
pub fn is_transient(e: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind as K, Error as E};
    match e {
        E::DatabaseError(K::ClosedConnection | K::UnableToSendCommand | K::SerializationFailure, _)
        | E::DatabaseError(K::ReadOnlyTransaction, _)
        | E::BrokenTransactionManager => true,
        // diesel-async reports SQLSTATEs it has no kind for as `Unknown`; the message tells.
        E::DatabaseError(K::Unknown, info) => {
            let m = info.message();
            [
                "terminating connection",
                "the database system is",
                "canceling statement due to",
                "could not obtain lock",
                "lock timeout",
                "deadlock detected",
                "too many connections",
            ]
            .iter()
            .any(|s| m.contains(s))
        }
        _ => false,
    }
}
