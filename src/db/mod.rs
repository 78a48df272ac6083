//! Postgres plumbing: the bb8 pool of diesel-async connections, the embedded migrations
//! and the schema, the connection string in either libpq form (several hosts allowed) and the
//! pool's failover handling ([`FailoverWatch`]). No business logic lives here.

pub mod conninfo;
pub mod prepared;
pub mod schema;
pub mod storable;
pub mod tls;
pub mod traffic;

pub use prepared::PrepareExt;
pub use tls::Connector;
pub use traffic::Traffic;

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::bb8::{Pool, PooledConnection};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, PoolableConnection, RecyclingMethod,
};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

/// The migrations in `migrations/`, compiled into the binary.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

pub type PgPool = Pool<AsyncPgConnection>;
pub type PgConn<'a> = PooledConnection<'a, AsyncPgConnection>;

/// What a pool is built from (the typed `DATABASE_*` settings; `config` builds it).
pub struct PoolSettings<'a> {
    pub url: &'a str,
    pub connector: &'a Connector,
    pub size: u32,
    pub acquire_timeout: Duration,
}

/// Builds the pool without connecting: the service starts even while Postgres is down
/// (requests then get 503 until it is back). Every session has bounded waits
/// ([`DatabaseConfig::session_url`]).
///
/// A connection is checked on checkout without a round trip: it is discarded (and replaced)
/// when its socket was closed (e.g. Postgres restarted) or a transaction was left open.
/// diesel-async's default check runs `SELECT 1` on every checkout, one extra round trip per
/// pool use: a third of the Postgres traffic of a replay (BENCHMARKS.md).
///
/// Connections are opened by the [`Connector`] parsed from `DATABASE_URL` (TLS per `sslmode`).
///
/// Failover: a connection whose server stopped accepting writes (a fenced old primary, a
/// node turned standby) is discarded at its next checkout, like a closed one
/// ([`FailoverWatch`]); the replacement is opened by the connector, which with several hosts
/// and `target_session_attrs=read-write` finds the primary.
pub fn pool(settings: &PoolSettings<'_>) -> PgPool {
    let mut manager_config = ManagerConfig::<AsyncPgConnection>::default();
    let connector = settings.connector.clone();
    manager_config.custom_setup = Box::new(move |_url| {
        let connector = connector.clone();
        Box::pin(async move { connector.connect().await })
    });
    manager_config.recycling_method = RecyclingMethod::CustomFunction(Box::new(|conn| {
        let broken = conn.is_broken() || FailoverWatch::saw_read_only(conn);
        Box::pin(async move { if broken { Err(diesel::result::Error::BrokenTransactionManager) } else { Ok(()) } })
    }));
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(settings.url, manager_config);
    Pool::builder()
        .max_size(settings.size)
        .min_idle(Some(0))
        .connection_timeout(settings.acquire_timeout)
        .idle_timeout(Some(Duration::from_secs(300)))
        .build_unchecked(manager)
}

/// Watches a connection for the sign that its server no longer accepts writes: the server
/// reported `in_hot_standby` or `default_transaction_read_only` on (set by the connection's
/// driver, see [`tls::Connector::connect`]; Postgres 14 and later), or, as a second signal,
/// a statement failed as read-only (SQLSTATE 25006; diesel-async reports the errors of
/// statements without result rows, not those of a query's row stream). Such a connection is still open, so the pool would keep handing it out, every
/// write failing, until the old primary went away; the pool's checkout check ([`pool`])
/// discards it instead, without a round trip.
///
/// The same instrumentation counts what the connection sends ([`traffic`]).
#[derive(Debug, Default)]
pub struct FailoverWatch {
    read_only: std::sync::Arc<std::sync::atomic::AtomicBool>,
    traffic: traffic::TrafficWatch,
}

impl FailoverWatch {
    /// A watch that also counts the connection's statements into `traffic`.
    pub(crate) fn counting(traffic: Option<Traffic>) -> Self {
        Self { read_only: std::sync::Arc::default(), traffic: traffic::TrafficWatch::new(traffic) }
    }

    /// The flag the connection's driver sets.
    pub(crate) fn read_only_flag(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        std::sync::Arc::clone(&self.read_only)
    }

