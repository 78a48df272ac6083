//! The paid-path floor of `scripts/bench`: a minimal x402 client that pays an upstream
//! directly, with the crate's own `x402_router::x402` functions and nothing else (no
//! database, no chain reads, no receipt): `GET` → 402 → select → sign (EIP-3009, a random
//! nonce) → `GET` with the payment header → 200. Also the driver of the router's paid
//! `/route` in `scripts/bench --paid-realistic`, so that the router and the direct client are
//! called by the same HTTP stack.
//!
//! ```text
//! bench_paid --url http://127.0.0.1:P/v2/weather --network eip155:84532 --asset 0xTOKEN
//!            --count N --concurrency C [--max-amount 50000]     (key: ROUTER_PRIVATE_KEY)
//!            [--mode direct|ahead|router] [--router http://127.0.0.1:R] [--unique-query]
//!            [--warmup N] [--barrier PREFIX] [--latencies]
//! ```
//! * `direct` (default): probe unpaid, then pay (two requests per call).
//! * `ahead`: the minimal client that knows the terms: one probe before the measurement (in
//!   the warm-up), then every call signs those terms and pays with its first request.
//! * `router`: `POST <router>/route` with `{"url", "max_amount"}` and a new `Idempotency-Key`
//!   per call (agent key: `BENCH_API_KEY`); a call counts only when the envelope says the
//!   upstream answered 200 and the payment is `settled`. With `--unique-query` every call adds
//!   a query parameter never used before (`bench=<random tag>-<n>`), so that the router never
//!   knows the request's terms and probes first.
//!
//! `--warmup N`: N calls at the same concurrency before the measurement, not counted (they
//! open the connections a steady client keeps). `--barrier PREFIX`: after the warm-up, create
//! `PREFIX.warm` and wait (at most 120 s) for `PREFIX.go` before measuring, so that the caller
//! reads its counters between the two. Prints one JSON line: requests, ok, errors,
//! duration_s, rps and latency_us percentiles of the whole exchange, plus every latency
//! (`latencies_us`) with `--latencies`.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use alloy::primitives::{Address, B256, U256};
use alloy::signers::local::PrivateKeySigner;
use anyhow::Context as _;
use serde_json::json;
use x402_router::x402::{self, Network, PaymentRequired, Supported};
use x402_router_testkit::wait::wait_until;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Probe unpaid, then pay.
    Direct,
    /// Pay on the first request with the terms learnt once.
    Ahead,
    /// Through the router's `POST /route`.
    Router,
}

struct Args {
    url: String,
    network: Network,
    asset: Address,
    count: usize,
    concurrency: usize,
    max_amount: U256,
    mode: Mode,
    router: Option<String>,
    unique_query: bool,
    warmup: usize,
    barrier: Option<String>,
    latencies: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let (mut url, mut network, mut asset, mut router, mut barrier) = (None, None, None, None, None);
    let (mut count, mut concurrency, mut max_amount) = (100, 4, U256::from(50_000u64));
    let (mut mode, mut unique_query, mut warmup, mut latencies) = (Mode::Direct, false, 0, false);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--unique-query" => {
                unique_query = true;
                continue;
            }
            "--latencies" => {
                latencies = true;
                continue;
            }
            _ => {}
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--url" => url = Some(value),
            "--network" => network = Some(Network::parse(&value)?),
            "--asset" => asset = Some(Address::from_str(&value)?),
            "--count" => count = value.parse()?,
            "--concurrency" => concurrency = value.parse()?,
            "--max-amount" => max_amount = U256::from_str(&value)?,
            "--router" => router = Some(value.trim_end_matches('/').to_owned()),
            "--warmup" => warmup = value.parse()?,
            "--barrier" => barrier = Some(value),
            "--mode" => {
                mode = match value.as_str() {
                    "direct" => Mode::Direct,
                    "ahead" => Mode::Ahead,
                    "router" => Mode::Router,
                    other => anyhow::bail!("unknown mode {other} (direct, ahead, router)"),
                }
            }
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    anyhow::ensure!((mode == Mode::Router) == router.is_some(), "--router goes with --mode router (and only with it)");
    anyhow::ensure!(!unique_query || mode == Mode::Router, "--unique-query is for --mode router");
    Ok(Args {
        url: url.context("--url is required")?,
        network: network.context("--network is required")?,
        asset: asset.context("--asset is required")?,
        count,
        concurrency: concurrency.max(1),
        max_amount,
        mode,
        router,
        unique_query,
        warmup,
        barrier,
        latencies,
    })
}

