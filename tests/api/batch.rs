//! The router paying with x402 `batch-settlement` (issue 40, items 2 and 3): the official
//! server (interop/server.mjs GET /v2/batch) and facilitator on the tests' chain, where the
//! project's channel contract sits at the canonical address. One deposit, then vouchers; the
//! server claims and settles; counted on-chain. Takeovers re-send the recorded voucher; a
//! hostile server is not believed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy::primitives::{Address, U256, address};
use serde_json::{Value, json};
use x402_router::faults::Point;
use x402_router::startup::Hooks;
use x402_router_testkit::wait::let_time_pass;

use crate::helpers::*;

/// interop/server.mjs: /v2/batch's payee (anvil #5) and price.
const BATCH_PAY_TO: Address = address!("0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc");
const BATCH_PRICE: u64 = 1000;
const SETTLEMENT: Address = address!("0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003");

fn enabled(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v = vec![("x402-schemes".to_owned(), "batch-settlement".to_owned())];
    v.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    v
}

pub(crate) async fn app_on(chain: &Devnet, extra: &[(&str, &str)]) -> TestApp {
    paid_app_with(chain, &enabled(extra).iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>()).await
}

fn call(official: &Official) -> Value {
    json!({"url": official.url("/v2/batch"), "max_amount": BATCH_PRICE.to_string()})
}

async fn route(app: &TestApp, key: &str, body: &Value) -> (u16, Value) {
    let resp = app.route(key, body).await;
    (resp.status().as_u16(), resp.json().await.unwrap())
}

pub(crate) async fn lanes(app: &TestApp) -> Vec<Value> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Jsonb)]
        lane: Value,
    }
    use diesel_async::RunQueryDsl;
    let mut conn = app.db.conn().await;
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT jsonb_build_object('channel_id', channel_id, 'signed', signed_ceiling::text, 'charged', charged::text, \
                'deposited', deposited::text, 'in_flight', in_flight, 'stopped', stopped) AS lane \
           FROM batch_lanes ORDER BY created_at",
    )
    .load(&mut conn)
    .await
    .unwrap();
    rows.into_iter().map(|r| r.lane).collect()
}

/// What the official server says it charged on each channel.
async fn server_charged(official: &Official) -> u64 {
    let channels = official.channels().await;
    let list = channels.as_array().cloned().unwrap_or_default();
    list.iter().map(|c| c["chargedCumulativeAmount"].as_str().unwrap_or("0").parse::<u64>().unwrap()).sum()
}

async fn until_final(app: &TestApp, agent: &Agent, key: &str, body: &Value) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let resp = route_at(&app.client, &app.address, agent, key, body).await;
        let status = resp.status().as_u16();
        let env: Value = resp.json().await.unwrap_or(Value::Null);
        let retry = status == 503 || (status == 409 && env["code"] == "idempotency_key_in_flight");
        if !retry {
            return (status, env);
        }
        assert!(Instant::now() < deadline, "no final answer: {status} {env}");
        // lets time pass: a retry interval (the router asked to retry shortly).
        let_time_pass(Duration::from_millis(200)).await;
    }
}

