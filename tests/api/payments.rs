//! Paying x402 upstreams: real anvil, the project's EIP-3009 token, the project's x402
//! test upstream. Money is checked on-chain (balances, `authorizationState`).

use std::sync::Arc;
use std::time::Duration;
use x402_router_testkit::{Deadline, wait::let_time_pass};

use alloy::primitives::{B256, U256};
use futures_util::future::join_all;
use serde_json::{Value, json};

use crate::helpers::*;

async fn paid_app(chain: &Devnet) -> TestApp {
    spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await
}

fn nonce_for(app: &TestApp, key: &str, body: &Value) -> B256 {
    router_nonce(app.agent.id, key, body)
}

fn price() -> U256 {
    U256::from(PRICE)
}

async fn balances(chain: &Devnet) -> (U256, U256) {
    (chain.balance(ROUTER_ADDRESS).await, chain.balance(PAY_TO).await)
}

async fn payments_rows(app: &TestApp) -> i64 {
    count(&app.db, "SELECT count(*) AS n FROM payments").await
}

#[actix_web::test]
async fn paid_v2_call_moves_exactly_the_price_once_and_replay_moves_nothing() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, pay_to0) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "50000"});

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["status"], 200);
    let p = &env["payment"];
    assert_eq!(p["x402_version"], 2);
    assert_eq!(p["network"], "eip155:84532");
    assert_eq!(p["amount"], PRICE.to_string());
    assert_eq!(p["status"], "settled");
    assert_eq!(p["payer"], ROUTER_ADDRESS.to_checksum(None));
    assert_eq!(p["pay_to"], PAY_TO.to_checksum(None));
    assert!(p["tx_hash"].as_str().unwrap().starts_with("0x"));
    let nonce = nonce_for(&app, &key, &body);
    assert_eq!(p["nonce"], nonce.to_string());
    assert!(chain.authorization_used(ROUTER_ADDRESS, nonce).await);
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));

    let replay = app.route(&key, &body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(replay.json::<Value>().await.unwrap(), env);
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 1);

    // The receipt records the settled payment and verifies.
    let receipt: Value = app
        .client
        .get(format!("{}/receipts/{}", app.address, env["receipt_id"].as_str().unwrap()))
        .bearer_auth(&app.agent.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(receipt["payment"]["status"], "settled");
    assert!(x402_router::receipts::Receipt::verify_json(&receipt.to_string()).is_ok());
    let settled = count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await;
    assert_eq!(settled, 1);
}

#[actix_web::test]
async fn paid_v1_call_moves_exactly_the_price_once() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, pay_to0) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v1/weather"), "max_amount": "10000"});
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["x402_version"], 1);
    assert_eq!(env["payment"]["status"], "settled");
    assert!(chain.authorization_used(ROUTER_ADDRESS, nonce_for(&app, &key, &body)).await);
    assert_eq!(app.route(&key, &body).await.status(), 200);
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));
}

#[actix_web::test]
async fn paid_post_is_forwarded_with_its_body() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let body = json!({"url": chain.url("/v2/echo"), "method": "POST", "body": {"q": "hello"}, "max_amount": "20000"});
    let env: Value = app.route(&new_key(), &body).await.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled");
    assert_eq!(env["payment"]["amount"], "20000");
    assert!(env["body"].to_string().contains("hello"), "{env}");
}

#[actix_web::test]
async fn twenty_concurrent_same_key_paid_requests_make_one_transfer() {
    let chain = Devnet::start().await;
    let app = Arc::new(paid_app(&chain).await);
    let (router0, pay_to0) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    let results = join_all((0..20).map(|_| {
        let (app, key, body) = (Arc::clone(&app), key.clone(), body.clone());
        async move { app.route(&key, &body).await.status().as_u16() }
    }))
    .await;
    assert!(results.iter().all(|s| *s == 200 || *s == 409), "{results:?}");
    assert!(results.contains(&200));
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 1);
    assert_eq!(payments_rows(&app).await, 1);
}

