//! Paid, then lost (issue 16): a router is killed (`kill -9`, a real process) after the
//! upstream took its payment and before the answer was recorded. The retry that takes the
//! key over finds the nonce used on-chain and must never pay again; when the upstream
//! advertised `payment-identifier`, it gets the original answer back by re-sending the
//! stored request and payment byte for byte; when it advertised `sign-in-with-x` (and the
//! request is a GET or HEAD), it re-accesses the resource by signing in as the payer: a new
//! execution, never a second payment. Real anvil, token and test upstream.

use std::time::Duration;
use x402_router_testkit::Deadline;

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
    kill_router(Method::Get, path, query, 30_000).await
}

#[derive(Clone, Copy)]
enum Method {
    Get,
    Post,
}

/// [`kill_router_while_the_upstream_handles`] for a GET or a POST (with a JSON body).
async fn kill_router_while_the_upstream_handles_a(method: Method, path: &'static str, query: &str) -> Crashed {
    kill_router(method, path, query, 30_000).await
}

/// [`kill_router_while_the_upstream_handles`] with router B's route deadline.
async fn kill_router_while_the_upstream_handles_with(
    path: &'static str,
    query: &str,
    retrier_deadline_ms: u64,
) -> Crashed {
    kill_router(Method::Get, path, query, retrier_deadline_ms).await
}

async fn kill_router(method: Method, path: &'static str, query: &str, retrier_deadline_ms: u64) -> Crashed {
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
    let retrier_opts = AppOptions { deadline_ms: retrier_deadline_ms, ..opts };
    let retrier = RouterProcess::spawn(&db.url, &retrier_opts, &prefix).await;
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
        let mut deadline =
            Deadline::after(Duration::from_secs(40), "the key stayed in flight").every(Duration::from_millis(100));
        loop {
            let resp = route_at(&self.client, &self.retrier.address, &self.agent, &self.key, &self.body).await;
            let status = resp.status().as_u16();
            if status != 409 {
                return (status, resp.json().await.unwrap());
            }
            deadline.next_poll().await.unwrap();
        }
    }

    /// A replay of the key answers `env` again, marked as a replay.
    async fn assert_replay_is(&self, env: &Value) {
        let replay = route_at(&self.client, &self.retrier.address, &self.agent, &self.key, &self.body).await;
        assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
        assert_eq!(&replay.json::<Value>().await.unwrap(), env);
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
        let text =
            self.client.get(format!("{}/metrics", self.retrier.address)).bearer_auth(OPERATOR).send().await.unwrap();
        let text = text.text().await.unwrap();
        let name = format!("x402_router_recoveries_total{{outcome=\"{outcome}\"}}");
        text.lines().find(|l| l.starts_with(&name)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0)
    }

    async fn paid_not_served(&self) -> Vec<Value> {
        self.audit_payments("paid_not_served").await
    }

    async fn audit_payments(&self, status: &str) -> Vec<Value> {
        let audit =
            get_json(&self.client, &format!("{}/audit/payments?status={status}", self.retrier.address), OPERATOR).await;
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
    crashed.assert_replay_is(&env).await;
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
           AND sealed IS NOT NULL AND request_headers IS NULL AND request_body IS NULL AND header_value IS NULL \
           AND convert_from(advertised_extensions, 'UTF8')::jsonb ? 'payment-identifier' \
           AND context->'extensions'->'payment-identifier'->'info'->>'id' LIKE 'pay_%'"
    );
    assert_eq!(count(db, &sql).await, 1);
    // The request as sent is sealed (docs/DESIGN.md §10): it opens to what was sent.
    let opened = opened_intent(db, &crashed.key).await;
    let sent = opened.request().unwrap();
    assert_eq!((sent.method.as_str(), sent.url.as_str(), sent.body.as_deref()), ("GET", url.as_str(), None));
    assert!(opened.exact().unwrap().advertised_extensions.is_some());
}