struct Router {
    url: String,
    api_key: String,
}

struct Client {
    http: reqwest::Client,
    signer: PrivateKeySigner,
    supported: Supported,
    url: String,
    max_amount: U256,
    mode: Mode,
    router: Option<Router>,
    unique_query: bool,
    /// A random tag of this process: request URLs and idempotency keys never repeat across runs.
    tag: String,
    /// The calls made so far (warm-up included): the suffix of keys and unique queries.
    issued: AtomicUsize,
    /// The terms `Mode::Ahead` pays, learnt by its first call.
    known: OnceLock<PaymentRequired>,
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut raw = vec![0u8; bytes];
    getrandom::getrandom(&mut raw)?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// One paid exchange; `Ok` only for a 200 after payment.
async fn pay_once(c: &Client) -> anyhow::Result<()> {
    match c.mode {
        Mode::Direct => pay_direct(c).await,
        Mode::Ahead => pay_ahead(c).await,
        Mode::Router => pay_through_router(c).await,
    }
}

async fn probe(c: &Client) -> anyhow::Result<PaymentRequired> {
    let first = c.http.get(&c.url).send().await?;
    let status = first.status();
    let headers = first.headers().clone();
    let body = first.bytes().await?;
    Ok(x402::wire::parse_payment_required(status, &headers, &body)?)
}

/// Signs `required` for this call and sends the paid request.
async fn pay_with(c: &Client, required: &PaymentRequired) -> anyhow::Result<()> {
    let chosen =
        x402::select(&required.accepts, &c.supported, x402_router::money::Amount::from_u256(c.max_amount), None)
            .map_err(|r| anyhow::anyhow!("no payable requirement: {r}"))?;
    let mut nonce = [0u8; 32];
    getrandom::getrandom(&mut nonce)?;
    let signed = x402::sign_payment(&c.signer, chosen, B256::from(nonce), now_unix(), 300)?;
    let payload = x402::payload::payment_payload(required.version, chosen, required.resource.as_ref(), &signed, None)?;
    let (name, value) = x402::wire::encode_payment_header(required.version, &payload)?;
    let paid = c.http.get(&c.url).header(name, value).send().await?;
    let status = paid.status();
    let _ = paid.bytes().await?;
    anyhow::ensure!(status.is_success(), "paid request answered {status}");
    Ok(())
}

async fn pay_direct(c: &Client) -> anyhow::Result<()> {
    let required = probe(c).await?;
    pay_with(c, &required).await
}

async fn pay_ahead(c: &Client) -> anyhow::Result<()> {
    let required = match c.known.get() {
        Some(known) => known,
        None => {
            let learnt = probe(c).await?;
            c.known.get_or_init(|| learnt)
        }
    };
    pay_with(c, required).await
}

async fn pay_through_router(c: &Client) -> anyhow::Result<()> {
    let router = c.router.as_ref().context("no router")?;
    let n = c.issued.fetch_add(1, Ordering::Relaxed);
    let url = if c.unique_query {
        let sep = if c.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}bench={}-{n}", c.url, c.tag)
    } else {
        c.url.clone()
    };
    let answer = c
        .http
        .post(format!("{}/route", router.url))
        .bearer_auth(&router.api_key)
        .header("Idempotency-Key", format!("bench-paid-{}-{n:08}", c.tag))
        .json(&json!({ "url": url, "max_amount": c.max_amount.to_string() }))
        .send()
        .await?;
    let status = answer.status();
    let body = answer.bytes().await?;
    anyhow::ensure!(status.is_success(), "router answered {status}: {}", String::from_utf8_lossy(&body));
    let envelope: serde_json::Value = serde_json::from_slice(&body)?;
    anyhow::ensure!(envelope["status"] == 200, "the upstream answered {}", envelope["status"]);
    anyhow::ensure!(envelope["payment"]["status"] == "settled", "payment {}", envelope["payment"]["status"]);
    Ok(())
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What `count` calls, `concurrency` at a time, gave: every latency (µs), the errors and the
/// first error's text.
async fn run_calls(
    client: &Arc<Client>,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<u64>, usize, Option<String>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, next) = (Arc::clone(client), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut first_error) = (Vec::new(), 0usize, None);
            while next.fetch_add(1, Ordering::Relaxed) < count {
                let t = Instant::now();
                match pay_once(&client).await {
                    Ok(()) => lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
            }
            (lat, errors, first_error)
        }));
    }
    let (mut lat, mut errors, mut first_error) = (Vec::new(), 0, None);
    for t in tasks {
        let (l, e, f) = t.await?;
        lat.extend(l);
        errors += e;
        first_error = first_error.or(f);
    }
    Ok((lat, errors, first_error))
}