#[actix_web::test]
async fn the_router_pays_the_official_batch_server_one_deposit_then_vouchers_counted_on_chain() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let app = app_on(&chain, &[]).await;
    let (router0, payee0, escrow0) =
        (chain.balance(ROUTER_ADDRESS).await, chain.balance(BATCH_PAY_TO).await, chain.balance(SETTLEMENT).await);
    let body = call(&official);
    let n = 4u64;
    let mut first = None;
    for i in 0..n {
        let key = new_key();
        let (status, env) = route(&app, &key, &body).await;
        assert_eq!(status, 200, "call {i}: {env}");
        assert_eq!(env["payment"]["scheme"], "batch-settlement", "{env}");
        assert_eq!(env["payment"]["status"], "settled", "{env}");
        assert_eq!(env["payment"]["amount"], BATCH_PRICE.to_string(), "{env}");
        if i == 0 {
            first = Some((key, env));
        }
    }
    // One channel, one deposit (ten times the price), the ceiling the sum charged.
    let l = lanes(&app).await;
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["deposited"], (10 * BATCH_PRICE).to_string(), "{l:?}");
    assert_eq!(l[0]["signed"], (n * BATCH_PRICE).to_string(), "{l:?}");
    assert_eq!(l[0]["charged"], (n * BATCH_PRICE).to_string(), "{l:?}");
    assert!(l[0]["in_flight"].is_null(), "{l:?}");
    assert_eq!(server_charged(&official).await, n * BATCH_PRICE);
    // The deposit left the wallet for the channel; nothing reached the payee yet.
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(10 * BATCH_PRICE));
    assert_eq!(chain.balance(SETTLEMENT).await, escrow0 + U256::from(10 * BATCH_PRICE));

    // A replay of a key signs nothing and charges nothing.
    let (key, env) = first.unwrap();
    let (status, again) = route(&app, &key, &body).await;
    assert_eq!((status, &again), (200, &env));
    assert_eq!(lanes(&app).await[0]["signed"], (n * BATCH_PRICE).to_string());
    assert_eq!(server_charged(&official).await, n * BATCH_PRICE);

    // The server claims and settles: the payee receives exactly the sum charged.
    official.claim_and_settle().await;
    assert_eq!(chain.balance(BATCH_PAY_TO).await, payee0 + U256::from(n * BATCH_PRICE));
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(10 * BATCH_PRICE));
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, n as i64);
}

/// A deposit is the wallet's money locked: it counts against the wallet-wide cap until
/// refunded, and the vouchers drawing on it take nothing more from the wallet. Without that,
/// a cap of fifteen prices let the router lock a second deposit of ten.
#[actix_web::test]
async fn a_deposit_counts_against_the_wallet_wide_cap_and_vouchers_draw_on_it() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let app = app_on(&chain, &[]).await;
    exec(&app.db, &format!("UPDATE router_settings SET wallet_daily_cap = {}", 15 * BATCH_PRICE)).await;
    let router0 = chain.balance(ROUTER_ADDRESS).await;
    let body = call(&official);
    let (status, env) = route(&app, &new_key(), &body).await;
    assert_eq!(status, 200, "{env}");
    let (_, admin) = create_operator(&app.db, "ada", x402_router::operators::Role::Admin).await;
    let settings = || async {
        let resp = app.client.get(format!("{}/admin/settings", app.address)).bearer_auth(&admin).send().await;
        resp.unwrap().json::<Value>().await.unwrap()
    };
    // One price spent, nine more locked in the channel.
    let s = settings().await;
    assert_eq!(s["wallet_used_24h"], BATCH_PRICE.to_string(), "{s}");
    assert_eq!(s["wallet_locked_in_channels"], (9 * BATCH_PRICE).to_string(), "{s}");
    // Vouchers draw on the deposit: nine more calls fit although five prices of room are left.
    for i in 1..10 {
        let (status, env) = route(&app, &new_key(), &body).await;
        assert_eq!(status, 200, "call {i}: {env}");
    }
    let s = settings().await;
    assert_eq!((s["wallet_used_24h"].as_str(), s["wallet_locked_in_channels"].as_str()), (Some("10000"), Some("0")));
    // The eleventh needs another deposit of at least ten prices: the cap has five. Nothing signed.
    let (status, env) = route(&app, &new_key(), &body).await;
    assert_eq!(env["code"], "payment_over_budget", "{status} {env}");
    assert!(env["error"].as_str().unwrap().contains("wallet-wide"), "{env}");
    let l = lanes(&app).await;
    assert_eq!((l.len(), l[0]["deposited"].as_str()), (1, Some("10000")), "{l:?}");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(10 * BATCH_PRICE));
    official.claim_and_settle().await;
    assert_eq!(server_charged(&official).await, 10 * BATCH_PRICE);
}

