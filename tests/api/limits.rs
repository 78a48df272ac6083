//! The limits an operator sets (month budget, allowlists, rates, wallet-wide cap, pause),
//! attacked as an agent would: many concurrent calls, several router processes, one ledger;
//! money counted on-chain.

use std::sync::Arc;

use alloy::primitives::U256;
use futures_util::future::join_all;
use serde_json::{Value, json};

use crate::helpers::*;

async fn paid_app(chain: &Devnet) -> TestApp {
    spawn_app_with(AppOptions { acquire_timeout_ms: 10_000, extra: chain.router_extra(), ..Default::default() }).await
}

async fn set(app: &TestApp, assignments: &str) {
    exec(&app.db, &format!("UPDATE agents SET {assignments} WHERE id = '{}'", app.agent.id)).await;
}

fn paid_body(chain: &Devnet) -> Value {
    json!({"url": chain.url("/v2/weather"), "max_amount": "10000"})
}

async fn moved(chain: &Devnet) -> U256 {
    chain.balance(PAY_TO).await
}

/// Fires `n` calls with fresh keys at once; (status, body) of each.
async fn race(app: &Arc<TestApp>, n: usize, body: &Value) -> Vec<(u16, Value, Option<String>)> {
    join_all((0..n).map(|_| {
        let (app, body) = (Arc::clone(app), body.clone());
        async move {
            let resp = app.route(&new_key(), &body).await;
            let status = resp.status().as_u16();
            let retry = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
            (status, resp.json().await.unwrap_or(Value::Null), retry)
        }
    }))
    .await
}

fn with_code<'a>(results: &'a [(u16, Value, Option<String>)], code: &str) -> Vec<&'a (u16, Value, Option<String>)> {
    results.iter().filter(|(_, b, _)| b["code"] == code).collect()
}

fn settled(results: &[(u16, Value, Option<String>)]) -> usize {
    results.iter().filter(|(s, b, _)| *s == 200 && b["payment"]["status"] == "settled").count()
}

/// Milliseconds into the current minute of the wall clock (the routers' Postgres runs here).
fn ms_in_minute() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() % 60_000
}

/// Waits until the clock is between `from_ms` and `to_ms` into a minute.
async fn at_ms_in_minute(from_ms: u128, to_ms: u128) {
    x402_router_testkit::wait::wait_for_every(
        std::time::Duration::from_secs(62),
        std::time::Duration::from_millis(20),
        "a moment of the minute",
        || async { (from_ms..to_ms).contains(&ms_in_minute()).then_some(()) },
    )
    .await
    .unwrap();
}

#[actix_web::test]
async fn thirty_concurrent_paid_calls_never_exceed_a_month_budget_of_two_prices() {
    let chain = Devnet::start().await;
    let app = Arc::new(paid_app(&chain).await);
    set(&app, &format!("month_budget = {}", 2 * PRICE)).await;
    let before = moved(&chain).await;
    let results = race(&app, 30, &paid_body(&chain)).await;
    assert_eq!(settled(&results), 2, "{:?}", results.iter().map(|r| r.0).collect::<Vec<_>>());
    let refused = with_code(&results, "payment_over_budget");
    assert_eq!(refused.len(), 28);
    assert!(refused.iter().all(|(s, b, _)| *s == 402 && b["error"].as_str().unwrap().contains("budget")));
    assert_eq!(moved(&chain).await - before, U256::from(2 * PRICE));
    let spend = x402_router::payments::store::agent_spend(&mut app.db.conn().await, app.agent.id, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((spend.settled_month.as_str(), spend.remaining_month.as_deref()), ("20000", Some("0")));
}

#[actix_web::test]
async fn a_month_budget_counts_payments_signed_this_month_only() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    set(&app, &format!("month_budget = {PRICE}")).await;
    assert_eq!(app.route(&new_key(), &paid_body(&chain)).await.status(), 200);
    let resp = app.route(&new_key(), &paid_body(&chain)).await;
    assert_eq!(resp.status(), 402);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payment_over_budget");
    // The spent payment was signed last month: this month's budget is whole again.
    exec(&app.db, "UPDATE payments SET signed_at = date_trunc('month', now()) - interval '1 hour'").await;
    assert_eq!(app.route(&new_key(), &paid_body(&chain)).await.status(), 200);
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 2);
}

