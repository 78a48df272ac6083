//! Paid, then lost (issue 16): a router is killed (`kill -9`, a real process) after the
//! upstream took its payment and before the answer was recorded. The retry that takes the
//! key over finds the nonce used on-chain and must never pay again; when the upstream
//! advertised `payment-identifier`, it gets the original answer back by re-sending the
//! stored request and payment byte for byte; when it advertised `sign-in-with-x` (and the
//! request is a GET or HEAD), it re-accesses the resource by signing in as the payer: a new
//! execution, never a second payment. Real anvil, token and test upstream.

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
    /// The routers' Redis key prefix.
    prefix: String,
}

/// Sends `query` of `/v2/pid`-like `path` through router A, waits until the upstream settled
/// (its handler still running), kills A with SIGKILL, and returns with router B ready.
async fn kill_router_while_the_upstream_handles(path: &'static str, query: &str) -> Crashed {
    kill_router_while_the_upstream_handles_a(Method::Get, path, query).await
}

#[derive(Clone, Copy)]
enum Method {
    Get,
    Post,
}

/// [`kill_router_while_the_upstream_handles`] for a GET or a POST (with a JSON body).
async fn kill_router_while_the_upstream_handles_a(method: Method, path: &'static str, query: &str) -> Crashed {
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
    let url = chain.url(&format!("{path}{query}"));
    let body = match method {
        Method::Get => json!({"url": url, "max_amount": "10000"}),
        Method::Post => json!({"url": url, "method": "POST", "body": {"order": 42}, "max_amount": "10000"}),
    };
    let call = spawn_route(&client, &a.address, &agent, &key, &body);
    wait_until("the upstream to settle", Duration::from_secs(20), async || chain.stats().await[path]["paid"] == 1)
        .await;
    a.kill9().await;
    assert!(call.await.unwrap().is_err(), "the killed router never answered");
    assert_eq!(count(&db, "SELECT count(*) AS n FROM payments WHERE status = 'signed'").await, 1);
    Crashed { chain, db, agent, key, body, retrier, client, router0, path, prefix }
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

    /// Forgets the key, as GC does once it expired (Postgres row and Redis entry).
    async fn forget_key(&self) {
        exec(&self.db, &format!("DELETE FROM idempotency_keys WHERE key = '{}'", self.key)).await;
        let client = redis::Client::open(redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg(format!("{}idem:{{{}}}:{}", self.prefix, self.agent.id, self.key))
            .query_async(&mut conn)
            .await
            .unwrap();
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

/// The recovery log of the only payment.
async fn recovery_log(db: &TestDb) -> Value {
    let conn = &mut db.conn().await;
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Jsonb)]
        recovery: Value,
    }
    use diesel_async::RunQueryDsl;
    let rows: Vec<Row> =
        diesel::sql_query("SELECT recovery FROM payments WHERE recovery IS NOT NULL").load(conn).await.unwrap();
    assert_eq!(rows.len(), 1);
    rows.into_iter().next().unwrap().recovery
}