/// With room under the cap for the policy's deposit, what is locked and not yet charged is
/// shown and counted: a payment of another scheme that fits only if it were ignored is refused.
#[actix_web::test]
async fn money_locked_in_a_channel_leaves_no_room_under_the_cap_for_other_payments() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let app = app_on(&chain, &[]).await;
    exec(&app.db, &format!("UPDATE router_settings SET wallet_daily_cap = {}", 11 * BATCH_PRICE)).await;
    let (status, env) = route(&app, &new_key(), &call(&official)).await;
    assert_eq!(status, 200, "{env}");
    assert_eq!(lanes(&app).await[0]["deposited"], (10 * BATCH_PRICE).to_string());
    // Spent one price; nine more locked in the channel: one price of room is left, less than
    // the exact route asks (ten batch prices).
    let exact = json!({"url": chain.url("/v2/weather"), "max_amount": PRICE.to_string()});
    let before = chain.balance(ROUTER_ADDRESS).await;
    let (status, env) = route(&app, &new_key(), &exact).await;
    assert_eq!((status, env["code"].as_str()), (402, Some("payment_over_budget")), "{env}");
    assert!(env["error"].as_str().unwrap().contains("locked in payment channels"), "{env}");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, before);
}

#[actix_web::test]
async fn batch_settlement_is_off_until_the_operator_enables_it() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let app = paid_app_with(&chain, &[]).await;
    let (status, env) = route(&app, &new_key(), &call(&official)).await;
    assert_eq!(status, 402, "{env}");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0);
    assert_eq!(server_charged(&official).await, 0);
}

#[actix_web::test]
async fn parallel_calls_use_separate_lanes_or_wait_and_are_each_charged_once() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let app = app_on(&chain, &[("x402-batch-lanes", "2")]).await;
    let body = call(&official);
    let k = 6u64;
    let mut served = 0u64;
    // The official facilitator may refuse one of two deposits it is asked to settle at once (its
    // one sender): such a call ends refused, its deposit is seen unused on-chain, and the lane
    // deposits again with the next call. Calls go on until k were served.
    for _round in 0..4 {
        let calls: Vec<_> =
            (0..k - served).map(|_| spawn_route(&app.client, &app.address, &app.agent, &new_key(), &body)).collect();
        for c in calls {
            let resp = c.await.unwrap().unwrap();
            let status = resp.status().as_u16();
            let env: Value = resp.json().await.unwrap();
            if status == 200 {
                served += 1;
            } else {
                assert_eq!((status, env["code"].as_str()), (502, Some("payment_rejected")), "{env}");
            }
        }
        if served == k {
            break;
        }
    }
    assert_eq!(served, k);
    let l = lanes(&app).await;
    assert!(!l.is_empty() && l.len() <= 2, "{l:?}");
    assert!(l.iter().all(|x| x["in_flight"].is_null()), "{l:?}");
    let charged: u64 = l.iter().map(|x| x["charged"].as_str().unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(charged, k * BATCH_PRICE, "{l:?}");
    assert_eq!(server_charged(&official).await, k * BATCH_PRICE, "{l:?}");
    let payee0 = chain.balance(BATCH_PAY_TO).await;
    official.claim_and_settle().await;
    assert_eq!(chain.balance(BATCH_PAY_TO).await, payee0 + U256::from(k * BATCH_PRICE));
}