#[actix_web::test]
async fn price_over_max_amount_is_402_and_nothing_is_signed() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let before = balances(&chain).await;
    for max in [None, Some("9999")] {
        let mut body = json!({"url": chain.url("/v2/weather")});
        if let Some(m) = max {
            body["max_amount"] = json!(m);
        }
        let resp = app.route(&new_key(), &body).await;
        assert_eq!(resp.status(), 402);
        let err: Value = resp.json().await.unwrap();
        assert!(err["error"].as_str().unwrap().contains("will not make"), "{err}");
        assert_eq!(err["code"], "payment_over_max_amount");
        assert_eq!(err["accepts"][0]["amount"], PRICE.to_string());
    }
    assert_eq!(payments_rows(&app).await, 0);
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 0);
    assert_eq!(balances(&chain).await, before);
}

#[actix_web::test]
async fn agent_per_call_cap_is_enforced() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    exec(&app.db, &format!("UPDATE agents SET max_per_call = 5000 WHERE id = '{}'", app.agent.id)).await;
    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await;
    assert_eq!(resp.status(), 402);
    assert_eq!(payments_rows(&app).await, 0);
}

#[actix_web::test]
async fn unsupported_network_or_asset_is_402_and_nothing_is_signed() {
    let chain = Devnet::start().await;
    let before = balances(&chain).await;
    // The token is not among the configured assets.
    let other_asset = spawn_app_with(AppOptions {
        extra: vec![
            ("x402-rpc-urls".into(), format!("eip155:84532={}", chain.rpc_url)),
            ("x402-assets".into(), "eip155:84532=0x036CbD53842c5426634e7929541eC2318f3dCF7e".into()),
        ],
        ..Default::default()
    })
    .await;
    // The network has no RPC URL configured.
    let other_network = spawn_app_with(AppOptions {
        extra: vec![
            ("x402-rpc-urls".into(), format!("eip155:8453=http://127.0.0.1:{}", free_port())),
            ("x402-assets".into(), format!("eip155:84532={}@6", chain.token)),
        ],
        ..Default::default()
    })
    .await;
    for app in [&other_asset, &other_network] {
        let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await;
        assert_eq!(resp.status(), 402);
        assert_eq!(payments_rows(app).await, 0);
    }
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 0);
    assert_eq!(balances(&chain).await, before);
}

#[actix_web::test]
async fn cheapest_payable_option_is_chosen_among_several() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, _) = balances(&chain).await;
    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/multi"), "max_amount": "1000000"})).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["asset"], chain.token.to_checksum(None));
    let paid = U256::from_str_radix(env["payment"]["amount"].as_str().unwrap(), 10).unwrap();
    assert_eq!(balances(&chain).await.0, router0 - paid);
}

#[actix_web::test]
async fn upstream_500_before_settlement_is_errored_and_moves_nothing() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let before = balances(&chain).await;
    let key = new_key();
    for path in ["/v2/error500", "/v1/error500"] {
        let key = format!("{key}{}", path.len() + path.as_bytes()[2] as usize);
        let body = json!({"url": chain.url(path), "max_amount": "10000"});
        let resp = app.route(&key, &body).await;
        assert_eq!(resp.status(), 502, "{path}");
        let env: Value = resp.json().await.unwrap();
        assert_eq!(env["status"], 500);
        assert_eq!(env["payment"]["status"], "not_settled", "{env}");
        assert!(!chain.authorization_used(ROUTER_ADDRESS, nonce_for(&app, &key, &body)).await);
        let again = app.route(&key, &json!({"url": chain.url(path), "max_amount": "10000"})).await;
        assert_eq!(again.headers().get("x-idempotent-replay").unwrap(), "true");
    }
    assert_eq!(balances(&chain).await, before);
}