#[actix_web::test]
async fn a_pay_to_off_the_allowlist_is_never_signed() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    set(&app, "allowed_pay_to = ARRAY['0x00000000000000000000000000000000000000aa']").await;
    let before = moved(&chain).await;
    let resp = app.route(&new_key(), &paid_body(&chain)).await;
    assert_eq!(resp.status(), 402);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "payment_not_allowed", "{body}");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0);
    assert_eq!(moved(&chain).await, before);
    // The upstream's payTo, in any letter case, is allowed.
    let allowed = PAY_TO.to_checksum(None).to_ascii_uppercase().replace("0X", "0x");
    set(&app, &format!("allowed_pay_to = ARRAY['{allowed}']")).await;
    assert_eq!(app.route(&new_key(), &paid_body(&chain)).await.status(), 200);
    assert_eq!(moved(&chain).await - before, U256::from(PRICE));
}

#[actix_web::test]
async fn a_host_off_the_allowlist_is_refused_before_anything_is_written() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let url = reqwest::Url::parse(&chain.url("/free")).unwrap();
    let port = url.port().unwrap();
    for refused in ["api.example.com", "*.127.0.0.1", "127.0.0.1:1"] {
        set(&app, &format!("allowed_hosts = ARRAY['{refused}']")).await;
        let resp = app.route(&new_key(), &json!({"url": chain.url("/free")})).await;
        assert_eq!(resp.status(), 403, "{refused}");
        assert_eq!(resp.json::<Value>().await.unwrap()["code"], "upstream_not_allowed");
    }
    assert_eq!(app.idempotency_rows().await, 0);
    assert_eq!(app.receipt_rows().await, 0);
    for allowed in [format!("127.0.0.1:{port}"), "127.0.0.1".to_owned(), "example.com', '127.0.0.1".to_owned()] {
        set(&app, &format!("allowed_hosts = ARRAY['{allowed}']")).await;
        assert_eq!(app.route(&new_key(), &json!({"url": chain.url("/free")})).await.status(), 200, "{allowed}");
    }
}

#[actix_web::test]
async fn the_call_gate_stops_calls_that_would_start_and_not_answers_already_recorded() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let (done, abandoned) = (new_key(), new_key());
    let done_body = json!({"url": up.url("/ok/gate-done")});
    let abandoned_body = json!({"url": up.url("/ok/gate-abandoned")});
    assert_eq!(app.route(&done, &done_body).await.status(), 200);
    insert_in_flight(&app.db, app.agent.id, &abandoned, &abandoned_body, 90).await;
    // Now the operator allows another host only, and one call a minute.
    set(&app, "allowed_hosts = ARRAY['api.example.com'], calls_per_minute = 1").await;
    app.forget_cached(&done).await;
    // The recorded answer is replayed from Postgres (as it would be from Redis): not refused,
    // not counted against the minute.
    for _ in 0..3 {
        let resp = app.route(&done, &done_body).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers().get("x-idempotent-replay").unwrap(), "true");
    }
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM agent_rate_events").await, 0);
    // A takeover would call the upstream again: refused, the abandoned row left as it was.
    let lease = "SELECT count(*) AS n FROM idempotency_keys WHERE status = 'in_flight' AND takeovers = 0";
    let resp = app.route(&abandoned, &abandoned_body).await;
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "upstream_not_allowed");
    assert_eq!(count(&app.db, lease).await, 1, "the abandoned row was not taken over");
    // A new key: refused before anything is written.
    let rows = app.idempotency_rows().await;
    assert_eq!(app.route(&new_key(), &done_body).await.status(), 403);
    assert_eq!(app.idempotency_rows().await, rows);
    assert_eq!((up.hits.get("/ok/gate-done"), up.hits.get("/ok/gate-abandoned")), (1, 0));
    // The operator lifts the allowlist: the takeover proceeds and is counted as the minute's call.
    set(&app, "allowed_hosts = NULL").await;
    assert_eq!(app.route(&abandoned, &abandoned_body).await.status(), 200);
    assert_eq!(up.hits.get("/ok/gate-abandoned"), 1);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM agent_rate_events").await, 1);
}

