//! Issue 40's "done when": the router pays the official batch-settlement server (interop/server.mjs
//! GET /v2/batch) many calls on ONE channel (`X402_BATCH_LANES=1`), with owners crashed
//! mid-voucher now and then (frozen for ever at a fault point, their heartbeats too, as a
//! kill -9 leaves them; another router takes the call over); then the server claims and
//! settles, and it is counted on-chain: the payee received exactly what the calls were charged,
//! each (agent, key) charged once, one voucher per call, nothing above the agent's budget.
//!
//! `BATCH_CALLS` sets the number of calls (default 100, about 30 s in a debug build);
//! `scripts/batch-channel` runs it with 1000 and prints the figures.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy::primitives::{Address, U256, address};
use serde_json::{Value, json};
use x402_router::faults::Point;
use x402_router::startup::Hooks;
use x402_router_testkit::wait::let_time_pass;

use crate::helpers::*;

/// interop/server.mjs: /v2/batch's payee (anvil #5) and price.
const PAY_TO: Address = address!("0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc");
const PRICE: u64 = 1000;

/// Where owners crash, in turn: before and as the voucher leaves, once the server charged it,
/// before and inside the recording transaction.
const CRASH_POINTS: [Point; 5] =
    [Point::BeforePaidSend, Point::PaymentLeaving, Point::PaidAnswered, Point::BeforeRecord, Point::BeforeCommit];

fn calls() -> u64 {
    std::env::var("BATCH_CALLS").ok().and_then(|v| v.parse().ok()).filter(|n| *n >= 10).unwrap_or(100)
}

/// POSTs until the answer is final (not "in flight", not 503), honouring `Retry-After` (capped).
async fn until_final(app: &TestApp, agent: &Agent, key: &str, body: &Value) -> (u16, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let resp = route_at(&app.client, &app.address, agent, key, body).await;
        let status = resp.status().as_u16();
        let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let bytes = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
        let code = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| v["code"].as_str().map(str::to_owned));
        if !(status == 503 || (status == 409 && code.as_deref() == Some("idempotency_key_in_flight"))) {
            return (status, bytes);
        }
        assert!(Instant::now() < deadline, "{key}: no final answer: {status} {}", String::from_utf8_lossy(&bytes));
        // lets time pass: the router's Retry-After (at most 250 ms here) before the next attempt.
        let_time_pass(Duration::from_secs(retry_after.unwrap_or(1)).min(Duration::from_millis(250))).await;
    }
}

/// The one lane's signed ceiling, charged total and deposits, and how many lanes there are.
async fn lane(db: &TestDb) -> (i64, u64, u64, u64) {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
        #[diesel(sql_type = diesel::sql_types::Text)]
        signed: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        charged: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        deposited: String,
    }
    use diesel_async::RunQueryDsl;
    let mut conn = db.conn().await;
    let r: Row = diesel::sql_query(
        "SELECT count(*) AS n, COALESCE(max(signed_ceiling), 0)::text AS signed, \
                COALESCE(max(charged), 0)::text AS charged, COALESCE(max(deposited), 0)::text AS deposited \
           FROM batch_lanes",
    )
    .get_result(&mut conn)
    .await
    .unwrap();
    (r.n, r.signed.parse().unwrap(), r.charged.parse().unwrap(), r.deposited.parse().unwrap())
}

async fn server_charged(official: &Official) -> u64 {
    let list = official.channels().await.as_array().cloned().unwrap_or_default();
    list.iter().map(|c| c["chargedCumulativeAmount"].as_str().unwrap_or("0").parse::<u64>().unwrap()).sum()
}