#[actix_web::test]
async fn upstream_that_settles_then_fails_is_errored_with_the_payment_shown_and_paid_once() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, pay_to0) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/settle-then-500"), "max_amount": "10000"});
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["status"], 500);
    assert_eq!(err["payment"]["status"], "settled");
    assert!(err["receipt_id"].is_string());
    let replay = app.route(&key, &body).await;
    assert_eq!(replay.status(), 502);
    assert_eq!(replay.json::<Value>().await.unwrap(), err);
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));
}

#[actix_web::test]
async fn upstream_that_settles_then_drops_the_connection_is_settled_response_lost() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, _) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/settle-then-drop"), "max_amount": "10000"});
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["payment"]["status"], "settled_response_lost", "{err}");
    assert_eq!(app.route(&key, &body).await.status(), 502);
    assert_eq!(balances(&chain).await.0, router0 - price());
}

#[actix_web::test]
async fn rejected_payment_passes_the_reason_through() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let before = balances(&chain).await;
    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/reject"), "max_amount": "10000"})).await;
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    assert!(err["error"].as_str().unwrap().contains("rejected"), "{err}");
    assert!(err.get("invalidReason").is_some() || err["error"].as_str().unwrap().contains("invalid_"), "{err}");
    assert_eq!(err["payment"]["status"], "rejected");
    assert_eq!(err["code"], "payment_rejected");
    assert_eq!(balances(&chain).await, before);
}

#[actix_web::test]
async fn lying_upstream_is_not_recorded_as_settled() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let before = balances(&chain).await;
    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/lie"), "max_amount": "10000"})).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "unconfirmed");
    assert_eq!(env["payment"]["tx_hash"], Value::Null);
    let receipt_status =
        count(&app.db, "SELECT count(*) AS n FROM receipts WHERE payment->>'status' = 'unconfirmed'").await;
    assert_eq!(receipt_status, 1);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await, 0);
    assert_eq!(balances(&chain).await, before);
}

#[actix_web::test]
async fn with_the_rpc_down_nothing_is_paid() {
    let mut chain = Devnet::start().await;
    // The router's RPC points at a dead port; the upstream keeps its own chain access.
    let app = spawn_app_with(AppOptions {
        extra: vec![
            ("x402-rpc-urls".into(), format!("eip155:84532=http://127.0.0.1:{}", free_port())),
            ("x402-assets".into(), format!("eip155:84532={}@6", chain.token)),
            ("x402-rpc-timeout-ms".into(), "1000".into()),
        ],
        ..Default::default()
    })
    .await;
    let before = balances(&chain).await;
    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/weather"), "max_amount": "10000"})).await;
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    assert!(err["error"].as_str().unwrap().contains("nothing was signed or paid"), "{err}");
    assert_eq!(err["code"], "payment_not_made");
    assert_eq!(payments_rows(&app).await, 0);
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 0);
    assert_eq!(balances(&chain).await, before);
    chain.stop_chain().await;
}

#[actix_web::test]
async fn payment_identifier_is_derived_never_the_raw_key() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let key = new_key();
    let resp = app.route(&key, &json!({"url": chain.url("/v2/pid"), "max_amount": "10000"})).await;
    assert_eq!(resp.status(), 200);
    let stats = chain.stats().await;
    let pid = stats["/v2/pid"]["last_payment_identifier"].as_str().unwrap().to_owned();
    assert!(!pid.contains(&key));
    let signer: alloy::signers::local::PrivateKeySigner = ROUTER_KEY.parse().unwrap();
    let expected = x402_router::x402::payment_identifier_id(
        &x402_router::x402::nonce::nonce_secret(&signer),
        app.agent.id,
        &key,
        &request_hash(&json!({"url": chain.url("/v2/pid"), "max_amount": "10000"})),
    );
    assert_eq!(pid, expected);
}