// ---- Recovery in `x402-router reconcile` -------------------------------------------------

/// Runs `x402-router reconcile` with recovery (the router's key for receipts, loopback
/// upstreams allowed, no grace period) and returns its JSON line of counts.
fn reconcile_with_recovery(db: &TestDb, chain: &Devnet) -> Value {
    let out = router_command()
        .args(["reconcile", "--older-than-secs", "0", "--upstream-allow-private", "true"])
        .env("DATABASE_URL", &db.url)
        .env("X402_RPC_URLS", format!("eip155:84532={}", chain.rpc_url))
        .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "reconcile failed: {stdout} {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&stdout).unwrap()
}

/// A paid call cut off by the route deadline (1.5 s) while the upstream, which settled at
/// once, is still handling it: the router sees the nonce used on-chain and the key's final
/// answer is `settled_response_lost` (no takeover, so no recovery was tried).
async fn cut_by_the_route_deadline(path: &'static str, query: &str) -> (Crashed, (u16, Value)) {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "recovery").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions {
        deadline_ms: 1500,
        extra: [chain.router_extra(), vec![("operator-token".into(), OPERATOR.into())]].concat(),
        ..Default::default()
    };
    let retrier = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let router0 = chain.balance(ROUTER_ADDRESS).await;
    let client = reqwest::Client::new();
    let key = new_key();
    let body = json!({"url": chain.url(&format!("{path}{query}")), "max_amount": "10000"});
    let resp = route_at(&client, &retrier.address, &agent, &key, &body).await;
    let first = (resp.status().as_u16(), resp.json::<Value>().await.unwrap());
    assert_eq!(first.1["code"], "settled_response_lost", "{}", first.1);
    let sql = "SELECT count(*) AS n FROM payments WHERE status = 'settled_response_lost' AND recovery IS NULL";
    assert_eq!(count(&db, sql).await, 1);
    (Crashed { chain, db, agent, key, body, retrier, client, router0, path, prefix }, first)
}

impl Crashed {
    /// `GET /payments?idempotency_key=` as the agent.
    async fn own_payment(&self) -> Value {
        let url = format!("{}/payments?idempotency_key={}", self.retrier.address, self.key);
        self.client.get(url).bearer_auth(&self.agent.key).send().await.unwrap().json().await.unwrap()
    }

