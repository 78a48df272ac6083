//! `settlement_pending` (issue 15): the upstream broadcast the transfer and answered 402 with
//! a `PAYMENT-RESPONSE` instead of its answer. Never a refusal: the router watches the chain
//! until the route deadline, records what the chain proves, never signs a second nonce, and
//! leaves what it could not decide to `reconcile`. Real anvil; money counted on-chain.

use std::time::{Duration, Instant};
use x402_router_testkit::Deadline;
use x402_router_testkit::wait::let_time_pass;

use alloy::primitives::U256;
use serde_json::{Value, json};

use crate::helpers::*;

async fn paid_app(chain: &Devnet, deadline_ms: u64) -> TestApp {
    spawn_app_with(AppOptions { extra: chain.router_extra(), deadline_ms, ..Default::default() }).await
}

/// The ledger row of the only payment: (status, tx_hash, error).
async fn the_payment(app: &TestApp) -> (String, Option<String>, Option<String>) {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        tx_hash: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        error: Option<String>,
    }
    use diesel_async::RunQueryDsl;
    let rows: Vec<Row> =
        diesel::sql_query("SELECT status, tx_hash, error FROM payments").load(&mut app.db.conn().await).await.unwrap();
    assert_eq!(rows.len(), 1, "exactly one intent");
    let r = rows.into_iter().next().unwrap();
    (r.status, r.tx_hash, r.error)
}

async fn stat(chain: &Devnet, route: &str, counter: &str) -> Value {
    chain.stats().await[route][counter].clone()
}

/// Polls the upstream's counter until it reaches `n` (at most 20 s).
async fn until_counted(chain: &Devnet, route: &str, counter: &str, n: u64) {
    let mut deadline = Deadline::after(Duration::from_secs(20), "the condition").every(Duration::from_millis(20));
    while stat(chain, route, counter).await.as_u64().unwrap_or(0) < n {
        if deadline.next_poll().await.is_err() {
            panic!("{route} never counted {counter} = {n}");
        }
    }
}

async fn spent_and_reserved(app: &TestApp) -> (String, String) {
    let spend = x402_router::payments::store::agent_spend(&mut app.db.conn().await, app.agent.id, false)
        .await
        .unwrap()
        .unwrap();
    (spend.settled_24h, spend.reserved_24h)
}

/// Mined at once (anvil's automine): the router proves the transfer from the chain, records
/// the call as paid, not served, and a retry of the key moves nothing and signs nothing.
#[actix_web::test]
async fn a_pending_settlement_that_was_mined_is_paid_once_and_a_retry_moves_nothing() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain, 50_000).await;
    let before = chain.balance(PAY_TO).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/pending"), "max_amount": "50000"});

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["code"], "settled_response_lost", "{err}");
    assert_eq!(err["errorReason"], "settlement_pending");
    assert_eq!(err["status"], 402, "{err}");
    let broadcast = stat(&chain, "/v2/pending", "last_transaction").await;
    let p = &err["payment"];
    assert_eq!(p["status"], "settled_response_lost");
    assert_eq!(p["tx_hash"], broadcast, "the proven transaction is the one the upstream broadcast");
    assert_eq!(p["claimed_tx_hash"], broadcast);
    let nonce = router_nonce(app.agent.id, &key, &body);
    assert!(chain.authorization_used(ROUTER_ADDRESS, nonce).await);
    assert_eq!(chain.balance(PAY_TO).await - before, U256::from(PRICE));
    let (status, tx_hash, _) = the_payment(&app).await;
    assert_eq!((status.as_str(), tx_hash.as_deref()), ("settled_response_lost", broadcast.as_str()));
    assert_eq!(spent_and_reserved(&app).await, (PRICE.to_string(), "0".to_owned()));

    // The retry replays; the upstream sees no second payment, the chain no second transfer.
    let replay = app.route(&key, &body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(replay.json::<Value>().await.unwrap(), err);
    assert_eq!(stat(&chain, "/v2/pending", "payment_attempts").await, 1);
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 1);
    assert_eq!(chain.balance(PAY_TO).await - before, U256::from(PRICE));
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 1);
}