#[actix_web::test]
async fn calls_on_one_channel_with_owners_crashed_mid_voucher_are_each_charged_once_counted_on_chain() {
    let n = calls();
    let started = Instant::now();
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let db = Arc::new(TestDb::new().await);
    let options = |hooks| AppOptions {
        abandon_ms: 1000,
        heartbeat_ms: 200,
        extra: {
            let mut e = chain.router_extra();
            e.push(("x402-schemes".into(), "batch-settlement".into()));
            e.push(("x402-batch-lanes".into(), "1".into()));
            // Room in the one channel for every call's deposit and the one more below.
            e.push(("x402-batch-max-deposit".into(), ((n + 10) * PRICE).to_string()));
            e
        },
        hooks,
        ..Default::default()
    };
    let retrier = spawn_app_on(Arc::clone(&db), options(Hooks::default())).await;
    let agent = retrier.agent.clone();
    // The budget is exactly the calls' price: one more charge (or reservation) is refused.
    exec(&db, &format!("UPDATE agents SET daily_budget = {} WHERE id = '{}'", n * PRICE, agent.id)).await;
    let (router0, payee0) = (chain.balance(ROUTER_ADDRESS).await, chain.balance(PAY_TO).await);
    let body = json!({"url": official.url("/v2/batch"), "max_amount": PRICE.to_string()});
    let every = n / (2 * CRASH_POINTS.len() as u64);
    let (mut crashed, mut keys, mut finals) = (Vec::new(), BTreeSet::new(), Vec::new());
    for i in 0..n {
        let key = new_key();
        keys.insert(key.clone());
        let (status, bytes) = if i > 0 && i % every == 0 {
            // An owner that crashes at this call's fault point; the retrier takes the call over.
            let point = CRASH_POINTS[crashed.len() % CRASH_POINTS.len()];
            let (hook, freezer) = freeze_at(point);
            let owner = spawn_app_on(Arc::clone(&db), options(Hooks { at: Some(hook), ..Default::default() })).await;
            let first = spawn_route(&owner.client, &owner.address, &agent, &key, &body);
            tokio::time::timeout(Duration::from_secs(30), freezer.reached.notified())
                .await
                .unwrap_or_else(|_| panic!("call {i}: the owner never reached {point:?}"));
            if point == Point::BeforeCommit {
                end_crashed_transaction(&db).await;
            }
            let answer = until_final(&retrier, &agent, &key, &body).await;
            crashed.push((point, owner, freezer, first, key.clone(), answer.clone()));
            answer
        } else {
            until_final(&retrier, &agent, &key, &body).await
        };
        let env: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert!(
            status == 200 || (status == 502 && env["payment"]["scheme"] == "batch-settlement"),
            "call {i}: {status} {env}"
        );
        finals.push((status, env["code"].as_str().unwrap_or_default().to_owned()));
    }
    // A crashed call's replay is its final answer, byte for byte.
    for (point, _, _, _, key, answer) in &crashed {
        assert_eq!(&until_final(&retrier, &agent, key, &body).await, answer, "{point:?}: a replay differs");
    }

    // The frozen owners, let go at last (fenced), charge nothing more.
    for c in &mut crashed {
        c.2.thaw.send_replace(true);
        let _ = tokio::time::timeout(Duration::from_secs(60), &mut c.3).await;
    }

    // One channel, one voucher per call (none signed twice), charged once each by the server.
    let (lanes, signed, charged, deposited) = lane(&db).await;
    assert_eq!(lanes, 1);
    assert_eq!(signed, n * PRICE, "one voucher increment per call");
    assert_eq!(server_charged(&official).await, n * PRICE, "the server charged each call once, the thawed none");
    assert_eq!(charged, n * PRICE);
    let rows = count(&db, "SELECT count(*) AS n FROM payments").await;
    let keyed = count(&db, "SELECT count(DISTINCT (agent_id, idempotency_key)) AS n FROM payments").await;
    assert_eq!((rows, keyed), (n as i64, n as i64), "one payment per (agent, key)");
    let paid: BTreeSet<String> = {
        #[derive(diesel::QueryableByName)]
        struct K {
            #[diesel(sql_type = diesel::sql_types::Text)]
            idempotency_key: String,
        }
        use diesel_async::RunQueryDsl;
        let mut conn = db.conn().await;
        let ks: Vec<K> = diesel::sql_query("SELECT idempotency_key FROM payments").load(&mut conn).await.unwrap();
        ks.into_iter().map(|k| k.idempotency_key).collect()
    };
    assert_eq!(paid, keys);

    // The server claims and settles: the payee receives exactly the calls' price, and the wallet
    // lost only its deposits (locked in the channel), within the agent's budget.
    official.claim_and_settle().await;
    let received = chain.balance(PAY_TO).await - payee0;
    assert_eq!(received, U256::from(n * PRICE), "the payee received exactly what was charged");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(deposited));
    assert!(U256::from(deposited) >= received && deposited <= n * PRICE, "deposits {deposited} within the budget");
    // The channel against the ledger and the chain: the server's highest voucher at most the
    // recorded ceiling, charged at most what the ledger reserved (still counted against the
    // agent), the payee paid what was claimed, one counted voucher per key.
    let channels = official.channels().await.as_array().cloned().unwrap_or_default();
    let vouchers: Vec<(String, String)> = channels
        .iter()
        .map(|c| (c["channelId"].as_str().unwrap().to_owned(), c["signedMaxClaimable"].as_str().unwrap().to_owned()))
        .collect();
    let report = invariants::batch::check(&invariants::batch::Target {
        database_url: &db.url,
        rpc_url: &chain.rpc_url,
        token: chain.token,
        payee: PAY_TO,
        channels: &channels,
        vouchers: &vouchers,
    })
    .await
    .unwrap();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.reserved, (n * PRICE).to_string(), "every call's voucher stays counted: {report:?}");

    // One call more, with room for it: the channel takes another deposit (ten prices, the
    // server's minimum) of which the call charges one. The operator closes the channel: the
    // server refunds the unclaimed rest, and the wallet has lost exactly what was charged,
    // counted on-chain.
    exec(&db, &format!("UPDATE agents SET daily_budget = {} WHERE id = '{}'", (n + 10) * PRICE, agent.id)).await;
    let (status, bytes) = until_final(&retrier, &agent, &new_key(), &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let (_, admin) = create_operator(&db, "ada", x402_router::operators::Role::Admin).await;
    let admin_call = async |method: reqwest::Method, path: &str| -> Value {
        let url = format!("{}{path}", retrier.address);
        let resp = retrier.client.request(method, url).bearer_auth(&admin).send().await.unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.json().await.unwrap()
    };
    let listed = admin_call(reqwest::Method::GET, "/admin/channels").await;
    let id = listed["channels"][0]["id"].as_str().unwrap().to_owned();
    official.claim_and_settle().await;
    let closed = admin_call(reqwest::Method::POST, &format!("/admin/channels/{id}/close")).await;
    assert_eq!((closed["step"].as_str(), closed["channel"]["state"].as_str()), (Some("refunded"), Some("closed")));
    let (_, _, _, deposited) = lane(&db).await;
    assert_eq!(closed["channel"]["refunded"], (deposited - (n + 1) * PRICE).to_string(), "{closed}");
    assert_eq!(chain.balance(PAY_TO).await - payee0, U256::from((n + 1) * PRICE));
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from((n + 1) * PRICE), "the rest came back");

    let served = finals.iter().filter(|(s, _)| *s == 200).count();
    let failed: Vec<&str> = finals.iter().filter(|(s, _)| *s != 200).map(|(_, c)| c.as_str()).collect();
    println!(
        "batch channel: {n} calls, {} owners crashed mid-voucher ({:?}), {served} answered 200, {} answered 502 \
         {failed:?}; server charged {}, payee received {received}, deposits {deposited}; {:.1} s",
        crashed.len(),
        crashed.iter().map(|c| c.0).collect::<Vec<_>>(),
        finals.len() - served,
        n * PRICE,
        started.elapsed().as_secs_f64()
    );
}