#[actix_web::test]
async fn router_killed_after_the_upstream_settled_never_pays_twice() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "crash").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions {
        abandon_ms: 2000,
        heartbeat_ms: 500,
        deadline_ms: 30_000,
        extra: [chain.router_extra(), vec![("operator-token".into(), "crash-test-operator-token".into())]].concat(),
        ..Default::default()
    };
    let mut a = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let b = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let (router0, pay_to0) = balances(&chain).await;
    let client = reqwest::Client::new();
    let key = new_key();
    // The upstream settles at once, then waits 5 s before answering.
    let body = json!({"url": chain.url("/v2/slow-settle?seconds=5"), "max_amount": "10000"});
    let call = spawn_route(&client, &a.address, &agent, &key, &body);
    // Wait until the transfer is on-chain, then kill the router before it hears back.
    let mut settling =
        Deadline::after(Duration::from_secs(5), "the transfer on-chain").every(Duration::from_millis(50));
    while balances(&chain).await.0 >= router0 {
        if settling.next_poll().await.is_err() {
            break;
        }
    }
    assert_eq!(balances(&chain).await.0, router0 - price(), "the upstream settled");
    a.kill9().await;
    assert!(call.await.unwrap().is_err());
    assert_eq!(count(&db, "SELECT count(*) AS n FROM payments WHERE status = 'signed'").await, 1);

    assert_eq!(route_at(&client, &b.address, &agent, &key, &body).await.status(), 409);
    // lets time pass: the dead owner's heartbeat ages past the abandonment window (wall time).
    let_time_pass(Duration::from_millis(2300)).await;
    let resp = route_at(&client, &b.address, &agent, &key, &body).await;
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["payment"]["status"], "settled_response_lost", "{err}");
    assert!(err["error"].as_str().unwrap().contains("response was lost"));
    assert_eq!(err["code"], "settled_response_lost");
    // No second transfer, and the receipt says what happened.
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));
    assert_eq!(chain.stats().await["/v2/slow-settle"]["paid"], 1);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM receipts WHERE payment->>'status' = 'settled_response_lost' AND upstream_status IS NULL").await, 1);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM payments WHERE status = 'settled_response_lost'").await, 1);
    let replay = route_at(&client, &b.address, &agent, &key, &body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(balances(&chain).await.0, router0 - price());
    // Operators see the payment as paid, not served.
    let audit: Value = client
        .get(format!("{}/audit/payments?status=paid_not_served", b.address))
        .bearer_auth("crash-test-operator-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed = audit["payments"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{audit}");
    assert_eq!(listed[0]["idempotency_key"], key);
    assert_eq!(listed[0]["status"], "settled_response_lost");
}

#[actix_web::test]
async fn takeover_of_an_unsent_valid_payment_resends_it_and_pays_once() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, _) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    crash_after_signing(&app, &chain, &key, &body, 200).await;
    let stored_header = count(&app.db, "SELECT attempts::bigint AS n FROM payments").await;
    assert_eq!(stored_header, 1);

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled");
    assert_eq!(count(&app.db, "SELECT attempts::bigint AS n FROM payments").await, 1, "resent, not re-signed");
    assert_eq!(balances(&chain).await.0, router0 - price());
    // Only the paid request reached the upstream: no new unpaid probe.
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 1);
}

#[actix_web::test]
async fn takeover_of_an_expired_unused_payment_re_signs_with_the_same_nonce() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, _) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    crash_after_signing(&app, &chain, &key, &body, -5).await;

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled");
    assert_eq!(env["payment"]["nonce"], nonce_for(&app, &key, &body).to_string());
    assert_eq!(count(&app.db, "SELECT attempts::bigint AS n FROM payments").await, 2, "re-signed once");
    assert_eq!(balances(&chain).await.0, router0 - price());
}

#[actix_web::test]
async fn takeover_with_the_chain_unreadable_decides_nothing_and_pays_nothing() {
    let mut chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    crash_after_signing(&app, &chain, &key, &body, 200).await;
    chain.stop_chain().await;
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'signed'").await, 1);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM idempotency_keys WHERE status = 'in_flight'").await, 1);
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 0);
}

