//! Private service processes for failure tests: a redis-server of our own that can be
//! stopped. (The TCP proxy that cuts Postgres off is the testkit's `Proxy`.)

use std::process::Stdio;
use std::time::Duration;

use super::app::free_port;

/// A redis-server process owned by one test.
pub struct PrivateRedis {
    pub url: String,
    pub port: u16,
    child: Option<std::process::Child>,
}

impl PrivateRedis {
    pub async fn start() -> Self {
        let port = free_port();
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let child = std::process::Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (install it with scripts/test, or set REDIS_SERVER_BIN)");
        x402_router_testkit::wait_port(port, Duration::from_secs(2)).await.expect("redis-server listens");
        Self { url: format!("redis://127.0.0.1:{port}"), port, child: Some(child) }
    }

    /// Stops the server (SIGKILL) and waits for it to be gone.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn flushall(&self) {
        let client = redis::Client::open(self.url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    }

    pub async fn keys(&self) -> Vec<String> {
        let client = redis::Client::open(self.url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap()
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}
