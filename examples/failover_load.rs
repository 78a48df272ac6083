//! The load and the bookkeeping of `scripts/failover` (see RELIABILITY.md): paid and free
//! `/route` calls through several routers while Postgres fails over, then a count of what
//! the chain, the ledger and the receipts say.
//!
//! ```text
//! failover_load --routers http://A,http://B --agent-key KEY --paid-url URL --free-url URL
//!               --duration-s 30 --concurrency 8 --failover-after-s 10 --failover-cmd 'CMD'
//!               --database-url CONNINFO --rpc-url URL --token 0x… --payer 0x… --pay-to 0x…
//!               --price 10000 --out FILE.json
//! ```
//!
//! Each worker sends calls with fresh Idempotency-Keys, alternating routers, one paid for
//! one free. A call that gets no final answer (transport error, 503, 409 in flight, 504) is
//! retried with the same key, on the other router, until it has one: what a well-behaved
//! agent does. At `--failover-after-s` the failover command runs (crash the primary, promote
//! the standby); the time from its start and from its end to the first answered new call
//! (per router) is "serving again".
//!
//! Then every answered key is replayed (it must come back as a replay, with the same receipt)
//! and the books are compared: `AuthorizationUsed` and `Transfer` logs of the payer on the
//! chain, `payments` and `receipts` rows in the ledger. Prints and writes one JSON document.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy::primitives::{Address, B256, U256};
use alloy::providers::{Provider, RootProvider};
use alloy::rpc::types::Filter;
use alloy::sol;
use alloy::sol_types::SolEvent;
use anyhow::Context as _;
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use x402_router_testkit::wait::{Deadline, let_time_pass};

sol! {
    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
    event Transfer(address indexed from, address indexed to, uint256 value);
}

struct Args {
    routers: Vec<String>,
    agent_key: String,
    paid_url: String,
    free_url: String,
    duration: Duration,
    concurrency: usize,
    failover_after: Duration,
    failover_cmd: String,
    database_url: String,
    rpc_url: String,
    token: Address,
    payer: Address,
    pay_to: Address,
    price: U256,
    out: String,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut m: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        m.insert(flag.trim_start_matches("--").to_owned(), value);
    }
    let mut get = |k: &str| m.remove(k).with_context(|| format!("--{k} is required"));
    Ok(Args {
        routers: get("routers")?.split(',').map(str::to_owned).collect(),
        agent_key: get("agent-key")?,
        paid_url: get("paid-url")?,
        free_url: get("free-url")?,
        duration: Duration::from_secs(get("duration-s")?.parse()?),
        concurrency: get("concurrency")?.parse()?,
        failover_after: Duration::from_secs(get("failover-after-s")?.parse()?),
        failover_cmd: get("failover-cmd")?,
        database_url: get("database-url")?,
        rpc_url: get("rpc-url")?,
        token: Address::from_str(&get("token")?)?,
        payer: Address::from_str(&get("payer")?)?,
        pay_to: Address::from_str(&get("pay-to")?)?,
        price: U256::from_str(&get("price")?)?,
        out: get("out")?,
    })
}

/// One logical call (one Idempotency-Key) and how it ended.
#[derive(Clone, Debug)]
struct Call {
    key: String,
    paid: bool,
    attempts: u32,
    status: Option<u16>,
    receipt_id: Option<String>,
    payment_status: Option<String>,
    nonce: Option<String>,
    /// When the call was first sent, since the load started.
    sent_ms: u128,
    answered_at: Option<Instant>,
    router: usize,
}

/// A final answer: anything but a transport error, 503, 504 or 409 (in flight).
fn is_final(status: u16) -> bool {
    !matches!(status, 503 | 504 | 409)
}

async fn send(http: &reqwest::Client, router: &str, agent: &str, key: &str, body: &Value) -> Option<(u16, Value)> {
    let resp = http
        .post(format!("{router}/route"))
        .bearer_auth(agent)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    Some((status, body))
}

/// Sends `call` until it has a final answer (or `give_up` passes), alternating routers.
async fn drive(http: &reqwest::Client, args: &Args, call: &mut Call, give_up: Instant) {
    let body =
        if call.paid { json!({"url": args.paid_url, "max_amount": "50000"}) } else { json!({"url": args.free_url}) };
    // A short pause between retries of one key (the load itself never waits).
    let limit = give_up.saturating_duration_since(Instant::now());
    let mut retries = Deadline::after(limit, &call.key).every(Duration::from_millis(100));
    while Instant::now() < give_up {
        call.attempts += 1;
        let router = (call.router + call.attempts as usize - 1) % args.routers.len();
        if let Some((status, env)) = send(http, &args.routers[router], &args.agent_key, &call.key, &body).await
            && is_final(status)
        {
            call.status = Some(status);
            call.receipt_id = env["receipt_id"].as_str().map(str::to_owned);
            call.payment_status = env["payment"]["status"].as_str().map(str::to_owned);
            call.nonce = env["payment"]["nonce"].as_str().map(str::to_owned);
            call.answered_at = Some(Instant::now());
            call.router = router;
            return;
        }
        if retries.next_poll().await.is_err() {
            return;
        }
    }
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::Text)]
    a: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    b: String,
}

