//! Loopback ports.

use std::time::Duration;

use crate::wait::{TimedOut, wait_until};

/// A free loopback port (bound, then released).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until something accepts connections on `127.0.0.1:port`.
pub async fn wait_port(port: u16, limit: Duration) -> Result<(), TimedOut> {
    wait_until(limit, &format!("a listener on port {port}"), || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
    })
    .await
}