/// Broadcast but not mined when the upstream answers: the router keeps watching the
/// authorization and records the transfer once a block carries it, within the deadline.
#[actix_web::test]
async fn a_pending_settlement_mined_later_within_the_deadline_is_confirmed_from_the_chain() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain, 50_000).await;
    chain.rpc("evm_setAutomine", json!([false])).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/pending"), "max_amount": "50000"});
    let call = spawn_route(&app.client, &app.address, &app.agent, &key, &body);

    until_counted(&chain, "/v2/pending", "pending", 1).await;
    let nonce = router_nonce(app.agent.id, &key, &body);
    assert!(!chain.authorization_used(ROUTER_ADDRESS, nonce).await, "broadcast, not mined");
    // lets time pass: shows the absence of an event (the router giving up); nothing signals it.
    let_time_pass(Duration::from_millis(500)).await;
    assert!(!call.is_finished(), "the router waits for the chain, it does not give up on a pending settlement");
    chain.rpc("evm_mine", json!([])).await;

    let resp = call.await.unwrap().unwrap();
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["code"], "settled_response_lost", "{err}");
    assert_eq!(err["payment"]["tx_hash"], stat(&chain, "/v2/pending", "last_transaction").await);
    chain.rpc("evm_setAutomine", json!([true])).await;
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 1);
    let replay = app.route(&key, &body).await;
    assert_eq!(replay.json::<Value>().await.unwrap(), err);
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 1);
}

/// Not mined by the route deadline: `unknown` with the claimed hash, the budget reserved;
/// once a block carries it, `reconcile` records it as paid, not served. Still one transfer.
#[actix_web::test]
async fn a_pending_settlement_not_mined_by_the_deadline_is_unknown_until_reconcile_reads_the_chain() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain, 4_000).await;
    chain.rpc("evm_setAutomine", json!([false])).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/pending"), "max_amount": "50000"});

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["code"], "payment_unknown", "{err}");
    let broadcast = stat(&chain, "/v2/pending", "last_transaction").await;
    assert_eq!(err["payment"]["status"], "unknown");
    assert_eq!(err["payment"]["tx_hash"], Value::Null, "a claimed hash is not a proven one");
    assert_eq!(err["payment"]["claimed_tx_hash"], broadcast);
    let (status, tx_hash, error) = the_payment(&app).await;
    assert_eq!((status.as_str(), tx_hash), ("unknown", None));
    assert!(error.unwrap().contains(broadcast.as_str().unwrap()), "the claimed hash is kept for operators");
    assert_eq!(spent_and_reserved(&app).await, ("0".to_owned(), PRICE.to_string()));
    // Unused and still valid: reconcile leaves it.
    assert_eq!(reconcile_now(&app.db, &chain)["pending"], 1);

    chain.rpc("evm_mine", json!([])).await;
    chain.rpc("evm_setAutomine", json!([true])).await;
    let report = reconcile_now(&app.db, &chain);
    assert_eq!(report["settled_response_lost"], 1, "{report}");
    assert_eq!(the_payment(&app).await.0, "settled_response_lost");
    assert_eq!(spent_and_reserved(&app).await, (PRICE.to_string(), "0".to_owned()));
    let replay = app.route(&key, &body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 1);
    assert_eq!(stat(&chain, "/v2/pending", "payment_attempts").await, 1);
}

/// A hostile upstream answers `settlement_pending` with a made-up hash, sends nothing, and
/// keeps the authorization. Nothing is called settled; the reservation holds until the chain
/// decides; when the upstream submits the authorization later, it moves money once.
#[actix_web::test]
async fn a_made_up_pending_settlement_moves_nothing_and_keeps_the_reservation_until_the_chain_decides() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain, 3_000).await;
    exec(&app.db, &format!("UPDATE agents SET daily_budget = {PRICE} WHERE id = '{}'", app.agent.id)).await;
    let before = chain.balance(PAY_TO).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/pending-lie"), "max_amount": "50000"});

    let err: Value = app.route(&key, &body).await.json().await.unwrap();
    assert_eq!(err["code"], "payment_unknown", "{err}");
    assert_eq!(err["payment"]["status"], "unknown");
    assert_eq!(err["payment"]["tx_hash"], Value::Null);
    assert_eq!(chain.balance(PAY_TO).await, before, "nothing moved");
    assert_eq!(spent_and_reserved(&app).await, ("0".to_owned(), PRICE.to_string()));
    let weather = json!({"url": chain.url("/v2/weather"), "max_amount": "50000"});
    assert_eq!(app.route(&new_key(), &weather).await.status(), 402, "the budget stays reserved");
    assert_eq!(reconcile_now(&app.db, &chain)["pending"], 1, "still valid: undecided");

    // The upstream submits what it kept: one transfer, recorded as paid, not served.
    let kept: Value = settle_kept(&chain).await;
    assert_eq!(kept["settled"], 1);
    assert_eq!(reconcile_now(&app.db, &chain)["settled_response_lost"], 1);
    assert_eq!(chain.balance(PAY_TO).await - before, U256::from(PRICE));
    assert_eq!(app.route(&key, &body).await.json::<Value>().await.unwrap(), err, "the retry replays");
    assert_eq!(stat(&chain, "/v2/pending-lie", "payment_attempts").await, 1);
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 1);
}