    /// The key's answer now: it must still be its first final answer.
    async fn replay(&self) -> (u16, Value) {
        let resp = route_at(&self.client, &self.retrier.address, &self.agent, &self.key, &self.body).await;
        assert_eq!(resp.headers().get("x-idempotent-replay").unwrap(), "true");
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    /// Checks the recovered answer `reconcile` recorded: the original, for the transaction
    /// that used the nonce, with a receipt that says recovered; paid once, the key's own
    /// answer unchanged; a second run does nothing.
    async fn assert_recovered_by_reconcile(&self, first: &(u16, Value), handled_for: u64) {
        let stats = self.stats().await;
        let tx = stats["last_transaction"].as_str().unwrap().to_owned();
        let p = self.own_payment().await;
        assert_eq!(p["status"], "settled", "{p}");
        assert_eq!(p["recovery"], "recovered", "{p}");
        assert_eq!(p["tx_hash"], tx, "{p}");
        let got = &p["recovered_answer"];
        assert_eq!(got["kind"], "recovered", "{p}");
        assert_eq!(got["http_status"], 200, "{p}");
        let answer = &got["answer"];
        assert_eq!(answer["status"], 200, "{p}");
        assert_eq!(answer["body"]["handled_for_seconds"], handled_for, "the original answer: {p}");
        assert_eq!(answer["payment"]["status"], "settled");
        assert_eq!(answer["payment"]["recovery"], "recovered");
        assert_eq!(answer["payment"]["tx_hash"], tx);
        assert_eq!(answer["receipt_id"], got["receipt_id"]);
        // Its receipt is the agent's, signed, and says recovered.
        let receipt: Value = self
            .client
            .get(format!("{}/receipts/{}", self.retrier.address, got["receipt_id"].as_str().unwrap()))
            .bearer_auth(&self.agent.key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(receipt["outcome"], "completed", "{receipt}");
        assert_eq!(receipt["upstream_status"], 200, "{receipt}");
        assert_eq!(receipt["payment"]["recovery"], "recovered", "{receipt}");
        assert_eq!(receipt["signer"], ROUTER_ADDRESS.to_checksum(None), "{receipt}");
        // The upstream's handler ran once; one identical re-send got its cached answer.
        assert_eq!(stats["pid_completed"], 1, "{stats}");
        self.assert_paid_once().await;
        // Replays of the key stay byte-identical to its first final answer.
        assert_eq!(&self.replay().await, first);
        // Operators: served now (not in paid-not-served), and the ledger says what was tried.
        assert!(self.paid_not_served().await.is_empty());
        let settled = self.audit_payments("settled").await;
        assert_eq!(settled.len(), 1, "{settled:?}");
        let attempts = settled[0]["recovery"]["attempts"].as_array().unwrap().clone();
        assert!(attempts.iter().any(|a| a["action"] == "round" && a["by"] == "reconcile"), "{attempts:?}");
        assert_eq!(attempts.last().unwrap()["result"], "recovered", "{attempts:?}");

        // Never twice: a second run finds nothing to do and sends nothing.
        let before = self.stats().await["payment_attempts"].clone();
        let again = reconcile_with_recovery(&self.db, &self.chain);
        assert_eq!((again["recovered"].as_u64(), again["resends"].as_u64()), (Some(0), Some(0)), "{again}");
        assert_eq!(self.stats().await["payment_attempts"], before);
        assert_eq!(count(&self.db, "SELECT count(*) AS n FROM recovered_answers").await, 1);
        assert_eq!(
            count(&self.db, "SELECT count(*) AS n FROM receipts").await,
            2,
            "the first answer's and the recovered one's"
        );
        assert_eq!(self.own_payment().await, p);
    }

    /// `x402_router_payments_recovery{outcome}` of a freshly started router (the ledger
    /// gauges are read at start).
    async fn recovery_gauge(&self, outcome: &str) -> i64 {
        let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
        let extra = [self.chain.router_extra(), vec![("operator-token".into(), OPERATOR.into())]].concat();
        let router = RouterProcess::spawn(&self.db.url, &AppOptions { extra, ..Default::default() }, &prefix).await;
        let name = format!("x402_router_payments_recovery{{outcome=\"{outcome}\"}}");
        let mut value = None;
        wait_until("the ledger gauges", Duration::from_secs(10), async || {
            let text = self
                .client
                .get(format!("{}/metrics", router.address))
                .bearer_auth(OPERATOR)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            value = text.lines().find(|l| l.starts_with(&name)).and_then(|l| l.rsplit(' ').next()?.parse().ok());
            value.is_some()
        })
        .await;
        value.unwrap_or(-1)
    }
}

#[actix_web::test]
async fn reconcile_recovers_an_answer_cut_off_by_the_route_deadline_once() {
    // The upstream settles, then handles for 8 s; the router's deadline cuts the call first.
    let (cut, first) = cut_by_the_route_deadline("/v2/pid", "?seconds=8").await;
    wait_until("the upstream to finish the original request", Duration::from_secs(30), async || {
        cut.stats().await["pid_completed"] == 1
    })
    .await;

    let report = reconcile_with_recovery(&cut.db, &cut.chain);

    assert_eq!(report["recovered"], 1, "{report}");
    assert_eq!(report["resends"], 1, "{report}");
    let stats = cut.stats().await;
    assert_eq!(stats["pid_replays"], 1, "{stats}");
    assert_eq!(stats["payment_attempts"], 2, "the original and one identical re-send: {stats}");
    cut.assert_recovered_by_reconcile(&first, 8).await;
    assert_eq!(cut.recovery_gauge("recovered").await, 1);
}

#[actix_web::test]
async fn a_takeover_cut_short_by_503s_is_recovered_by_a_later_reconcile() {
    // The takeover (route deadline 2.5 s) only sees 503 "in flight" from the upstream, which
    // handles the original for 10 s: settled, response lost, worth another try.
    let crashed = kill_router_while_the_upstream_handles_with("/v2/pid", "?seconds=10", 2500).await;
    let first = crashed.retry_until_final().await;
    assert_eq!(first.0, 502, "{}", first.1);
    assert_eq!(first.1["code"], "settled_response_lost");
    assert_eq!(first.1["payment"]["recovery"], "lost");
    assert!(crashed.stats().await["pid_in_flight"].as_u64().unwrap() >= 1);
    wait_until("the upstream to finish the original request", Duration::from_secs(30), async || {
        crashed.stats().await["pid_completed"] == 1
    })
    .await;

    let report = reconcile_with_recovery(&crashed.db, &crashed.chain);

    assert_eq!(report["recovered"], 1, "{report}");
    assert_eq!(report["resends"], 1, "{report}");
    let p = crashed.own_payment().await;
    // The takeover's 503s are kept in the record, before reconcile's round.
    let settled = crashed.audit_payments("settled").await;
    let attempts = settled[0]["recovery"]["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts[0]["status"], 503, "{attempts:?}");
    assert_eq!(p["recovered_answer"]["answer"]["body"]["handled_for_seconds"], 10, "{p}");
    crashed.assert_recovered_by_reconcile(&first, 10).await;
}

#[actix_web::test]
async fn reconcile_re_sends_nothing_to_a_plain_upstream_and_says_what_it_tried() {
    // /v2/slow-settle advertises no payment-identifier.
    let (cut, first) = cut_by_the_route_deadline("/v2/slow-settle", "?seconds=8").await;

    let report = reconcile_with_recovery(&cut.db, &cut.chain);

    assert_eq!((report["recovered"].as_u64(), report["recovery_lost"].as_u64()), (Some(0), Some(1)), "{report}");
    assert_eq!(report["resends"], 0, "{report}");
    let p = cut.own_payment().await;
    assert_eq!(p["status"], "settled_response_lost", "{p}");
    assert_eq!(p["recovery"], "lost", "{p}");
    assert_eq!(p["recovered_answer"], Value::Null, "{p}");
    // The paid-not-served view shows what recovery tried: nothing could be re-sent.
    let listed = cut.paid_not_served().await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let attempts = listed[0]["recovery"]["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts[0]["action"], "round", "{attempts:?}");
    assert_eq!(attempts[1]["action"], "none", "{attempts:?}");
    assert_eq!(listed[0]["recovery"]["outcome"], "lost");

    // A second run: nothing tried again, nothing sent, the record unchanged.
    let again = reconcile_with_recovery(&cut.db, &cut.chain);
    assert_eq!((again["recovery_lost"].as_u64(), again["resends"].as_u64()), (Some(0), Some(0)), "{again}");
    assert_eq!(cut.paid_not_served().await, listed);
    assert_eq!(cut.stats().await["payment_attempts"], 1, "nothing ever re-sent");
    assert_eq!(cut.replay().await, first);
    cut.assert_paid_once().await;
    assert_eq!(cut.recovery_gauge("lost").await, 1);
}

#[actix_web::test]
async fn reconcile_stops_at_a_409_and_never_sends_again() {
    let (cut, first) = cut_by_the_route_deadline("/v2/pid", "?seconds=3&conflict=true").await;
    wait_until("the upstream to finish the original request", Duration::from_secs(30), async || {
        cut.stats().await["pid_completed"] == 1
    })
    .await;

    let report = reconcile_with_recovery(&cut.db, &cut.chain);
    let again = reconcile_with_recovery(&cut.db, &cut.chain);

    assert_eq!((report["recovery_lost"].as_u64(), report["resends"].as_u64()), (Some(1), Some(1)), "{report}");
    assert_eq!((again["recovery_lost"].as_u64(), again["resends"].as_u64()), (Some(0), Some(0)), "{again}");
    let stats = cut.stats().await;
    assert_eq!(stats["pid_conflicts"], 1, "{stats}");
    assert_eq!(stats["payment_attempts"], 2, "the original and one re-send, nothing after the 409: {stats}");
    let listed = cut.paid_not_served().await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let attempts = listed[0]["recovery"]["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts.last().unwrap()["status"], 409, "{attempts:?}");
    assert_eq!(cut.own_payment().await["status"], "settled_response_lost");
    assert_eq!(cut.replay().await, first);
    cut.assert_paid_once().await;
}

#[actix_web::test]
async fn a_router_with_recovery_disabled_re_sends_nothing_at_takeover() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "recovery").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions {
        abandon_ms: 1500,
        heartbeat_ms: 300,
        deadline_ms: 30_000,
        extra: [chain.router_extra(), vec![("recover-lost-answers".into(), "false".into())]].concat(),
        ..Default::default()
    };
    let mut a = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let b = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let client = reqwest::Client::new();
    let key = new_key();
    let body = json!({"url": chain.url("/v2/pid?seconds=1"), "max_amount": "10000"});
    let call = spawn_route(&client, &a.address, &agent, &key, &body);
    wait_until("the upstream to settle", Duration::from_secs(20), async || chain.stats().await["/v2/pid"]["paid"] == 1)
        .await;
    a.kill9().await;
    assert!(call.await.unwrap().is_err());
    wait_until("the upstream to finish", Duration::from_secs(20), async || {
        chain.stats().await["/v2/pid"]["pid_completed"] == 1
    })
    .await;
    let mut deadline =
        Deadline::after(Duration::from_secs(40), "the key stayed in flight").every(Duration::from_millis(100));
    let (status, err) = loop {
        let resp = route_at(&client, &b.address, &agent, &key, &body).await;
        if resp.status() != 409 {
            break (resp.status().as_u16(), resp.json::<Value>().await.unwrap());
        }
        deadline.next_poll().await.unwrap();
    };
    assert_eq!(status, 502, "{err}");
    assert_eq!(err["code"], "settled_response_lost");
    assert_eq!(err["payment"]["recovery"], "lost");
    assert_eq!(chain.stats().await["/v2/pid"]["payment_attempts"], 1, "nothing re-sent");
}

#[actix_web::test]
async fn two_reconciles_at_once_re_send_and_record_a_lost_answer_once() {
    let (cut, first) = cut_by_the_route_deadline("/v2/pid", "?seconds=4").await;
    wait_until("the upstream to finish the original request", Duration::from_secs(30), async || {
        cut.stats().await["pid_completed"] == 1
    })
    .await;

    let spawn = || {
        router_command()
            .args(["reconcile", "--older-than-secs", "0", "--upstream-allow-private", "true"])
            .env("DATABASE_URL", &cut.db.url)
            .env("X402_RPC_URLS", format!("eip155:84532={}", cut.chain.rpc_url))
            .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let reports: Vec<Value> =
        [a, b].into_iter().map(|c| serde_json::from_slice(&c.wait_with_output().unwrap().stdout).unwrap()).collect();

    let sum = |field: &str| reports.iter().map(|r| r[field].as_u64().unwrap()).sum::<u64>();
    assert_eq!((sum("recovered"), sum("resends")), (1, 1), "{reports:?}");
    assert_eq!(cut.stats().await["payment_attempts"], 2, "one re-send in all");
    cut.assert_recovered_by_reconcile(&first, 4).await;
}

#[actix_web::test]
async fn reconcile_leaves_a_key_in_flight_to_its_takeover() {
    // Router A dies while the upstream handles; nobody has retried yet: the key is in flight
    // (abandoned). Reconcile marks the payment settled_response_lost but must not recover it
    // beside a takeover that may start at any moment; the takeover recovers it.
    let crashed = kill_router_while_the_upstream_handles("/v2/pid", "?seconds=1").await;
    wait_until("the upstream to finish the original request", Duration::from_secs(20), async || {
        crashed.stats().await["pid_completed"] == 1
    })
    .await;
    wait_until("the key to be abandoned", Duration::from_secs(10), async || {
        let sql = "SELECT count(*) AS n FROM idempotency_keys \
                    WHERE status = 'in_flight' AND created_at < now() - interval '1600 milliseconds'";
        count(&crashed.db, sql).await == 1
    })
    .await;
    let out = router_command()
        .args(["reconcile", "--older-than-secs", "0", "--upstream-allow-private", "true", "--abandon-after-ms", "1500"])
        .env("DATABASE_URL", &crashed.db.url)
        .env("X402_RPC_URLS", format!("eip155:84532={}", crashed.chain.rpc_url))
        .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();

    assert_eq!(report["settled_response_lost"], 1, "{report}");
    assert_eq!((report["recovered"].as_u64(), report["resends"].as_u64()), (Some(0), Some(0)), "{report}");
    assert_eq!(crashed.stats().await["payment_attempts"], 1);
    let (status, env) = crashed.retry_until_final().await;
    assert_eq!(status, 200, "{env}");
    assert_eq!(env["payment"]["recovery"], "recovered");
    crashed.assert_paid_once().await;
    assert_eq!(count(&crashed.db, "SELECT count(*) AS n FROM recovered_answers").await, 0, "the key's own answer");
}

#[actix_web::test]
async fn a_paid_answer_lost_to_the_upstream_timeout_is_recovered_within_the_same_call() {
    // The upstream settles and handles for 3 s; the router gives each upstream exchange
    // 1.5 s (its route deadline is far): the paid answer is lost in transit, the chain shows
    // the nonce used, and the same call re-sends the identical payment until the upstream's
    // cache has the original answer.
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "recovery").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions { upstream_timeout_ms: 1500, extra: chain.router_extra(), ..Default::default() };
    let router = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let router0 = chain.balance(ROUTER_ADDRESS).await;
    let client = reqwest::Client::new();
    let body = json!({"url": chain.url("/v2/pid?seconds=3"), "max_amount": "10000"});

    let resp = route_at(&client, &router.address, &agent, &new_key(), &body).await;

    let status = resp.status().as_u16();
    let env: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{env}");
    assert_eq!(env["body"]["handled_for_seconds"], 3, "the original answer: {env}");
    assert_eq!(env["payment"]["status"], "settled");
    assert_eq!(env["payment"]["recovery"], "recovered");
    let stats = chain.stats().await["/v2/pid"].clone();
    assert_eq!(stats["pid_completed"], 1, "the handler ran once: {stats}");
    assert_eq!(stats["paid"], 1, "{stats}");
    assert!(stats["pid_replays"].as_u64().unwrap() == 1, "{stats}");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - alloy::primitives::U256::from(PRICE));
    assert_eq!(env["payment"]["tx_hash"], stats["last_transaction"]);
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
    crashed.assert_replay_is(&env).await;
    assert_eq!(crashed.stats().await["siwx_sign_ins"], 1);
}

/// A pause means no signature leaves (issue 38, item 3): a takeover that would re-access a
/// lost answer by signing in signs nothing while paused and stays retryable; resumed, it
/// re-accesses once.
#[actix_web::test]
async fn a_pause_stops_the_sign_in_of_a_takeover_and_resuming_re_accesses_once() {
    let crashed = kill_router_while_the_upstream_handles("/v2/siwx", "?seconds=2").await;
    wait_until("the upstream to finish the paid handler", Duration::from_secs(20), async || {
        crashed.stats().await["siwx_handled"] == 1
    })
    .await;
    let admin = |method: reqwest::Method| {
        crashed.client.request(method, format!("{}/admin/pause", crashed.retrier.address)).bearer_auth(OPERATOR)
    };
    assert_eq!(admin(reqwest::Method::POST).json(&json!({})).send().await.unwrap().status(), 200);
    let (status, env) = crashed.retry_until_final().await;
    assert_eq!((status, &env["code"]), (503, &json!("payments_paused")), "{env}");
    assert_eq!(crashed.stats().await["siwx_sign_ins"], 0, "no sign-in while paused");
    assert_eq!(admin(reqwest::Method::DELETE).send().await.unwrap().status(), 200);
    let (status, env) = crashed.retry_until_final().await;
    assert_eq!(status, 200, "{env}");
    assert_eq!(env["payment"]["recovery"], "reaccessed");
    assert_eq!(crashed.stats().await["siwx_sign_ins"], 1);
    crashed.assert_paid_once().await;
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

/// One upstream policy everywhere (issue 22, item 5): `reconcile`'s recovery builds its
/// upstream client with the same constructor and settings as `serve`, so an address that
/// `serve` refuses (here loopback, with `UPSTREAM_ALLOW_PRIVATE=false`) is never re-sent to by
/// `reconcile` either: nothing leaves, and the refusal is recorded, final. (With the private
/// address allowed, the same run re-sends and recovers: see
/// `reconcile_recovers_an_answer_cut_off_by_the_route_deadline_once`.)
#[actix_web::test]
async fn reconcile_refuses_a_private_address_that_serve_refuses() {
    let (cut, first) = cut_by_the_route_deadline("/v2/pid", "?seconds=8").await;
    wait_until("the upstream to finish the original request", Duration::from_secs(30), async || {
        cut.stats().await["pid_completed"] == 1
    })
    .await;
    let attempts_before = cut.stats().await["payment_attempts"].clone();

    // `serve` with the private address refused: 400, nothing sent.
    let strict = AppOptions { allow_private: false, extra: cut.chain.router_extra(), ..Default::default() };
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let serve = RouterProcess::spawn(&cut.db.url, &strict, &prefix).await;
    let refused = route_at(&cut.client, &serve.address, &cut.agent, &new_key(), &cut.body).await;
    assert_eq!(refused.status(), 400, "serve refuses the private upstream");

    // `reconcile` with the same setting: the lost answer is not re-sent, and that is final.
    let out = router_command()
        .args(["reconcile", "--older-than-secs", "0", "--upstream-allow-private", "false"])
        .env("DATABASE_URL", &cut.db.url)
        .env("X402_RPC_URLS", format!("eip155:84532={}", cut.chain.rpc_url))
        .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["recovered"].as_u64(), report["recovery_lost"].as_u64()), (Some(0), Some(1)), "{report}");
    assert_eq!(report["resends"], 0, "{report}");
    assert_eq!(cut.stats().await["payment_attempts"], attempts_before, "nothing reached the private address");
    let listed = cut.paid_not_served().await;
    let attempts = listed[0]["recovery"]["attempts"].as_array().unwrap().clone();
    assert!(
        attempts.iter().any(|a| a["why"].as_str().is_some_and(|w| w.contains("refused by the upstream policy"))),
        "{attempts:?}"
    );
    // Final: a later run, even one that would allow it, does not try again.
    let again = reconcile_with_recovery(&cut.db, &cut.chain);
    assert_eq!(again["resends"], 0, "{again}");
    assert_eq!(cut.stats().await["payment_attempts"], attempts_before);
    assert_eq!(cut.replay().await, first);
    cut.assert_paid_once().await;
}
