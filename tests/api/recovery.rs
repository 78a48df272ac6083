//! Paid, then lost (issue 16): a router is killed (`kill -9`, a real process) after the
//! upstream took its payment and before the answer was recorded. The retry that takes the
//! key over finds the nonce used on-chain and must never pay again; when the upstream
//! advertised `payment-identifier`, it gets the original answer back by re-sending the
//! stored request and payment byte for byte. Real anvil, token and test upstream.

use std::time::{Duration, Instant};

use alloy::primitives::U256;
use serde_json::{Value, json};

use crate::helpers::tls_services::wait_until;
use crate::helpers::*;

const OPERATOR: &str = "recovery-test-operator-token";

struct Crashed {
    chain: Devnet,
    db: TestDb,
    agent: Agent,
    key: String,
    body: Value,
    /// The router that retries (the other one was killed).
    retrier: RouterProcess,
    client: reqwest::Client,
    router0: U256,
    path: &'static str,
}

/// Sends `query` of `/v2/pid`-like `path` through router A, waits until the upstream settled
/// (its handler still running), kills A with SIGKILL, and returns with router B ready.
async fn kill_router_while_the_upstream_handles(path: &'static str, query: &str) -> Crashed {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "recovery").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions {
        abandon_ms: 1500,
        heartbeat_ms: 300,
        deadline_ms: 30_000,
        extra: [chain.router_extra(), vec![("operator-token".into(), OPERATOR.into())]].concat(),
        ..Default::default()
    };
    let mut a = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let retrier = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let router0 = chain.balance(ROUTER_ADDRESS).await;
    let client = reqwest::Client::new();
    let key = new_key();
    let body = json!({"url": chain.url(&format!("{path}{query}")), "max_amount": "10000"});
    let call = spawn_route(&client, &a.address, &agent, &key, &body);
    wait_until("the upstream to settle", Duration::from_secs(20), async || chain.stats().await[path]["paid"] == 1)
        .await;
    a.kill9().await;
    assert!(call.await.unwrap().is_err(), "the killed router never answered");
    assert_eq!(count(&db, "SELECT count(*) AS n FROM payments WHERE status = 'signed'").await, 1);
    Crashed { chain, db, agent, key, body, retrier, client, router0, path }
}