/// Tells the caller the warm-up is done (`PREFIX.warm`) and waits for its go (`PREFIX.go`).
async fn barrier(prefix: &str) -> anyhow::Result<()> {
    std::fs::write(format!("{prefix}.warm"), b"")?;
    let go = std::path::PathBuf::from(format!("{prefix}.go"));
    wait_until(Duration::from_secs(120), "the caller's go", || {
        let ready = go.exists();
        async move { ready }
    })
    .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let key = std::env::var("ROUTER_PRIVATE_KEY").context("ROUTER_PRIVATE_KEY is required")?;
    let router = match args.router {
        Some(url) => {
            let api_key = std::env::var("BENCH_API_KEY").context("--mode router needs BENCH_API_KEY")?;
            Some(Router { url, api_key: api_key.trim().to_owned() })
        }
        None => None,
    };
    let client = Arc::new(Client {
        http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?,
        signer: PrivateKeySigner::from_str(key.trim())?,
        supported: Supported::new([args.network], [(args.network, args.asset)])
            .with_decimals([((args.network, args.asset), 6)]),
        url: args.url,
        max_amount: args.max_amount,
        mode: args.mode,
        router,
        unique_query: args.unique_query,
        tag: random_hex(8)?,
        issued: AtomicUsize::new(0),
        known: OnceLock::new(),
    });
    if args.warmup > 0 {
        let (_, errors, first_error) = run_calls(&client, args.warmup, args.concurrency).await?;
        anyhow::ensure!(errors == 0, "{errors} warm-up call(s) failed: {}", first_error.unwrap_or_default());
    }
    if let Some(prefix) = &args.barrier {
        barrier(prefix).await?;
    }
    let started = Instant::now();
    let (mut lat, errors, first_error) = run_calls(&client, args.count, args.concurrency).await?;
    let secs = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    let mean = if lat.is_empty() { 0.0 } else { lat.iter().sum::<u64>() as f64 / lat.len() as f64 };
    let mut out = json!({
        "requests": lat.len() + errors, "ok": lat.len(), "errors": errors,
        "first_error": first_error, "duration_s": secs,
        "rps": lat.len() as f64 / secs,
        "latency_us": { "p50": percentile(&lat, 50.0), "p99": percentile(&lat, 99.0),
                        "p999": percentile(&lat, 99.9), "max": lat.last().copied().unwrap_or(0),
                        "mean": mean },
    });
    if args.latencies {
        out["latencies_us"] = json!(lat);
    }
    println!("{out}");
    Ok(())
}
