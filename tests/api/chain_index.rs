//! The chain index (issue 41, item 1): with a WebSocket URL for its network, the paid path
//! reads nothing from the chain in the common case — the nonce check before signing and the
//! proof of a claimed settlement come from a log subscription — and every gap (the
//! subscription dropped or lagging, a reorganization) is either answered correctly by the
//! index or read from the chain. Real anvil (HTTP and WebSocket on one port), the project's
//! token and test upstream; money counted on-chain; chain reads counted in /metrics.

use std::time::Duration;

use alloy::primitives::U256;
use serde_json::{Value, json};

use crate::helpers::*;

/// `ws://` of `chain`'s anvil, or of a proxy port in front of it.
fn ws_url(port: u16) -> String {
    format!("ws://127.0.0.1:{port}")
}

fn anvil_port(chain: &Devnet) -> u16 {
    reqwest::Url::parse(&chain.rpc_url).unwrap().port().unwrap()
}

async fn indexed_app(chain: &Devnet, ws_port: u16) -> TestApp {
    let ws = format!("eip155:{}={}", chain.chain_id, ws_url(ws_port));
    paid_app_with(chain, &[("x402-ws-urls", &ws)]).await
}

/// The value of the first sample of `metric` (with its labels, e.g. `name{label="x"}`).
fn sample(text: &str, metric: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(metric) && l[metric.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Chain reads of the paid path so far: nonce checks and settlement proofs.
async fn chain_reads(app: &TestApp) -> f64 {
    let text = app.metrics_text().await;
    ["authorizationState", "nonceBitmap", "settlement"]
        .iter()
        .map(|m| sample(&text, &format!("x402_router_rpc_seconds_count{{method=\"{m}\"}}")))
        .sum()
}

async fn index_live(app: &TestApp, chain: &Devnet) -> bool {
    let text = app.metrics_text().await;
    sample(&text, &format!("x402_router_chain_index_live{{network=\"eip155:{}\"}}", chain.chain_id)) == 1.0
}

async fn wait_live(app: &TestApp, chain: &Devnet, live: bool) {
    x402_router_testkit::wait_until(Duration::from_secs(20), "the chain index to change", || async {
        index_live(app, chain).await == live
    })
    .await
    .unwrap();
}

async fn paid(app: &TestApp, key: &str, url: String) -> Value {
    let resp = app.route(key, &json!({"url": url, "max_amount": "50000"})).await;
    let status = resp.status().as_u16();
    let env: Value = resp.json().await.unwrap();
    assert_eq!((status, &env["payment"]["status"]), (200, &json!("settled")), "{env}");
    env
}

/// The ledger loses every row of `key` (a restore from an older backup): only the chain knows.
async fn lose_ledger_rows(app: &TestApp, key: &str) {
    for sql in [
        format!("DELETE FROM idempotency_keys WHERE key = '{key}'"),
        format!(
            "DELETE FROM recovered_answers WHERE payment_id IN (SELECT id FROM payments WHERE idempotency_key = '{key}')"
        ),
        format!("DELETE FROM payments WHERE idempotency_key = '{key}'"),
        format!("DELETE FROM receipts WHERE idempotency_key = '{key}'"),
    ] {
        exec(&app.db, &sql).await;
    }
    app.forget_cached(key).await;
}

#[actix_web::test]
async fn a_paid_call_reads_nothing_from_the_chain_while_its_index_is_live() {
    let chain = Devnet::start().await;
    let app = indexed_app(&chain, anvil_port(&chain)).await;
    wait_live(&app, &chain, true).await;
    let (before, pay_to0) = (chain_reads(&app).await, chain.balance(PAY_TO).await);
    paid(&app, &new_key(), chain.url("/v2/weather")).await;
    paid(&app, &new_key(), chain.url("/v2/weather")).await;
    paid(&app, &new_key(), chain.url("/v2/weather?city=Rome")).await;
    assert_eq!(chain_reads(&app).await, before, "neither the nonce checks nor the proofs read the chain");
    assert_eq!(chain.balance(PAY_TO).await - pay_to0, U256::from(3 * PRICE));
    let text = app.metrics_text().await;
    assert!(sample(&text, "x402_router_chain_index_answers_total{answer=\"proof\"}") >= 3.0, "{text}");
}

/// The ledger lost a paid call's rows; the same request under the same key is not paid again:
/// the index knows its nonce is used (no chain read).
#[actix_web::test]
async fn the_index_answers_for_a_ledger_that_lost_a_payment() {
    let chain = Devnet::start().await;
    let app = indexed_app(&chain, anvil_port(&chain)).await;
    wait_live(&app, &chain, true).await;
    let key = new_key();
    paid(&app, &key, chain.url("/v2/weather")).await;
    lose_ledger_rows(&app, &key).await;
    let (before, pay_to0) = (chain_reads(&app).await, chain.balance(PAY_TO).await);
    let resp = app.route(&key, &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await;
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["code"], "settled_response_lost", "{env}");
    assert_eq!(chain.balance(PAY_TO).await, pay_to0, "never paid twice");
    assert_eq!(chain_reads(&app).await, before, "answered by the index");
}

/// The subscription is dropped and cannot come back: the index stops answering, and the paid
/// path reads the chain (and stays correct: the lost ledger's payment is still found); once
/// the endpoint takes connections again, the index catches up and answers again.
#[actix_web::test]
async fn a_dropped_subscription_reads_the_chain_until_it_is_back() {
    let chain = Devnet::start().await;
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", anvil_port(&chain))).await.unwrap();
    let app = indexed_app(&chain, proxy.port).await;
    wait_live(&app, &chain, true).await;
    proxy.refuse(true);
    proxy.drop_all();
    wait_live(&app, &chain, false).await;
    let key = new_key();
    let before = chain_reads(&app).await;
    paid(&app, &key, chain.url("/v2/weather")).await;
    assert!(chain_reads(&app).await > before, "no index: the chain is read");
    lose_ledger_rows(&app, &key).await;
    let env: Value =
        app.route(&key, &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await.json().await.unwrap();
    assert_eq!(env["code"], "settled_response_lost", "{env}");
    // Back: caught up from the last block seen (the payment made meanwhile included).
    proxy.refuse(false);
    wait_live(&app, &chain, true).await;
    lose_ledger_rows(&app, &key).await;
    let before = chain_reads(&app).await;
    let env: Value =
        app.route(&key, &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await.json().await.unwrap();
    assert_eq!(env["code"], "settled_response_lost", "{env}");
    assert_eq!(chain_reads(&app).await, before, "the caught-up index knows the payment made while it was down");
}

/// The subscription stalls (its frames held back) while the chain moves on: the index notices
/// it is behind the HTTP endpoint and stops answering; the paid path reads the chain.
#[actix_web::test]
async fn a_lagging_subscription_is_not_believed() {
    let chain = Devnet::start().await;
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", anvil_port(&chain))).await.unwrap();
    let app = indexed_app(&chain, proxy.port).await;
    wait_live(&app, &chain, true).await;
    proxy.stall(Duration::from_secs(60));
    for _ in 0..5 {
        chain.rpc("evm_mine", json!([])).await;
    }
    wait_live(&app, &chain, false).await;
    let key = new_key();
    let before = chain_reads(&app).await;
    paid(&app, &key, chain.url("/v2/weather")).await;
    assert!(chain_reads(&app).await > before, "a lagging index is not believed: the chain is read");
    lose_ledger_rows(&app, &key).await;
    let env: Value =
        app.route(&key, &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await.json().await.unwrap();
    assert_eq!(env["code"], "settled_response_lost", "{env}");
    proxy.clear();
}

/// A reorganization takes out the block that held a payment: the index drops it, so a
/// request whose ledger rows were lost is paid again, once — on the chain that stands.
#[actix_web::test]
async fn a_reorganized_payment_leaves_the_index() {
    let chain = Devnet::start().await;
    let app = indexed_app(&chain, anvil_port(&chain)).await;
    wait_live(&app, &chain, true).await;
    let key = new_key();
    let pay_to0 = chain.balance(PAY_TO).await;
    paid(&app, &key, chain.url("/v2/weather")).await;
    // The payment's block replaced by an empty one.
    chain.rpc("anvil_reorg", json!([1, []])).await;
    assert_eq!(chain.balance(PAY_TO).await, pay_to0, "the payment is gone from the chain");
    lose_ledger_rows(&app, &key).await;
    let env = paid(&app, &key, chain.url("/v2/weather")).await;
    assert_eq!(env["payment"]["status"], "settled");
    assert_eq!(chain.balance(PAY_TO).await - pay_to0, U256::from(PRICE), "paid once on the chain that stands");
}