/// An owner frozen at `point` with its voucher recorded; another router takes the call over and
/// re-sends the recorded voucher (never a new one): charged once, counted on-chain.
async fn take_over(point: Point, expect_status: u16) {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let db = Arc::new(TestDb::new().await);
    let options = |hooks| AppOptions {
        abandon_ms: 1000,
        heartbeat_ms: 200,
        extra: {
            let mut e = chain.router_extra();
            e.extend(enabled(&[]));
            e
        },
        hooks,
        ..Default::default()
    };
    let (hook, freezer) = freeze_at(point);
    let owner = spawn_app_on(Arc::clone(&db), options(Hooks { at: Some(hook), ..Default::default() })).await;
    let retrier = spawn_app_on(Arc::clone(&db), options(Hooks::default())).await;
    let body = call(&official);
    // A first call opens the channel (deposit), on the retrier.
    let (status, env) = until_final(&retrier, &owner.agent, &new_key(), &body).await;
    assert_eq!(status, 200, "{env}");
    let key = new_key();
    let first = spawn_route(&owner.client, &owner.address, &owner.agent, &key, &body);
    tokio::time::timeout(Duration::from_secs(30), freezer.reached.notified()).await.expect("the owner froze");
    let (status, env) = until_final(&retrier, &owner.agent, &key, &body).await;
    assert_eq!(status, expect_status, "{env}");
    let l = lanes(&retrier).await;
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["signed"], (2 * BATCH_PRICE).to_string(), "one voucher per call, none signed again: {l:?}");
    assert_eq!(server_charged(&official).await, 2 * BATCH_PRICE);
    freezer.thaw.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(60), first).await.expect("the thawed owner answers");
    assert_eq!(server_charged(&official).await, 2 * BATCH_PRICE, "the thawed owner charged nothing more");
    let payee0 = chain.balance(BATCH_PAY_TO).await;
    official.claim_and_settle().await;
    assert_eq!(chain.balance(BATCH_PAY_TO).await, payee0 + U256::from(2 * BATCH_PRICE));
}

#[actix_web::test]
async fn a_takeover_before_the_voucher_left_resends_it_and_it_is_charged_once() {
    take_over(Point::PaymentLeaving, 200).await;
}

#[actix_web::test]
async fn a_takeover_after_the_server_charged_the_voucher_is_told_so_and_charges_nothing_more() {
    take_over(Point::PaidAnswered, 502).await;
}

// ---- a hostile batch-settlement server (in-process): its 402s are crafted by the test.

pub(crate) mod hostile {
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
    use base64::Engine;
    use serde_json::{Value, json};

    /// What the server answers to a paid request, given the payment it got.
    pub type Answer = Arc<dyn Fn(&Value) -> (u16, Value) + Send + Sync>;

    pub struct Hostile {
        pub port: u16,
        pub paid: Arc<Mutex<Vec<Value>>>,
        handle: actix_web::dev::ServerHandle,
    }

    impl Drop for Hostile {
        fn drop(&mut self) {
            let h = self.handle.clone();
            drop(tokio::spawn(async move { h.stop(false).await }));
        }
    }

    pub fn required(token: &str, withdraw_delay: u64, extra: Value) -> Value {
        let mut e = json!({
            "name": "USDC", "version": "2", "receiverAuthorizer": "0x90F79bf6EB2c4f870365E785982E1f101E93b906",
            "withdrawDelay": withdraw_delay, "minDeposit": "10000",
        });
        if let (Some(m), Some(x)) = (e.as_object_mut(), extra.as_object()) {
            m.extend(x.clone());
        }
        json!({
            "x402Version": 2, "error": "Payment required", "resource": {"url": "http://hostile.test/batch"},
            "accepts": [{"scheme": "batch-settlement", "network": "eip155:84532", "amount": "1000",
                "asset": token, "payTo": "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc", "maxTimeoutSeconds": 300,
                "extra": e}]
        })
    }

