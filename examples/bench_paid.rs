//! The paid-path floor of `scripts/bench`: a minimal x402 client that pays an upstream
//! directly, with the crate's own `x402_router::x402` functions and nothing else (no
//! database, no chain reads, no receipt): `GET` → 402 → select → sign (EIP-3009, a random
//! nonce) → `GET` with the payment header → 200.
//!
//! ```text
//! bench_paid --url http://127.0.0.1:P/v2/weather --network eip155:84532 --asset 0xTOKEN
//!            --count N --concurrency C [--max-amount 50000]     (key: ROUTER_PRIVATE_KEY)
//! ```
//! Prints one JSON line: requests, ok, errors, duration_s, rps and latency_us percentiles of
//! the whole exchange (both requests), the figure the router's paid `/route` is compared to.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use alloy::primitives::{Address, B256, U256};
use alloy::signers::local::PrivateKeySigner;
use anyhow::Context as _;
use serde_json::json;
use x402_router::x402::{self, Network, Supported};

struct Args {
    url: String,
    network: Network,
    asset: Address,
    count: usize,
    concurrency: usize,
    max_amount: U256,
}

fn parse_args() -> anyhow::Result<Args> {
    let (mut url, mut network, mut asset) = (None, None, None);
    let (mut count, mut concurrency, mut max_amount) = (100, 4, U256::from(50_000u64));
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--url" => url = Some(value),
            "--network" => network = Some(Network::parse(&value)?),
            "--asset" => asset = Some(Address::from_str(&value)?),
            "--count" => count = value.parse()?,
            "--concurrency" => concurrency = value.parse()?,
            "--max-amount" => max_amount = U256::from_str(&value)?,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(Args {
        url: url.context("--url is required")?,
        network: network.context("--network is required")?,
        asset: asset.context("--asset is required")?,
        count,
        concurrency: concurrency.max(1),
        max_amount,
    })
}

struct Client {
    http: reqwest::Client,
    signer: PrivateKeySigner,
    supported: Supported,
    url: String,
    max_amount: U256,
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One paid exchange; `Ok` only for a 200 after payment.
async fn pay_once(c: &Client) -> anyhow::Result<()> {
    let first = c.http.get(&c.url).send().await?;
    let status = first.status();
    let headers = first.headers().clone();
    let body = first.bytes().await?;
    let required = x402::wire::parse_payment_required(status, &headers, &body)?;
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

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let key = std::env::var("ROUTER_PRIVATE_KEY").context("ROUTER_PRIVATE_KEY is required")?;
    let client = Arc::new(Client {
        http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?,
        signer: PrivateKeySigner::from_str(key.trim())?,
        supported: Supported::new([args.network], [(args.network, args.asset)])
            .with_decimals([((args.network, args.asset), 6)]),
        url: args.url,
        max_amount: args.max_amount,
    });
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (client, next, count) = (Arc::clone(&client), Arc::clone(&next), args.count);
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
    let secs = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    let mean = if lat.is_empty() { 0.0 } else { lat.iter().sum::<u64>() as f64 / lat.len() as f64 };
    println!(
        "{}",
        json!({
            "requests": lat.len() + errors, "ok": lat.len(), "errors": errors,
            "first_error": first_error, "duration_s": secs,
            "rps": lat.len() as f64 / secs,
            "latency_us": { "p50": percentile(&lat, 50.0), "p99": percentile(&lat, 99.0),
                            "p999": percentile(&lat, 99.9), "max": lat.last().copied().unwrap_or(0),
                            "mean": mean },
        })
    );
    Ok(())
}
