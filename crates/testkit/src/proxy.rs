//! A small fault-injecting TCP proxy: forwards 127.0.0.1:<port> to a target, and on demand
//! drops every open connection, stalls all traffic (bytes wait, connections stay open), or
//! cuts the target off for good (to a client, indistinguishable from the target going down).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, Default)]
struct Ctl {
    /// Bumped to drop every connection open at that moment.
    generation: u64,
    stalled: bool,
    /// New connections are closed at once (the target "refuses"), until lifted.
    refusing: bool,
}

pub struct Proxy {
    pub port: u16,
    ctl: watch::Sender<Ctl>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target` (`127.0.0.1:<port>`).
    pub async fn start(target: String) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (ctl, watcher) = watch::channel(Ctl::default());
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if watcher.borrow().refusing {
                    drop(inbound);
                    continue;
                }
                let (target, ctl) = (target.clone(), watcher.clone());
                tokio::spawn(async move {
                    let generation = ctl.borrow().generation;
                    let Ok(outbound) = TcpStream::connect(&target).await else { return };
                    let mut dropped = ctl.clone();
                    tokio::select! {
                        () = forward(inbound, outbound, ctl) => {}
                        _ = dropped.wait_for(|c| c.generation != generation) => {}
                    }
                });
            }
        });
        Ok(Self { port, ctl, accept })
    }

    /// Resets every open connection (new ones are accepted again at once).
    pub fn drop_all(&self) {
        self.ctl.send_modify(|c| c.generation += 1);
    }

    /// Holds all traffic for `d`, then lets it flow again (stops by itself).
    pub fn stall(&self, d: Duration) {
        self.ctl.send_modify(|c| c.stalled = true);
        let ctl = self.ctl.clone();
        tokio::spawn(async move {
            // lets time pass: the stall lasts `d`, the fault the caller asked for.
            crate::wait::let_time_pass(d).await;
            ctl.send_modify(|c| c.stalled = false);
        });
    }

    /// The target "goes down": no new connections, every open one is reset.
    pub fn cut(&self) {
        self.accept.abort();
        self.drop_all();
    }

    pub fn clear(&self) {
        self.ctl.send_modify(|c| c.stalled = false);
    }

    /// While `refusing`, every new connection is closed at once (open ones are not touched:
    /// [`Self::drop_all`] resets them); lifted, connections are forwarded again.
    pub fn refuse(&self, refusing: bool) {
        self.ctl.send_modify(|c| c.refusing = refusing);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.drop_all();
    }
}

async fn forward(a: TcpStream, b: TcpStream, ctl: watch::Receiver<Ctl>) {
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    tokio::select! {
        () = pump(ar, bw, ctl.clone()) => {}
        () = pump(br, aw, ctl) => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut ctl: watch::Receiver<Ctl>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if ctl.wait_for(|c| !c.stalled).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if ctl.wait_for(|c| !c.stalled).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