    pub fn header_402(body: &Value) -> HttpResponse {
        let b64 = base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(body).unwrap());
        HttpResponse::PaymentRequired().insert_header(("PAYMENT-REQUIRED", b64)).json(json!({}))
    }

    pub async fn start(unpaid: Value, answer: Answer) -> Hostile {
        let paid = Arc::new(Mutex::new(Vec::new()));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (p, u, a) = (Arc::clone(&paid), unpaid, answer);
        let server = HttpServer::new(move || {
            let (p, u, a) = (Arc::clone(&p), u.clone(), Arc::clone(&a));
            App::new().default_service(web::to(move |req: HttpRequest| {
                let (p, u, a) = (Arc::clone(&p), u.clone(), Arc::clone(&a));
                async move {
                    let Some(sig) = req.headers().get("PAYMENT-SIGNATURE") else {
                        return header_402(&u);
                    };
                    let bytes = base64::engine::general_purpose::STANDARD.decode(sig.as_bytes()).unwrap();
                    let payment: Value = serde_json::from_slice(&bytes).unwrap();
                    p.lock().unwrap().push(payment.clone());
                    let (status, body) = a(&payment);
                    if status == 402 { header_402(&body) } else { HttpResponse::Ok().json(body) }
                }
            }))
        })
        .workers(1)
        .shutdown_timeout(0)
        .listen(listener)
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Hostile { port, paid, handle }
    }
}

#[actix_web::test]
async fn a_withdraw_delay_over_the_operators_cap_is_refused_and_nothing_is_signed() {
    let chain = Devnet::start().await;
    let token = chain.token.to_string();
    let server =
        hostile::start(hostile::required(&token, 2 * 86_400, json!({})), Arc::new(|_| (200, json!({"served": true}))))
            .await;
    let app = app_on(&chain, &[]).await;
    let body = json!({"url": format!("http://127.0.0.1:{}/batch", server.port), "max_amount": "1000"});
    let (status, env) = route(&app, &new_key(), &body).await;
    assert_eq!(status, 402, "{env}");
    assert!(env.to_string().contains("withdrawDelay"), "{env}");
    assert!(server.paid.lock().unwrap().is_empty(), "nothing was sent");
    assert!(lanes(&app).await.is_empty());
}

#[actix_web::test]
async fn a_server_whose_voucher_state_contradicts_ours_stops_the_channel() {
    let chain = Devnet::start().await;
    let token = chain.token.to_string();
    let t = token.clone();
    // It refuses the deposit with a "corrective" 402 claiming a voucher far above what was signed,
    // signed by nobody we know.
    let answer: hostile::Answer = Arc::new(move |payment: &Value| {
        let channel = payment["payload"]["voucher"]["channelId"].clone();
        let body = hostile::required(
            &t,
            900,
            json!({
                "channelState": {"channelId": channel, "balance": "10000", "totalClaimed": "0",
                                 "chargedCumulativeAmount": "5000"},
                "voucherState": {"signedMaxClaimable": "9000", "signature": format!("0x{}", "11".repeat(65))},
            }),
        );
        let mut body = body;
        body["error"] = json!("invalid_batch_settlement_evm_cumulative_amount_mismatch");
        (402, body)
    });
    let server = hostile::start(hostile::required(&token, 900, json!({})), answer).await;
    let app = app_on(&chain, &[]).await;
    let body = json!({"url": format!("http://127.0.0.1:{}/batch", server.port), "max_amount": "1000"});
    let (status, env) = route(&app, &new_key(), &body).await;
    assert_eq!(status, 502, "{env}");
    assert_eq!(env["payment"]["status"], "unknown", "stays counted as charged: {env}");
    let l = lanes(&app).await;
    assert_eq!(l.len(), 1, "{l:?}");
    assert!(l[0]["stopped"].is_string(), "signing stopped on the channel: {l:?}");
    assert_eq!(l[0]["signed"], "1000", "{l:?}");
    // The next call never signs on the stopped channel (a new lane, if any).
    let before = server.paid.lock().unwrap().len();
    let _ = route(&app, &new_key(), &body).await;
    let paid = server.paid.lock().unwrap().clone();
    assert_eq!(paid.len(), before + 1);
    assert_ne!(paid[before]["payload"]["voucher"]["channelId"], paid[0]["payload"]["voucher"]["channelId"]);
}