#[actix_web::test]
async fn calls_per_minute_hold_across_three_router_processes() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "rate").await;
    exec(&db, &format!("UPDATE agents SET calls_per_minute = 7 WHERE id = '{}'", agent.id)).await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions::default();
    let routers = [
        RouterProcess::spawn(&db.url, &opts, &prefix).await,
        RouterProcess::spawn(&db.url, &opts, &prefix).await,
        RouterProcess::spawn(&db.url, &opts, &prefix).await,
    ];
    let up = TestUpstream::start().await;
    let client = reqwest::Client::new();
    let results = join_all((0..30).map(|i| {
        let (client, addr, agent) = (client.clone(), routers[i % 3].address.clone(), agent.clone());
        let body = json!({"url": up.url(&format!("/ok/rate-{i}"))});
        async move {
            let resp = route_at(&client, &addr, &agent, &new_key(), &body).await;
            let retry = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u32>().ok());
            (resp.status().as_u16(), retry, resp.json::<Value>().await.unwrap()["code"].clone())
        }
    }))
    .await;
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let limited: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert_eq!((ok, limited.len()), (7, 23), "{results:?}");
    assert!(limited.iter().all(|r| r.2 == "rate_limited" && r.1.is_some_and(|s| (1..=60).contains(&s))));
    // Nothing of the refused calls was written or sent.
    assert_eq!(count(&db, "SELECT count(*) AS n FROM idempotency_keys").await, 7);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM agent_rate_events").await, 7);
    assert_eq!(up.hits.total(), 7);
}

/// A rate is a sliding window, not a calendar minute (issue 38, item 4): 7 calls at :59.6 and
/// 7 more at :00.1, spread over two router processes, and only 7 run.
#[actix_web::test]
async fn a_burst_straddling_a_minute_boundary_gets_the_limit_once() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "straddle").await;
    exec(&db, &format!("UPDATE agents SET calls_per_minute = 7 WHERE id = '{}'", agent.id)).await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions::default();
    let routers =
        [RouterProcess::spawn(&db.url, &opts, &prefix).await, RouterProcess::spawn(&db.url, &opts, &prefix).await];
    let up = TestUpstream::start().await;
    let client = reqwest::Client::new();
    let burst = |from: usize| {
        join_all((from..from + 7).map(|i| {
            let (client, addr, agent) = (client.clone(), routers[i % 2].address.clone(), agent.clone());
            let body = json!({"url": up.url(&format!("/ok/straddle-{i}"))});
            async move { route_at(&client, &addr, &agent, &new_key(), &body).await.status().as_u16() }
        }))
    };
    at_ms_in_minute(59_550, 59_700).await;
    let mut statuses = burst(0).await;
    at_ms_in_minute(50, 400).await;
    statuses.extend(burst(7).await);
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((ok, limited), (7, 7), "{statuses:?}");
    assert_eq!(up.hits.total(), 7);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM agent_rate_events").await, 7);
}

#[actix_web::test]
async fn payments_per_minute_refuse_with_429_and_the_same_key_pays_later() {
    let chain = Devnet::start().await;
    let app = Arc::new(paid_app(&chain).await);
    set(&app, "payments_per_minute = 3").await;
    let before = moved(&chain).await;
    let results = race(&app, 20, &paid_body(&chain)).await;
    assert_eq!(settled(&results), 3, "{:?}", results.iter().map(|r| r.0).collect::<Vec<_>>());
    let limited = with_code(&results, "rate_limited");
    assert_eq!(limited.len(), 17);
    assert!(limited.iter().all(|(s, _, retry)| *s == 429 && retry.is_some()));
    assert_eq!(moved(&chain).await - before, U256::from(3 * PRICE));
    // A refused call left no key behind: only the three paid ones are recorded.
    assert_eq!(app.idempotency_rows().await, 3);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 3);
    // A minute later (simulated by ageing what was counted), the same key of a refused call pays once.
    let key = new_key();
    let resp = app.route(&key, &paid_body(&chain)).await;
    assert_eq!(resp.status(), 429);
    exec(&app.db, "UPDATE agent_rate_events SET at = at - interval '1 minute'").await;
    let resp = app.route(&key, &paid_body(&chain)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.route(&key, &paid_body(&chain)).await.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(moved(&chain).await - before, U256::from(4 * PRICE));
}