    /// Whether `conn` (opened by a [`Connector`]) has been seen on a server that does not
    /// accept writes.
    pub fn saw_read_only(conn: &mut AsyncPgConnection) -> bool {
        diesel_async::AsyncConnection::instrumentation(conn)
            .downcast_ref::<Self>()
            .is_some_and(|w| w.read_only.load(std::sync::atomic::Ordering::Acquire))
    }
}

impl diesel::connection::Instrumentation for FailoverWatch {
    fn on_connection_event(&mut self, event: diesel::connection::InstrumentationEvent<'_>) {
        use diesel::result::{DatabaseErrorKind, Error};
        self.traffic.on_event(&event);
        if let diesel::connection::InstrumentationEvent::FinishQuery {
            error: Some(Error::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _)),
            ..
        } = event
        {
            self.read_only.store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

/// Key of the session-level advisory lock held while migrating ("x402mig" in ASCII), so
/// that replicas started together migrate one after another: the first applies the
/// migrations, the others wait, then find nothing pending.
pub const MIGRATION_LOCK_KEY: i64 = 0x0078_3430_326d_6967;

/// Applies pending migrations under [`MIGRATION_LOCK_KEY`]; returns the versions applied.
///
/// The lock is a session lock on the migrating connection: Postgres releases it if the
/// process dies, so a crashed migration never blocks the next start. Waiting for another
/// process's migration is logged once.
///
/// Runs on a blocking thread: diesel's migration harness is synchronous and
/// `AsyncConnectionWrapper` drives the connection from there.
///
/// # Errors
/// Connection or migration failure.
pub async fn run_migrations(url: &str) -> anyhow::Result<Vec<String>> {
    run_migrations_reporting(url, |_, _| {}).await
}

/// [`run_migrations`], one migration at a time, calling `on_step(applied, pending)` before the
/// first and after each (the `migrate` command's progress); not called when none is pending.
///
/// # Errors
/// Connection or migration failure (the migrations applied before it stay applied).
pub async fn run_migrations_reporting(
    url: &str,
    on_step: impl FnMut(usize, usize) + Send + 'static,
) -> anyhow::Result<Vec<String>> {
    let connector = Connector::from_url(url).map_err(|e| anyhow::anyhow!("DATABASE_URL: {e}"))?;
    let conn = connector.connect().await?;
    let applied = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        use diesel::RunQueryDsl;
        let mut conn: AsyncConnectionWrapper<AsyncPgConnection> = AsyncConnectionWrapper::from(conn);
        #[derive(diesel::QueryableByName)]
        struct Locked {
            #[diesel(sql_type = diesel::sql_types::Bool)]
            locked: bool,
        }
        let got: Locked = diesel::sql_query(format!("SELECT pg_try_advisory_lock({MIGRATION_LOCK_KEY}) AS locked"))
            .get_result(&mut conn)?;
        if !got.locked {
            tracing::info!("another process is migrating the database; waiting for it");
            diesel::sql_query(format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")).execute(&mut conn)?;
        }
        let result = apply_pending(&mut conn, on_step);
        // Released with the session anyway; unlock explicitly for a long-lived caller.
        let _ = diesel::sql_query(format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")).execute(&mut conn);
        result
    })
    .await??;
    Ok(applied)
}

/// Applies the pending migrations in version order, each in its own transaction.
fn apply_pending(
    conn: &mut AsyncConnectionWrapper<AsyncPgConnection>,
    mut on_step: impl FnMut(usize, usize),
) -> anyhow::Result<Vec<String>> {
    let pending = conn.pending_migrations(MIGRATIONS).map_err(|e| anyhow::anyhow!("migration failed: {e}"))?;
    if !pending.is_empty() {
        on_step(0, pending.len());
    }
    let mut applied = Vec::with_capacity(pending.len());
    for migration in &pending {
        let version = conn.run_migration(migration.as_ref()).map_err(|e| {
            anyhow::anyhow!("migration {} failed: {e}", diesel::migration::Migration::name(migration.as_ref()))
        })?;
        applied.push(version.to_string());
        on_step(applied.len(), pending.len());
    }
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