async fn rows(conn: &mut diesel_async::AsyncPgConnection, sql: &str) -> anyhow::Result<Vec<(String, String)>> {
    let r: Vec<Row> = diesel::sql_query(sql).load(conn).await?;
    Ok(r.into_iter().map(|r| (r.a, r.b)).collect())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(parse_args()?);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build()?;
    let started = Instant::now();
    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let failover: Arc<Mutex<Option<(Instant, Instant)>>> = Arc::default();

    // The failover, mid-load.
    let trigger = {
        let (args, failover) = (Arc::clone(&args), Arc::clone(&failover));
        tokio::spawn(async move {
            // lets time pass: the load runs `--failover-after` before the failover is triggered.
            let_time_pass(args.failover_after).await;
            let begin = Instant::now();
            let status = tokio::process::Command::new("bash").arg("-c").arg(&args.failover_cmd).status().await;
            let end = Instant::now();
            *failover.lock().await = Some((begin, end));
            status.map(|s| s.success()).unwrap_or(false)
        })
    };

    let mut workers = Vec::new();
    for w in 0..args.concurrency {
        let (args, http, calls) = (Arc::clone(&args), http.clone(), Arc::clone(&calls));
        workers.push(tokio::spawn(async move {
            let mut n = 0usize;
            while started.elapsed() < args.duration {
                let mut call = Call {
                    key: format!("failover-{w}-{n}-{}", uuid::Uuid::new_v4().simple()),
                    paid: n.is_multiple_of(2),
                    attempts: 0,
                    status: None,
                    receipt_id: None,
                    payment_status: None,
                    nonce: None,
                    sent_ms: started.elapsed().as_millis(),
                    answered_at: None,
                    router: (w + n) % args.routers.len(),
                };
                // Every key gets a final answer, however long the failover takes (bounded).
                drive(&http, &args, &mut call, Instant::now() + Duration::from_secs(120)).await;
                calls.lock().await.push(call);
                n += 1;
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let failover_ok = trigger.await?;
    let calls = calls.lock().await.clone();
    let (fo_begin, fo_end) = failover.lock().await.context("the failover command never ran")?;

    // Serving again: the first call first sent after the failover began that got a final
    // 200 on its first attempt, per router (a new request, not a retry).
    let mut serving_again: BTreeMap<usize, f64> = BTreeMap::new();
    for c in &calls {
        let sent = started + Duration::from_millis(u64::try_from(c.sent_ms).unwrap_or(u64::MAX));
        if sent >= fo_begin && c.status == Some(200) && c.attempts == 1 {
            let at = c.answered_at.map_or(f64::MAX, |a| a.duration_since(fo_end).as_secs_f64());
            let e = serving_again.entry(c.router).or_insert(f64::MAX);
            *e = e.min(at);
        }
    }
    // Outage as agents saw it: from the failover's start to the last call that needed a retry.
    let retried = calls.iter().filter(|c| c.attempts > 1).count();

    // Replays: every answered key comes back as it was, through either router.
    let mut replay_mismatch = 0usize;
    for (i, c) in calls.iter().enumerate().filter(|(_, c)| c.status.is_some()) {
        let router = &args.routers[(c.router + 1 + i) % args.routers.len()];
        let body =
            if c.paid { json!({"url": args.paid_url, "max_amount": "50000"}) } else { json!({"url": args.free_url}) };
        let same = match send(&http, router, &args.agent_key, &c.key, &body).await {
            Some((status, env)) => {
                Some(status) == c.status && env["receipt_id"].as_str().map(str::to_owned) == c.receipt_id
            }
            None => false,
        };
        if !same {
            replay_mismatch += 1;
        }
    }

    // The chain's books.
    let provider: RootProvider = RootProvider::new_http(args.rpc_url.parse()?);
    let used = provider
        .get_logs(
            &Filter::new()
                .address(args.token)
                .event_signature(AuthorizationUsed::SIGNATURE_HASH)
                .topic1(args.payer.into_word())
                .from_block(0),
        )
        .await?;
    let transfers = provider
        .get_logs(
            &Filter::new()
                .address(args.token)
                .event_signature(Transfer::SIGNATURE_HASH)
                .topic1(args.payer.into_word())
                .topic2(args.pay_to.into_word())
                .from_block(0),
        )
        .await?;
    let onchain_nonces: Vec<B256> = used.iter().filter_map(|l| l.topics().get(2).copied()).collect();
    let moved: U256 =
        transfers.iter().map(|l| U256::from_be_slice(&l.data().data[..32.min(l.data().data.len())])).sum();

    // The ledger's books (on whichever server is the primary now).
    let connector = x402_router::db::Connector::from_url(&args.database_url).map_err(anyhow::Error::msg)?;
    let mut conn = connector.connect().await?;
    let ledger: Vec<(String, String)> =
        rows(&mut conn, "SELECT lower(nonce) AS a, idempotency_key || ' ' || status AS b FROM payments").await?;
    let by_nonce: HashMap<String, String> = ledger.iter().cloned().collect();
    let receipts: BTreeSet<String> =
        rows(&mut conn, "SELECT id::text AS a, '' AS b FROM receipts").await?.into_iter().map(|(a, _)| a).collect();

    // An on-chain use without a ledger row is a lost record of a signed payment.
    let lost_ledger_rows =
        onchain_nonces.iter().filter(|n| !by_nonce.contains_key(&n.to_string().to_lowercase())).count();
    // Two uses for one key would be a double payment (the token refuses a nonce twice; the
    // ledger maps each nonce to its key).
    let mut uses_per_key: HashMap<&str, usize> = HashMap::new();
    for n in &onchain_nonces {
        if let Some(k) = by_nonce.get(&n.to_string().to_lowercase()) {
            *uses_per_key.entry(k.split(' ').next().unwrap_or("")).or_default() += 1;
        }
    }
    let double_payments: usize = uses_per_key.values().map(|n| n.saturating_sub(1)).sum();
    let lost_receipts = calls.iter().filter(|c| c.receipt_id.as_ref().is_some_and(|r| !receipts.contains(r))).count();
    let answered_paid: Vec<&Call> = calls.iter().filter(|c| c.paid && c.status == Some(200)).collect();
    let settled_answers = answered_paid.iter().filter(|c| c.payment_status.as_deref() == Some("settled")).count();
    // Every answered paid call's nonce was used on-chain exactly once.
    let onchain_set: BTreeSet<String> = onchain_nonces.iter().map(|n| n.to_string().to_lowercase()).collect();
    let answered_not_onchain = answered_paid
        .iter()
        .filter(|c| c.payment_status.as_deref() == Some("settled"))
        .filter(|c| c.nonce.as_ref().is_none_or(|n| !onchain_set.contains(&n.to_lowercase())))
        .count();

    let count = |paid: bool| calls.iter().filter(|c| c.paid == paid).count();
    let ok = |paid: bool| calls.iter().filter(|c| c.paid == paid && c.status == Some(200)).count();
    let unanswered = calls.iter().filter(|c| c.status.is_none()).count();
    let report = json!({
        "duration_s": started.elapsed().as_secs_f64(),
        "routers": args.routers.len(),
        "concurrency": args.concurrency,
        "failover": {
            "command_ok": failover_ok,
            "started_at_s": fo_begin.duration_since(started).as_secs_f64(),
            "took_s": fo_end.duration_since(fo_begin).as_secs_f64(),
            "serving_again_s_after_promotion": serving_again.values().copied().collect::<Vec<_>>(),
            "serving_again_s_after_crash": serving_again.values()
                .map(|s| s + fo_end.duration_since(fo_begin).as_secs_f64()).collect::<Vec<_>>(),
        },
        "requests": { "total": calls.len(), "paid": count(true), "free": count(false),
                      "retried": retried, "unanswered": unanswered },
        "answered_200": { "paid": ok(true), "free": ok(false), "paid_settled": settled_answers },
        "chain": { "authorizations_used": onchain_nonces.len(), "transfers": transfers.len(),
                   "moved": moved.to_string(),
                   "moved_equals_price_times_uses": moved == args.price * U256::from(onchain_nonces.len()) },
        "ledger": { "payments_rows": ledger.len(), "receipts_rows": receipts.len() },
        "double_payments": double_payments,
        "lost_ledger_rows": lost_ledger_rows,
        "lost_receipts": lost_receipts,
        "settled_answers_not_on_chain": answered_not_onchain,
        "replay_mismatches": replay_mismatch,
    });
    let text = serde_json::to_string_pretty(&report)?;
    std::fs::write(&args.out, &text)?;
    println!("{text}");
    let clean = double_payments == 0
        && lost_ledger_rows == 0
        && lost_receipts == 0
        && replay_mismatch == 0
        && unanswered == 0
        && answered_not_onchain == 0
        && failover_ok
        && serving_again.len() == args.routers.len();
    anyhow::ensure!(clean, "the failover run found a problem (see the report)");
    Ok(())
}