#[actix_web::test]
async fn a_siwx_answer_lost_by_a_killed_router_is_re_accessed_by_signing_in_and_paid_once() {
    // The upstream settles, records the payer, then keeps handling for 2 s: the router dies.
    let crashed = kill_router_while_the_upstream_handles("/v2/siwx", "?seconds=2").await;
    wait_until("the upstream to finish the paid handler", Duration::from_secs(20), async || {
        crashed.stats().await["siwx_handled"] == 1
    })
    .await;
    let lost_answer = crashed.stats().await["last_answer_id"].as_str().unwrap().to_owned();

    let (status, env) = crashed.retry_until_final().await;

    assert_eq!(status, 200, "{env}");
    assert_eq!(env["status"], 200);
    assert_eq!(env["body"]["reaccessed"], true, "a new execution of the handler: {env}");
    assert_ne!(env["body"]["answer_id"], lost_answer, "never presented as the lost answer");
    assert_eq!(env["payment"]["status"], "settled");
    assert_eq!(env["payment"]["recovery"], "reaccessed");
    let stats = crashed.stats().await;
    assert_eq!(env["body"]["answer_id"], stats["last_answer_id"], "{stats}");
    assert_eq!(stats["siwx_handled"], 1, "the paid handler ran once: {stats}");
    assert_eq!(stats["siwx_sign_ins"], 1, "one sign-in: {stats}");
    assert_eq!(stats["siwx_reaccess"], 1, "the handler ran again once, by sign-in: {stats}");
    assert_eq!(stats["payment_attempts"], 1, "no payment was sent again: {stats}");
    crashed.assert_paid_once().await;
    assert_eq!(env["payment"]["tx_hash"], stats["last_transaction"]);
    let db = &crashed.db;
    assert_eq!(
        count(
            db,
            "SELECT count(*) AS n FROM receipts WHERE outcome = 'completed' AND payment->>'recovery' = 'reaccessed'"
        )
        .await,
        1
    );
    let log = recovery_log(db).await;
    assert_eq!(log["outcome"], "reaccessed", "{log}");
    let steps: Vec<&str> = log["attempts"].as_array().unwrap().iter().filter_map(|a| a["action"].as_str()).collect();
    assert_eq!(steps, ["none", "challenge", "sign-in"], "{log}");
    assert_eq!(count(db, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await, 1);
    assert_eq!(crashed.metric("reaccessed").await, 1.0);
    assert!(crashed.paid_not_served().await.is_empty(), "served: not in the paid-not-served view");
    // A replay is that answer; nothing more reaches the upstream.
    let replay = route_at(&crashed.client, &crashed.retrier.address, &crashed.agent, &crashed.key, &crashed.body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(replay.json::<Value>().await.unwrap(), env);
    assert_eq!(crashed.stats().await["siwx_sign_ins"], 1);
}

#[actix_web::test]
async fn a_payment_identifier_recovery_comes_before_any_sign_in() {
    // Both extensions: the original answer is recovered; nobody signs in.
    let crashed = kill_router_while_the_upstream_handles("/v2/pid-siwx", "?seconds=1").await;
    wait_until("the upstream to finish the original request", Duration::from_secs(20), async || {
        crashed.stats().await["pid_completed"] == 1
    })
    .await;

    let (status, env) = crashed.retry_until_final().await;

    assert_eq!(status, 200, "{env}");
    assert_eq!(env["payment"]["recovery"], "recovered", "{env}");
    assert_eq!(env["body"]["handled_for_seconds"], 1);
    let stats = crashed.stats().await;
    assert_eq!(stats["siwx_sign_ins"], 0, "{stats}");
    assert_eq!(stats["siwx_handled"], 1, "{stats}");
    crashed.assert_paid_once().await;
}

#[actix_web::test]
async fn a_post_to_a_siwx_route_is_never_signed_in_and_stays_settled_response_lost() {
    let crashed = kill_router_while_the_upstream_handles_a(Method::Post, "/v2/siwx-post", "?seconds=3").await;

    let (status, err) = crashed.retry_until_final().await;

    assert_eq!(status, 502, "{err}");
    assert_eq!(err["code"], "settled_response_lost");
    assert_eq!(err["payment"]["recovery"], "lost");
    let stats = crashed.stats().await;
    assert_eq!(stats["siwx_sign_ins"], 0, "{stats}");
    assert_eq!(stats["requests"], 2, "the first 402 and the paid request, nothing after: {stats}");
    crashed.assert_paid_once().await;
    let log = recovery_log(&crashed.db).await;
    let last = log["attempts"].as_array().unwrap().last().unwrap().clone();
    assert!(last["result"].as_str().unwrap().contains("POST may not be run again"), "{log}");
}

#[actix_web::test]
async fn a_hostile_challenge_is_never_signed() {
    for hostile in ["wrong-chain", "other-domain"] {
        let crashed =
            kill_router_while_the_upstream_handles("/v2/siwx", &format!("?seconds=1&challenge={hostile}")).await;

        let (status, err) = crashed.retry_until_final().await;

        assert_eq!(status, 502, "{hostile}: {err}");
        assert_eq!(err["code"], "settled_response_lost");
        let stats = crashed.stats().await;
        assert_eq!(stats["siwx_sign_ins"], 0, "{hostile}: no signature sent: {stats}");
        assert_eq!(stats["payment_attempts"], 1, "{stats}");
        crashed.assert_paid_once().await;
        let log = recovery_log(&crashed.db).await;
        let challenge = log["attempts"].as_array().unwrap().iter().find(|a| a["action"] == "challenge").cloned();
        let why = challenge.as_ref().and_then(|c| c["result"].as_str()).unwrap_or_default().to_owned();
        assert!(why.starts_with("refused: "), "{hostile}: the reason is logged: {log}");
        assert_eq!(log["outcome"], "lost");
    }
}

#[actix_web::test]
async fn a_siwx_upstream_that_refuses_the_sign_in_leaves_the_payment_settled_response_lost() {
    let crashed = kill_router_while_the_upstream_handles("/v2/siwx", "?seconds=1&siwx=refuse").await;

    let (status, err) = crashed.retry_until_final().await;

    assert_eq!(status, 502, "{err}");
    assert_eq!(err["code"], "settled_response_lost");
    assert_eq!(err["payment"]["recovery"], "lost");
    let stats = crashed.stats().await;
    assert_eq!(stats["siwx_sign_ins"], 1, "one sign-in, no more: {stats}");
    assert_eq!(stats["siwx_refused"], 1, "{stats}");
    assert_eq!(stats["siwx_reaccess"], 0, "{stats}");
    assert_eq!(stats["payment_attempts"], 1, "nothing paid again: {stats}");
    crashed.assert_paid_once().await;
    let log = recovery_log(&crashed.db).await;
    assert_eq!(log["attempts"].as_array().unwrap().last().unwrap()["status"], 402, "{log}");
    assert_eq!(crashed.metric("lost").await, 1.0);
    assert_eq!(crashed.paid_not_served().await.len(), 1);
}

#[actix_web::test]
async fn the_same_request_under_an_expired_key_whose_answer_was_lost_is_re_accessed_not_paid_again() {
    // The router died after the upstream settled; `reconcile` marked the payment
    // `settled_response_lost` and the key was later collected (as GC would once it is terminal).
    let crashed = kill_router_while_the_upstream_handles("/v2/siwx", "?seconds=1").await;
    wait_until("the upstream to finish the paid handler", Duration::from_secs(20), async || {
        crashed.stats().await["siwx_handled"] == 1
    })
    .await;
    exec(&crashed.db, "UPDATE payments SET status = 'settled_response_lost'").await;
    crashed.forget_key().await;

    let resp = route_at(&crashed.client, &crashed.retrier.address, &crashed.agent, &crashed.key, &crashed.body).await;

    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["recovery"], "reaccessed", "{env}");
    assert_eq!(env["body"]["reaccessed"], true, "{env}");
    let stats = crashed.stats().await;
    assert_eq!(stats["siwx_reaccess"], 1, "{stats}");
    assert_eq!(stats["payment_attempts"], 1, "{stats}");
    crashed.assert_paid_once().await;
    assert_eq!(count(&crashed.db, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await, 1);
    // Served now: the same request under the key expired again is `already_paid`, never re-run.
    crashed.forget_key().await;
    let again = route_at(&crashed.client, &crashed.retrier.address, &crashed.agent, &crashed.key, &crashed.body).await;
    assert_eq!(again.status(), 409);
    assert_eq!(again.json::<Value>().await.unwrap()["code"], "already_paid");
    assert_eq!(crashed.stats().await["siwx_reaccess"], 1);
    crashed.assert_paid_once().await;
}
