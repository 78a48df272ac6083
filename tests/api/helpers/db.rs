//! A fresh Postgres database per test, dropped when the test ends.

use diesel_async::{AsyncConnection, AsyncPgConnection};
use uuid::Uuid;
pub use x402_router_testkit::db::admin_url;
use x402_router_testkit::db::{create_database, drop_database_blocking};

/// `postgres://…/<name>` on the test server.
pub fn url_for(name: &str) -> String {
    x402_router_testkit::db::url_for(&admin_url(), name)
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
        let url = create_database(&admin_url(), &name)
            .await
            .expect("create a database on the test Postgres (TEST_DATABASE_URL)");
        x402_router::db::run_migrations(&url).await.expect("migrate test database");
        Self { name, url }
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.url).await.expect("connect to test database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        drop_database_blocking(&admin_url(), &self.name);
    }
}