#[actix_web::test]
async fn fifty_parallel_paid_calls_against_a_budget_of_three_prices_make_exactly_three_transfers() {
    let chain = Devnet::start().await;
    // Fifty payments of one agent queue on its row lock: give them time for a connection.
    let app = Arc::new(
        spawn_app_with(AppOptions { acquire_timeout_ms: 10_000, extra: chain.router_extra(), ..Default::default() })
            .await,
    );
    exec(&app.db, &format!("UPDATE agents SET daily_budget = {} WHERE id = '{}'", 3 * PRICE, app.agent.id)).await;
    let (router0, pay_to0) = balances(&chain).await;
    let results = join_all((0..50).map(|_| {
        let app = Arc::clone(&app);
        let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
        async move {
            let resp = app.route(&new_key(), &body).await;
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap();
            (status, body)
        }
    }))
    .await;
    let paid = results.iter().filter(|(s, b)| *s == 200 && b["payment"]["status"] == "settled").count();
    let refused: Vec<_> = results.iter().filter(|(s, _)| *s == 402).collect();
    assert_eq!(paid, 3, "{:?}", results.iter().map(|(s, _)| s).collect::<Vec<_>>());
    assert_eq!(refused.len(), 47);
    assert!(refused.iter().all(|(_, b)| b["error"].as_str().unwrap().contains("budget")), "{:?}", refused.first());
    assert!(refused.iter().all(|(_, b)| b["code"] == "payment_over_budget"), "{:?}", refused.first());
    assert_eq!(balances(&chain).await, (router0 - price() * U256::from(3), pay_to0 + price() * U256::from(3)));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 3);
    let spend = x402_router::payments::store::agent_spend(&mut app.db.conn().await, app.agent.id, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(spend.settled_24h, (3 * PRICE).to_string());
    assert_eq!(spend.remaining_24h.as_deref(), Some("0"));
}

#[actix_web::test]
async fn paid_request_cut_off_by_the_deadline_is_errored_unknown_and_never_paid_again() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { deadline_ms: 1500, extra: chain.router_extra(), ..Default::default() }).await;
    let (router0, _) = balances(&chain).await;
    let key = new_key();
    // The upstream verifies, waits 3 s, then settles: it holds a valid authorization.
    let body = json!({"url": chain.url("/v2/stall?seconds=3"), "max_amount": "10000"});
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 504);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["payment"]["status"], "unknown", "{err}");
    // The upstream settles later; the router never pays this key again.
    let mut settling =
        Deadline::after(Duration::from_secs(10), "the late settlement").every(Duration::from_millis(100));
    while !chain.authorization_used(ROUTER_ADDRESS, nonce_for(&app, &key, &body)).await {
        if settling.next_poll().await.is_err() {
            break;
        }
    }
    assert!(chain.authorization_used(ROUTER_ADDRESS, nonce_for(&app, &key, &body)).await);
    let replay = app.route(&key, &body).await;
    assert_eq!(replay.status(), 504);
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(balances(&chain).await.0, router0 - price());
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'unknown'").await, 1);
}

#[actix_web::test]
async fn a_key_whose_intent_reconcile_expired_is_re_signed_and_paid_once_on_retry() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, _) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    crash_after_signing(&app, &chain, &key, &body, -120).await;
    let out = router_command()
        .args(["reconcile", "--older-than-secs", "0"])
        .env("DATABASE_URL", &app.db.url)
        .env("X402_RPC_URLS", format!("eip155:84532={}", chain.rpc_url))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'expired'").await, 1);

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled");
    assert_eq!(env["payment"]["nonce"], nonce_for(&app, &key, &body).to_string());
    assert_eq!(balances(&chain).await.0, router0 - price());
}
