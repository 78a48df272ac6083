//! The network of `scripts/bench --paid-realistic`: a TCP proxy that delays every byte by a
//! fixed one-way delay in each direction, and counts what crosses it.
//!
//! ```text
//! bench_delay --delay-ms 20 --forward NAME=127.0.0.1:PORT [--forward NAME=…]…
//! ```
//! Each `--forward` listens on a free loopback port and forwards to its target. Prints one
//! JSON line once bound: `{"listening":{"NAME":"127.0.0.1:P",…},"stats":"127.0.0.1:S"}`;
//! `GET http://127.0.0.1:S/` answers the counters of every forward (JSON, below).
//!
//! The model of the link:
//! * every chunk read from one side is written to the other `delay` after it was read, in
//!   order (one queue per direction; nothing is reordered or merged across the delay);
//! * a new connection pays the TCP handshake's round trip: nothing the client sends is
//!   forwarded before `2 × delay` after the connection was accepted (then `delay` more);
//! * bounded buffering: at most [`QUEUE`] chunks of at most [`CHUNK`] bytes wait per
//!   direction; when the queue is full the proxy stops reading that side (TCP back-pressure);
//! * a half-close travels like data (after the same delay); no bandwidth limit, no loss.
//!
//! tokio's timer has a 1 ms resolution: each crossing takes `delay` to `delay + 1 ms`.
//!
//! Counters per forward (client → target direction): `connections` accepted, `http_requests`
//! (HTTP/1.1 request lines, i.e. occurrences of `HTTP/1.1\r\n`), `jsonrpc_calls` (occurrences
//! of `"jsonrpc"`: each call of a batch counts), `methods` (the JSON-RPC `"method"` names),
//! and the bytes each way. Not part of the service: a measuring instrument only (loopback).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The largest chunk read at once.
const CHUNK: usize = 16 * 1024;
/// Chunks waiting per direction at most (bounded buffering: 1 MiB per direction).
const QUEUE: usize = 64;
/// Bytes kept from the previous chunk so that a pattern split across two reads is found.
const CARRY: usize = 64;
/// The longest JSON-RPC method name recorded (longer ones are counted in `jsonrpc_calls` only).
const MAX_METHOD: usize = 48;

struct Forward {
    name: String,
    target: String,
}

struct Args {
    delay: Duration,
    forwards: Vec<Forward>,
}

fn parse_args() -> anyhow::Result<Args> {
    let (mut delay, mut forwards) = (Duration::from_millis(20), Vec::new());
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--delay-ms" => delay = Duration::from_millis(value.parse()?),
            "--forward" => {
                let (name, target) = value.split_once('=').context("--forward takes NAME=HOST:PORT")?;
                anyhow::ensure!(!name.is_empty() && !target.is_empty(), "--forward takes NAME=HOST:PORT");
                forwards.push(Forward { name: name.to_owned(), target: target.to_owned() });
            }
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    anyhow::ensure!(!forwards.is_empty(), "at least one --forward is required");
    Ok(Args { delay, forwards })
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    http_requests: AtomicU64,
    jsonrpc_calls: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    methods: Mutex<BTreeMap<String, u64>>,
}

impl Counters {
    fn snapshot(&self) -> serde_json::Value {
        let methods = self.methods.lock().map(|m| m.clone()).unwrap_or_default();
        json!({
            "connections": self.connections.load(Ordering::Relaxed),
            "http_requests": self.http_requests.load(Ordering::Relaxed),
            "jsonrpc_calls": self.jsonrpc_calls.load(Ordering::Relaxed),
            "bytes_up": self.bytes_up.load(Ordering::Relaxed),
            "bytes_down": self.bytes_down.load(Ordering::Relaxed),
            "methods": methods,
        })
    }
}

/// Counts the patterns of the client → target stream, across chunk boundaries: a match is
/// counted once, in the read where it ends (matches lying wholly in the carried bytes were
/// counted the read before).
struct Scanner {
    carry: Vec<u8>,
}

