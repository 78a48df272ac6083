//! Databases created for one test or one run on a Postgres server, and dropped again.

use tokio_postgres::NoTls;

/// The server the tests create their databases on (`TEST_DATABASE_URL`).
pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// `postgres://…/<name>` on the server of `admin`.
pub fn url_for(admin: &str, name: &str) -> String {
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(admin);
    format!("{base}/{name}")
}

/// Creating or dropping a database failed.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("invalid database name {0:?}")]
    Name(String),
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
}

fn check_name(name: &str) -> Result<(), DbError> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(DbError::Name(name.to_owned()));
    }
    Ok(())
}

async fn admin(admin: &str) -> Result<tokio_postgres::Client, DbError> {
    let (client, connection) = tokio_postgres::connect(admin, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// `CREATE DATABASE name` on the server of `admin_url`; returns its URL.
pub async fn create_database(admin_url: &str, name: &str) -> Result<String, DbError> {
    check_name(name)?;
    admin(admin_url).await?.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    Ok(url_for(admin_url, name))
}

/// `DROP DATABASE IF EXISTS name WITH (FORCE)`.
pub async fn drop_database(admin_url: &str, name: &str) -> Result<(), DbError> {
    check_name(name)?;
    admin(admin_url).await?.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
    Ok(())
}

/// [`drop_database`] from a `Drop` impl: on a private runtime on its own thread (the
/// caller's runtime may be shutting down).
pub fn drop_database_blocking(admin_url: &str, name: &str) {
    let (admin_url, name) = (admin_url.to_owned(), name.to_owned());
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return;
        };
        let _ = rt.block_on(drop_database(&admin_url, &name));
    })
    .join();
}