/// A hostile upstream names a real, mined transaction that did not use the authorization:
/// decided at once (no wait for the deadline), `rejected`, nothing moved, still reserved.
#[actix_web::test]
async fn a_pending_claim_naming_a_mined_transaction_that_moved_nothing_is_rejected_and_stays_reserved() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain, 50_000).await;
    let before = chain.balance(PAY_TO).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/pending-wrong-tx"), "max_amount": "50000"});
    let started = Instant::now();
    let err: Value = app.route(&key, &body).await.json().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(20), "decided from the receipt, not by the deadline");
    assert_eq!(err["code"], "payment_rejected", "{err}");
    assert_eq!(err["payment"]["status"], "rejected");
    assert_eq!(err["payment"]["tx_hash"], Value::Null);
    assert_eq!(err["payment"]["claimed_tx_hash"], stat(&chain, "/v2/pending-wrong-tx", "last_transaction").await);
    assert_eq!(chain.balance(PAY_TO).await, before);
    assert_eq!(spent_and_reserved(&app).await, ("0".to_owned(), PRICE.to_string()));
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 0);
}

/// An answer served beside `settlement_pending`: the router serves it and records the
/// payment once the chain shows it (not mined by the deadline: `unknown`, and reconcile
/// calls it `settled`, since the agent had the answer).
#[actix_web::test]
async fn an_answer_beside_a_pending_settlement_is_served_and_its_payment_confirmed_from_the_chain() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain, 4_000).await;
    let env: Value = app
        .route(&new_key(), &json!({"url": chain.url("/v2/pending-answered"), "max_amount": "50000"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(env["status"], 200, "{env}");
    assert_eq!(env["body"]["forecast"], "sunny");
    assert_eq!(env["payment"]["status"], "settled", "mined at once: confirmed");
    assert_eq!(env["payment"]["tx_hash"], stat(&chain, "/v2/pending-answered", "last_transaction").await);

    chain.rpc("evm_setAutomine", json!([false])).await;
    let env: Value = app
        .route(&new_key(), &json!({"url": chain.url("/v2/pending-answered"), "max_amount": "50000"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(env["status"], 200, "{env}");
    assert_eq!(env["payment"]["status"], "unknown", "not mined by the deadline: undecided, the answer served");
    chain.rpc("evm_mine", json!([])).await;
    chain.rpc("evm_setAutomine", json!([true])).await;
    assert_eq!(reconcile_now(&app.db, &chain)["settled"], 1);
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 2);
}

/// A takeover finds a recorded authorization with too little validity left to resend, but
/// not expired (it may still settle, e.g. broadcast and pending): nothing is signed until
/// its validBefore has passed unused; then the same nonce is re-signed and paid once.
#[actix_web::test]
async fn a_takeover_never_re_signs_while_the_earlier_authorization_may_still_settle() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain, 50_000).await;
    let before = chain.balance(PAY_TO).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    crash_after_signing(&app, &chain, &key, &body, 8).await;

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payment_network_unavailable");
    assert_eq!(count(&app.db, "SELECT attempts::bigint AS n FROM payments").await, 1, "nothing re-signed");
    assert_eq!(stat(&chain, "/v2/weather", "payment_attempts").await, 0, "nothing sent");

    // Once validBefore has passed (and the key's owner is abandoned), a retry re-signs.
    let valid_before = count(&app.db, "SELECT valid_before AS n FROM payments").await;
    let mut wait_until = Deadline::after(Duration::from_secs(30), "the condition").every(Duration::from_millis(200));
    while x402_router::clock::now_unix_i64() <= valid_before {
        wait_until.next_poll().await.unwrap();
    }
    exec(
        &app.db,
        &format!("UPDATE idempotency_keys SET created_at = now() - interval '300 seconds' WHERE key = '{key}'"),
    )
    .await;
    let env: Value = app.route(&key, &body).await.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(env["payment"]["nonce"], router_nonce(app.agent.id, &key, &body).to_string());
    assert_eq!(count(&app.db, "SELECT attempts::bigint AS n FROM payments").await, 2, "re-signed once");
    assert_eq!(chain.balance(PAY_TO).await - before, U256::from(PRICE));
}