#[actix_web::test]
async fn a_wallet_cap_holds_across_agents_and_two_router_processes() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agents = [create_agent(&db, "a").await, create_agent(&db, "b").await, create_agent(&db, "c").await];
    exec(&db, &format!("UPDATE router_settings SET wallet_daily_cap = {}", 3 * PRICE)).await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions { acquire_timeout_ms: 10_000, extra: chain.router_extra(), ..Default::default() };
    let routers =
        [RouterProcess::spawn(&db.url, &opts, &prefix).await, RouterProcess::spawn(&db.url, &opts, &prefix).await];
    let client = reqwest::Client::new();
    let before = moved(&chain).await;
    let body = paid_body(&chain);
    let results = join_all((0..24).map(|i| {
        let (client, addr, agent, body) =
            (client.clone(), routers[i % 2].address.clone(), agents[i % 3].clone(), body.clone());
        async move {
            let resp = route_at(&client, &addr, &agent, &new_key(), &body).await;
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap(), None)
        }
    }))
    .await;
    assert_eq!(settled(&results), 3, "{:?}", results.iter().map(|r| r.0).collect::<Vec<_>>());
    let refused = with_code(&results, "payment_over_budget");
    assert_eq!(refused.len(), 21);
    assert!(refused.iter().all(|(_, b, _)| b["error"].as_str().unwrap().contains("wallet")));
    assert_eq!(moved(&chain).await - before, U256::from(3 * PRICE));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 3);
}

#[actix_web::test]
async fn a_pause_refuses_every_new_payment_records_nothing_and_resuming_pays_once() {
    let chain = Devnet::start().await;
    let app = Arc::new(paid_app(&chain).await);
    let before = moved(&chain).await;
    exec(&app.db, "UPDATE router_settings SET paused = true").await;
    let results = race(&app, 10, &paid_body(&chain)).await;
    assert!(
        results.iter().all(|(s, b, retry)| *s == 503 && b["code"] == "payments_paused" && retry.is_some()),
        "{results:?}"
    );
    assert_eq!(app.idempotency_rows().await, 0);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0);
    // Unpaid calls go on unless the pause includes them.
    assert_eq!(app.route(&new_key(), &json!({"url": chain.url("/free")})).await.status(), 200);
    exec(&app.db, "UPDATE router_settings SET pause_unpaid = true").await;
    let resp = app.route(&new_key(), &json!({"url": chain.url("/free")})).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payments_paused");
    // Resumed: the same key that was refused pays, once.
    let key = new_key();
    exec(&app.db, "UPDATE router_settings SET pause_unpaid = false").await;
    assert_eq!(app.route(&key, &paid_body(&chain)).await.status(), 503);
    exec(&app.db, "UPDATE router_settings SET paused = false").await;
    assert_eq!(app.route(&key, &paid_body(&chain)).await.status(), 200);
    assert_eq!(app.route(&key, &paid_body(&chain)).await.status(), 200);
    assert_eq!(moved(&chain).await - before, U256::from(PRICE));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 1);
}

#[actix_web::test]
async fn a_month_budget_and_payments_per_minute_hold_across_two_router_processes() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let monthly = create_agent(&db, "monthly").await;
    let paced = create_agent(&db, "paced").await;
    exec(&db, &format!("UPDATE agents SET month_budget = {} WHERE id = '{}'", 2 * PRICE, monthly.id)).await;
    exec(&db, &format!("UPDATE agents SET payments_per_minute = 3 WHERE id = '{}'", paced.id)).await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions { acquire_timeout_ms: 10_000, extra: chain.router_extra(), ..Default::default() };
    let routers =
        [RouterProcess::spawn(&db.url, &opts, &prefix).await, RouterProcess::spawn(&db.url, &opts, &prefix).await];
    let client = reqwest::Client::new();
    let before = moved(&chain).await;
    let body = paid_body(&chain);
    let results = join_all((0..32).map(|i| {
        let agent = if i % 2 == 0 { monthly.clone() } else { paced.clone() };
        let (client, addr, body) = (client.clone(), routers[(i / 2) % 2].address.clone(), body.clone());
        async move {
            let resp = route_at(&client, &addr, &agent, &new_key(), &body).await;
            let status = resp.status().as_u16();
            (agent.id, status, resp.json::<Value>().await.unwrap())
        }
    }))
    .await;
    let paid =
        |id| results.iter().filter(|(a, s, b)| *a == id && *s == 200 && b["payment"]["status"] == "settled").count();
    assert_eq!((paid(monthly.id), paid(paced.id)), (2, 3), "{results:?}");
    let refused = |id, code: &str| results.iter().filter(|(a, _, b)| *a == id && b["code"] == code).count();
    assert_eq!((refused(monthly.id, "payment_over_budget"), refused(paced.id, "rate_limited")), (14, 13));
    assert_eq!(moved(&chain).await - before, U256::from(5 * PRICE));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 5);
}