impl Scanner {
    fn scan(&mut self, chunk: &[u8], counters: &Counters) {
        let mut window = std::mem::take(&mut self.carry);
        let old = window.len();
        window.extend_from_slice(chunk);
        let is_new = |end: usize| end > old;
        let requests = ends_of(&window, b"HTTP/1.1\r\n").filter(|&e| is_new(e)).count();
        let calls = ends_of(&window, b"\"jsonrpc\"").filter(|&e| is_new(e)).count();
        counters.http_requests.fetch_add(requests as u64, Ordering::Relaxed);
        counters.jsonrpc_calls.fetch_add(calls as u64, Ordering::Relaxed);
        let prefix = b"\"method\":\"";
        for start in ends_of(&window, prefix) {
            let rest = &window[start..];
            let Some(len) = rest.iter().take(MAX_METHOD + 1).position(|&b| b == b'"') else { continue };
            if !is_new(start + len + 1) {
                continue;
            }
            let name = String::from_utf8_lossy(&rest[..len]).into_owned();
            if let Ok(mut methods) = counters.methods.lock() {
                *methods.entry(name).or_default() += 1;
            }
        }
        let keep = window.len().saturating_sub(CARRY);
        self.carry = window.split_off(keep);
    }
}

/// The end offsets of every occurrence of `pattern` in `hay`.
fn ends_of<'a>(hay: &'a [u8], pattern: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    hay.windows(pattern.len()).enumerate().filter(move |(_, w)| *w == pattern).map(move |(i, _)| i + pattern.len())
}

/// One chunk on its way: released at `at`; `None` is the sender's half-close.
type Crossing = (Instant, Option<Vec<u8>>);

/// Reads `from` and queues each chunk for release `delay` after it was read (and not before
/// `not_before + delay`).
async fn read_side(
    mut from: OwnedReadHalf,
    queue: mpsc::Sender<Crossing>,
    delay: Duration,
    not_before: Instant,
    counters: Arc<Counters>,
    upstream: bool,
) {
    let mut scanner = upstream.then(|| Scanner { carry: Vec::new() });
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        let at = Instant::now().max(not_before) + delay;
        if n == 0 {
            let _ = queue.send((at, None)).await;
            return;
        }
        let bytes = if upstream { &counters.bytes_up } else { &counters.bytes_down };
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(scanner) = scanner.as_mut() {
            scanner.scan(&buf[..n], &counters);
        }
        if queue.send((at, Some(buf[..n].to_vec()))).await.is_err() {
            return;
        }
    }
}

/// Writes each queued chunk to `to` at its release time; a queued half-close shuts `to` down.
async fn write_side(mut to: OwnedWriteHalf, mut queue: mpsc::Receiver<Crossing>) {
    while let Some((at, chunk)) = queue.recv().await {
        // lets time pass: the link's one-way delay, until this chunk's release time.
        tokio::time::sleep_until(at).await;
        match chunk {
            Some(bytes) => {
                if to.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            None => {
                let _ = to.shutdown().await;
                return;
            }
        }
    }
}

async fn relay(client: TcpStream, target: String, delay: Duration, counters: Arc<Counters>) {
    let accepted = Instant::now();
    let Ok(server) = TcpStream::connect(&target).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let (up_tx, up_rx) = mpsc::channel(QUEUE);
    let (down_tx, down_rx) = mpsc::channel(QUEUE);
    // The handshake's round trip: the client's first bytes leave it one RTT after connect().
    let handshake = accepted + 2 * delay;
    tokio::join!(
        read_side(client_read, up_tx, delay, handshake, Arc::clone(&counters), true),
        write_side(server_write, up_rx),
        read_side(server_read, down_tx, delay, accepted, counters, false),
        write_side(client_write, down_rx),
    );
}

async fn serve_stats(listener: TcpListener, all: Arc<Vec<(String, Arc<Counters>)>>) {
    while let Ok((mut conn, _)) = listener.accept().await {
        let all = Arc::clone(&all);
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            let body: serde_json::Map<String, serde_json::Value> =
                all.iter().map(|(name, c)| (name.clone(), c.snapshot())).collect();
            let body = serde_json::Value::Object(body).to_string();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let mut listening = serde_json::Map::new();
    let mut all = Vec::new();
    for forward in args.forwards {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        listening.insert(forward.name.clone(), json!(listener.local_addr()?.to_string()));
        let counters = Arc::new(Counters::default());
        all.push((forward.name, Arc::clone(&counters)));
        let (target, delay) = (forward.target, args.delay);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counters.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(relay(client, target.clone(), delay, Arc::clone(&counters)));
            }
        });
    }
    let stats = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", json!({ "listening": listening, "stats": stats.local_addr()?.to_string() }));
    serve_stats(stats, Arc::new(all)).await;
    Ok(())
}