impl Crashed {
    /// Retries the key on router B until it is no longer 409 in flight (the abandonment
    /// window passes), and returns the final answer.
    async fn retry_until_final(&self) -> (u16, Value) {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let resp = route_at(&self.client, &self.retrier.address, &self.agent, &self.key, &self.body).await;
            let status = resp.status().as_u16();
            if status != 409 {
                return (status, resp.json().await.unwrap());
            }
            assert!(Instant::now() < deadline, "the key stayed in flight");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stats(&self) -> Value {
        self.chain.stats().await[self.path].clone()
    }

    /// The router paid exactly once.
    async fn assert_paid_once(&self) {
        assert_eq!(self.chain.balance(ROUTER_ADDRESS).await, self.router0 - U256::from(PRICE));
        assert_eq!(self.stats().await["paid"], 1, "one settlement");
        assert_eq!(count(&self.db, "SELECT count(*) AS n FROM payments").await, 1);
        assert_eq!(count(&self.db, "SELECT attempts::bigint AS n FROM payments").await, 1, "never re-signed");
    }

    async fn metric(&self, outcome: &str) -> f64 {
        let text = self.client.get(format!("{}/metrics", self.retrier.address)).send().await.unwrap();
        let text = text.text().await.unwrap();
        let name = format!("x402_router_recoveries_total{{outcome=\"{outcome}\"}}");
        text.lines().find(|l| l.starts_with(&name)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0)
    }

    async fn paid_not_served(&self) -> Vec<Value> {
        let audit: Value = self
            .client
            .get(format!("{}/audit/payments?status=paid_not_served", self.retrier.address))
            .bearer_auth(OPERATOR)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        audit["payments"].as_array().unwrap().clone()
    }
}

#[actix_web::test]
async fn a_payment_identifier_answer_lost_by_a_killed_router_is_recovered_and_paid_once() {
    // The upstream settles, then keeps handling for 2 s: the router dies meanwhile.
    let crashed = kill_router_while_the_upstream_handles("/v2/pid", "?seconds=2").await;
    wait_until("the upstream to finish the original request", Duration::from_secs(20), async || {
        crashed.stats().await["pid_completed"] == 1
    })
    .await;

    let (status, env) = crashed.retry_until_final().await;

    assert_eq!(status, 200, "{env}");
    assert_eq!(env["status"], 200);
    assert_eq!(env["body"]["handled_for_seconds"], 2, "the original answer: {env}");
    assert_eq!(env["payment"]["status"], "settled");
    assert_eq!(env["payment"]["recovery"], "recovered");
    let stats = crashed.stats().await;
    assert_eq!(stats["pid_completed"], 1, "the upstream's handler ran once: {stats}");
    assert_eq!(stats["pid_replays"], 1, "one identical re-send answered from the cache: {stats}");
    crashed.assert_paid_once().await;
    // The recorded transaction is the one the chain shows using the nonce.
    let tx = stats["last_transaction"].as_str().unwrap().to_owned();
    assert_eq!(env["payment"]["tx_hash"], tx);
    // A normal completed call, whose receipt says recovered; the ledger says what was tried.
    let db = &crashed.db;
    assert_eq!(
        count(
            db,
            "SELECT count(*) AS n FROM receipts WHERE outcome = 'completed' AND payment->>'recovery' = 'recovered'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            db,
            "SELECT count(*) AS n FROM payments WHERE status = 'settled' AND recovery->>'outcome' = 'recovered' \
               AND jsonb_array_length(recovery->'attempts') = 1"
        )
        .await,
        1
    );
    assert_eq!(crashed.metric("recovered").await, 1.0);
    assert!(crashed.paid_not_served().await.is_empty(), "served: not in the paid-not-served view");
    // A replay is the recovered answer; nothing more reaches the upstream.
    let replay = route_at(&crashed.client, &crashed.retrier.address, &crashed.agent, &crashed.key, &crashed.body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(replay.json::<Value>().await.unwrap(), env);
    assert_eq!(crashed.stats().await["payment_attempts"], 2);
}

#[actix_web::test]
async fn a_takeover_while_the_upstream_still_handles_waits_out_its_503s_and_recovers_the_answer() {
    // The upstream is still handling the original (6 s) when the key is taken over (1.5 s).
    let crashed = kill_router_while_the_upstream_handles("/v2/pid", "?seconds=6").await;

    let (status, env) = crashed.retry_until_final().await;

    assert_eq!(status, 200, "{env}");
    assert_eq!(env["body"]["handled_for_seconds"], 6, "{env}");
    assert_eq!(env["payment"]["recovery"], "recovered");
    let stats = crashed.stats().await;
    assert!(stats["pid_in_flight"].as_u64().unwrap() >= 1, "answered 503 while in flight: {stats}");
    assert_eq!(stats["pid_replays"], 1, "{stats}");
    assert_eq!(stats["pid_completed"], 1, "the handler ran once: {stats}");
    crashed.assert_paid_once().await;
    let retries = count(
        &crashed.db,
        "SELECT count(*) AS n FROM payments p, jsonb_array_elements(p.recovery->'attempts') a WHERE a->>'status' = '503'",
    )
    .await;
    assert_eq!(retries, stats["pid_in_flight"].as_u64().unwrap() as i64, "every 503 is in the recovery log");
}

#[actix_web::test]
async fn a_409_to_the_re_sent_payment_stops_recovery_and_the_payment_is_settled_response_lost() {
    // A cache that refuses every re-send of an id (409).
    let crashed = kill_router_while_the_upstream_handles("/v2/pid", "?seconds=1&conflict=true").await;
    wait_until("the upstream to finish the original request", Duration::from_secs(20), async || {
        crashed.stats().await["pid_completed"] == 1
    })
    .await;

    let (status, err) = crashed.retry_until_final().await;

    assert_eq!(status, 502, "{err}");
    assert_eq!(err["code"], "settled_response_lost");
    assert_eq!(err["payment"]["status"], "settled_response_lost");
    assert_eq!(err["payment"]["recovery"], "lost");
    let stats = crashed.stats().await;
    assert_eq!(stats["pid_conflicts"], 1, "{stats}");
    assert_eq!(stats["payment_attempts"], 2, "the original and one re-send, nothing after the 409: {stats}");
    crashed.assert_paid_once().await;
    assert_eq!(crashed.metric("lost").await, 1.0);
    // Operators see the payment, and what recovery tried.
    let listed = crashed.paid_not_served().await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["recovery"]["outcome"], "lost", "{listed:?}");
    assert_eq!(listed[0]["recovery"]["attempts"][0]["status"], 409, "{listed:?}");
}

#[actix_web::test]
async fn a_plain_upstream_gets_no_re_send_and_the_payment_is_settled_response_lost() {
    // /v2/slow-settle advertises no payment-identifier: settles, then answers after 3 s.
    let crashed = kill_router_while_the_upstream_handles("/v2/slow-settle", "?seconds=3").await;

    let (status, err) = crashed.retry_until_final().await;

    assert_eq!(status, 502, "{err}");
    assert_eq!(err["code"], "settled_response_lost");
    assert_eq!(err["payment"]["recovery"], "lost");
    let stats = crashed.stats().await;
    assert_eq!(stats["payment_attempts"], 1, "nothing re-sent to an upstream that cannot recognise it: {stats}");
    crashed.assert_paid_once().await;
    let listed = crashed.paid_not_served().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["recovery"]["outcome"], "lost");
}

#[actix_web::test]
async fn the_request_as_sent_and_the_advertised_extensions_are_committed_with_the_intent() {
    let crashed = kill_router_while_the_upstream_handles("/v2/pid", "?seconds=1").await;
    let url = crashed.body["url"].as_str().unwrap().to_owned();
    let db = &crashed.db;
    let sql = format!(
        "SELECT count(*) AS n FROM payments WHERE request_method = 'GET' AND request_url = '{url}' \
           AND request_body IS NULL AND convert_from(advertised_extensions, 'UTF8')::jsonb ? 'payment-identifier' \
           AND context->'extensions'->'payment-identifier'->'info'->>'id' LIKE 'pay_%'"
    );
    assert_eq!(count(db, &sql).await, 1);
}
