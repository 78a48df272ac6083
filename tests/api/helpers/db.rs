//! A fresh Postgres database per test, dropped when the test ends.

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

/// The server the tests create their databases on.
pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// `postgres://…/<name>` on the test server.
pub fn url_for(name: &str) -> String {
    let admin = admin_url();
    let base = admin.rsplit_once('/').map(|(b, _)| b.to_owned()).unwrap_or(admin);
    format!("{base}/{name}")
}

/// A test database; dropped (forcefully) when this value is dropped.
pub struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    /// Creates and migrates a new database.
    pub async fn new() -> Self {
        let name = format!("x4r_test_{}", Uuid::new_v4().simple());
        let mut admin =
            AsyncPgConnection::establish(&admin_url()).await.expect("connect to the test Postgres (TEST_DATABASE_URL)");
        diesel::sql_query(format!("CREATE DATABASE {name}")).execute(&mut admin).await.expect("create test database");
        let url = url_for(&name);
        x402_router::db::run_migrations(&url).await.expect("migrate test database");
        Self { name, url }
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.url).await.expect("connect to test database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs outside any async context we can rely on: use a private runtime.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            rt.block_on(async {
                if let Ok(mut admin) = AsyncPgConnection::establish(&admin_url()).await {
                    let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut admin)
                        .await;
                }
            });
        })
        .join();
    }
}
