//! Private service processes and network faults for failure tests: a redis-server of
//! our own that can be stopped, and a TCP proxy in front of Postgres that can cut every
//! connection (to the router, indistinguishable from Postgres going down).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

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
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

/// A TCP proxy to `target`; `cut()` closes the listener and every open connection.
pub struct TcpProxy {
    pub port: u16,
    accept: JoinHandle<()>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl TcpProxy {
    pub async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let conns2 = Arc::clone(&conns);
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let h = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns2.lock().unwrap().push(h);
            }
        });
        Self { port, accept, conns }
    }

    /// Postgres "goes down": no new connections, existing ones are reset.
    pub fn cut(&self) {
        self.accept.abort();
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
    }
}
