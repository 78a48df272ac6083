//! Paying on Solana: the router against `x402-test-upstream serve-svm` on the local Solana chain
//! (tools/solana-chain), money counted in token balances on the chain. The attacks of the EVM
//! path, on Solana: payments the router may not make are never signed, an upstream's "failed"
//! and made-up settlements are checked on chain, a kept transaction settled later is found, a
//! takeover resends the same transaction and signs again only once the chain shows the old one
//! can never land, and an RPC endpoint of another chain is never believed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use x402_router::faults::Point;
use x402_router::startup::Hooks;
use x402_router_testkit::wait::let_time_pass;

use crate::helpers::*;

async fn solana_app(rig: &SolanaRig) -> TestApp {
    spawn_app_with(AppOptions { extra: rig.router_extra(), ..Default::default() }).await
}

fn call(rig: &SolanaRig, path: &str) -> Value {
    json!({"url": rig.url(path), "max_amount": SVM_PRICE.to_string()})
}

async fn route(app: &TestApp, key: &str, body: &Value) -> (u16, Value) {
    let resp = app.route(key, body).await;
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn ledger(app: &TestApp, sql: &str) -> i64 {
    count(&app.db, sql).await
}

/// The agent's `remaining_24h` (`GET /agents/me`).
async fn remaining(app: &TestApp) -> String {
    let me = get_json(&app.client, &format!("{}/agents/me", app.address), &app.agent.key).await;
    me["remaining"].as_str().map(str::to_owned).unwrap_or_else(|| panic!("{me}"))
}

async fn set_budget(app: &TestApp, daily: u64) {
    exec(&app.db, &format!("UPDATE agents SET daily_budget = {daily} WHERE id = '{}'", app.agent.id)).await;
}

#[actix_web::test]
async fn a_solana_call_pays_exactly_the_price_once_and_replays_move_nothing() {
    let rig = SolanaRig::start(&[]).await;
    let app = solana_app(&rig).await;
    set_budget(&app, 100_000).await;
    let (payer0, pay_to0) = rig.balances().await;
    for (n, path) in ["/svm/v2/paid", "/svm/v1/paid"].into_iter().enumerate() {
        let key = new_key();
        let body = call(&rig, path);
        let (status, env) = route(&app, &key, &body).await;
        assert_eq!(status, 200, "{path}: {env}");
        assert_eq!(env["body"], json!({"paid": true}), "{env}");
        let p = &env["payment"];
        assert_eq!(p["status"], "settled", "{env}");
        assert_eq!(p["network"], rig.chain.field("network"));
        assert_eq!(p["asset"], rig.chain.field("mint"));
        assert_eq!(p["pay_to"], rig.chain.field("pay_to"));
        assert_eq!(p["payer"], rig.chain.field("payer"));
        assert_eq!(p["amount"], SVM_PRICE.to_string());
        assert_eq!(p["x402_version"], if path.contains("/v2/") { 2 } else { 1 });
        assert_eq!(p["nonce"], router_nonce(app.agent.id, &key, &body).to_string());
        // The transaction the chain shows, carrying the router's signature.
        let tx = p["tx_hash"].as_str().unwrap();
        let found = rig
            .chain
            .rpc(
                "getTransaction",
                json!([tx, {"encoding": "json", "commitment": "confirmed", "maxSupportedTransactionVersion": 0}]),
            )
            .await
            .unwrap();
        let signed: Value = serde_json::from_str(
            &count_text(
                &app,
                &format!(
                    "SELECT signed_authorization->>'signature' AS t FROM payments WHERE idempotency_key = '{key}'"
                ),
            )
            .await,
        )
        .unwrap_or(Value::Null);
        let signatures = found["result"]["transaction"]["signatures"].as_array().unwrap();
        assert!(signatures.contains(&signed), "{found}");
        let paid = (n as u64 + 1) * SVM_PRICE;
        assert_eq!(rig.balances().await, (payer0 - paid, pay_to0 + paid));

        let replay = app.route(&key, &body).await;
        assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
        assert_eq!(replay.json::<Value>().await.unwrap(), env);
        assert_eq!(rig.balances().await, (payer0 - paid, pay_to0 + paid));
        // The receipt records the payment and verifies.
        let receipt = get_json(
            &app.client,
            &format!("{}/receipts/{}", app.address, env["receipt_id"].as_str().unwrap()),
            &app.agent.key,
        )
        .await;
        assert_eq!(receipt["payment"]["status"], "settled");
        assert!(x402_router::receipts::Receipt::verify_json(&receipt.to_string()).is_ok());
    }
    assert_eq!(rig.stats().await["settled"], 2);
    assert_eq!(remaining(&app).await, (100_000 - 2 * SVM_PRICE).to_string());
    assert_eq!(ledger(&app, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await, 2);
}

/// One text value of a query (`SELECT … AS t`), JSON-quoted.
async fn count_text(app: &TestApp, sql: &str) -> String {
    use diesel::QueryableByName;
    use diesel_async::RunQueryDsl;
    #[derive(QueryableByName)]
    struct T {
        #[diesel(sql_type = diesel::sql_types::Text)]
        t: String,
    }
    let mut conn = app.db.conn().await;
    let row: T = diesel::sql_query(sql).get_result(&mut conn).await.unwrap();
    Value::String(row.t).to_string()
}

#[actix_web::test]
async fn a_solana_payment_the_router_may_not_make_is_never_signed() {
    let rig = SolanaRig::start(&[]).await;
    let app = solana_app(&rig).await;
    let before = rig.balances().await;
    let payer = rig.chain.field("payer").to_owned();
    let pay_to = rig.chain.field("pay_to").to_owned();
    let mut flipped = pay_to.clone();
    // The same letters in another case: another account (base58 is case-sensitive).
    let i = flipped.find(|c: char| c.is_ascii_alphabetic() && c != 'l' && c != 'L' && c != 'o' && c != 'i').unwrap();
    let c = flipped.as_bytes()[i] as char;
    let swapped = if c.is_ascii_lowercase() { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() };
    flipped.replace_range(i..=i, &swapped.to_string());
    let cases: Vec<(&str, Value, Option<String>, &str)> = vec![
        (
            "over max_amount",
            json!({"url": rig.url("/svm/v2/paid"), "max_amount": "9999"}),
            None,
            "payment_over_max_amount",
        ),
        (
            "over the budget",
            call(&rig, "/svm/v2/paid"),
            Some("UPDATE agents SET daily_budget = 5000".into()),
            "payment_over_budget",
        ),
        (
            "fee payer is the router",
            call(&rig, &format!("/svm/v2/paid?fee_payer={payer}")),
            None,
            "payment_unsupported",
        ),
        (
            "payTo in another case",
            call(&rig, "/svm/v2/paid"),
            Some(format!("UPDATE agents SET allowed_pay_to = ARRAY['{flipped}']")),
            "payment_not_allowed",
        ),
        (
            "payTo blocked for the agent",
            call(&rig, "/svm/v2/paid"),
            Some(format!("UPDATE agents SET blocked_pay_to = ARRAY['{pay_to}']")),
            "payment_not_allowed",
        ),
        (
            "payTo blocked wallet-wide",
            call(&rig, "/svm/v2/paid"),
            Some(format!("UPDATE router_settings SET blocked_pay_to = ARRAY['{pay_to}']")),
            "payment_not_allowed",
        ),
    ];
    for (what, body, setup, code) in cases {
        exec(&app.db, "UPDATE agents SET daily_budget = NULL, allowed_pay_to = NULL, blocked_pay_to = NULL").await;
        exec(&app.db, "UPDATE router_settings SET blocked_pay_to = NULL").await;
        if let Some(sql) = setup {
            exec(&app.db, &sql).await;
        }
        let (status, env) = route(&app, &new_key(), &body).await;
        assert_eq!((status, env["code"].as_str()), (402, Some(code)), "{what}: {env}");
    }
    assert_eq!(ledger(&app, "SELECT count(*) AS n FROM payments").await, 0);
    assert_eq!(rig.balances().await, before);
    assert_eq!(rig.stats().await, json!({"settled": 0, "kept": 0, "refused": 0}));
    // The exact payTo on the allowlist is paid; a block of another spelling blocks another account.
    exec(&app.db, "UPDATE router_settings SET blocked_pay_to = NULL").await;
    let (allow, block) = (format!("ARRAY['{pay_to}']"), format!("ARRAY['{flipped}']"));
    exec(&app.db, &format!("UPDATE agents SET allowed_pay_to = {allow}, blocked_pay_to = {block}")).await;
    let (status, env) = route(&app, &new_key(), &call(&rig, "/svm/v2/paid")).await;
    assert_eq!((status, &env["payment"]["status"]), (200, &json!("settled")), "{env}");
}

#[actix_web::test]
async fn an_upstream_that_says_failed_after_settling_is_caught_on_chain() {
    let rig = SolanaRig::start(&[]).await;
    let app = solana_app(&rig).await;
    let (payer0, pay_to0) = rig.balances().await;
    let key = new_key();
    let body = call(&rig, "/svm/v2/lie-failed");
    let (status, env) = route(&app, &key, &body).await;
    assert_eq!((status, env["code"].as_str()), (502, Some("settled_response_lost")), "{env}");
    assert_eq!(env["payment"]["status"], "settled_response_lost");
    assert!(env["payment"]["tx_hash"].is_string(), "{env}");
    assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE));
    // A retry is the recorded answer; nothing is paid again.
    let (again, replayed) = route(&app, &key, &body).await;
    assert_eq!((again, &replayed), (status, &env));
    assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE));
    assert_eq!(ledger(&app, "SELECT count(*) AS n FROM payments WHERE status = 'settled_response_lost'").await, 1);
}

#[actix_web::test]
async fn a_made_up_settlement_stays_reserved_until_the_chain_shows_the_transaction_can_never_land() {
    let rig = SolanaRig::start(&["--slot-ms", "0"]).await;
    let app = solana_app(&rig).await;
    set_budget(&app, 100_000).await;
    let before = rig.balances().await;
    let (status, env) = route(&app, &new_key(), &call(&rig, "/svm/v2/claim-unsettled")).await;
    assert_eq!(status, 200, "{env}");
    assert_eq!(env["payment"]["status"], "unconfirmed", "{env}");
    assert_eq!(env["payment"]["tx_hash"], Value::Null, "a made-up id is never recorded: {env}");
    assert_eq!(rig.balances().await, before);
    assert_eq!(remaining(&app).await, (100_000 - SVM_PRICE).to_string(), "reserved");
    // The transaction could still land: reconcile decides nothing.
    let report = rig.reconcile(&app.db);
    assert_eq!((report["expired"].as_u64(), report["pending"].as_u64()), (Some(0), Some(1)), "{report}");
    // Past its blockhash's last valid height, finalized: it can never land.
    rig.chain.advance(200).await.unwrap();
    let report = rig.reconcile(&app.db);
    assert_eq!(report["expired"], 1, "{report}");
    assert_eq!(remaining(&app).await, "100000", "released");
    assert_eq!(rig.balances().await, before);
}

#[actix_web::test]
async fn a_kept_transaction_settled_later_is_found_by_reconcile_and_lands_once() {
    let rig = SolanaRig::start(&[]).await;
    let app = solana_app(&rig).await;
    set_budget(&app, 100_000).await;
    let (payer0, pay_to0) = rig.balances().await;
    let (status, env) = route(&app, &new_key(), &call(&rig, "/svm/v2/keep")).await;
    assert_eq!((status, env["code"].as_str()), (502, Some("payment_rejected")), "{env}");
    assert_eq!(env["payment"]["status"], "rejected");
    assert_eq!(remaining(&app).await, (100_000 - SVM_PRICE).to_string(), "a kept transaction stays reserved");
    assert_eq!(rig.balances().await, (payer0, pay_to0));
    let kept = rig.settle_kept().await;
    assert_eq!(kept["settled"].as_array().map(Vec::len), Some(1), "{kept}");
    assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE));
    let report = rig.reconcile(&app.db);
    assert_eq!(report["settled_response_lost"], 1, "{report}");
    assert_eq!(ledger(&app, "SELECT count(*) AS n FROM payments WHERE status = 'settled_response_lost'").await, 1);
    // Submitted again, the same transaction moves nothing.
    let _ = rig.settle_kept().await;
    assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE));
    assert_eq!(remaining(&app).await, (100_000 - SVM_PRICE).to_string());
}

/// POSTs until the answer is final (not in flight, not 503).
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

/// An owner frozen once its intent is committed, before the payment leaves; another router
/// takes the call over. `expire`: the chain moves past the transaction's last valid height
/// (finalized) before the takeover.
async fn take_over_a_frozen_payment(expire: bool) {
    let rig = SolanaRig::start(if expire { &["--slot-ms", "0"] } else { &[] }).await;
    let db = Arc::new(TestDb::new().await);
    let options = |hooks| AppOptions {
        abandon_ms: 1000,
        heartbeat_ms: 200,
        extra: rig.router_extra(),
        hooks,
        ..Default::default()
    };
    let (hook, freezer) = freeze_at(Point::PaymentLeaving);
    let owner = spawn_app_on(Arc::clone(&db), options(Hooks { at: Some(hook), ..Default::default() })).await;
    let retrier = spawn_app_on(Arc::clone(&db), options(Hooks::default())).await;
    let (payer0, pay_to0) = rig.balances().await;
    let key = new_key();
    let body = call(&rig, "/svm/v2/paid");
    let first = spawn_route(&owner.client, &owner.address, &owner.agent, &key, &body);
    tokio::time::timeout(Duration::from_secs(30), freezer.reached.notified())
        .await
        .expect("the owner reached the point");
    let signature = "SELECT signed_authorization->>'signature' AS t FROM payments";
    let signed_first = count_text(&owner, signature).await;
    if expire {
        rig.chain.advance(200).await.unwrap();
    }
    let (status, env) = until_final(&retrier, &owner.agent, &key, &body).await;
    assert_eq!((status, &env["payment"]["status"]), (200, &json!("settled")), "{env}");
    let signed_last = count_text(&owner, signature).await;
    assert_eq!(signed_first == signed_last, !expire, "re-signed only after the chain showed the old one dead");
    assert_eq!(ledger(&owner, "SELECT count(*) AS n FROM payments").await, 1, "one intent per request");
    assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE));
    // The frozen owner wakes and sends what it held (the same transaction, or one whose
    // blockhash expired): the chain lands nothing more.
    freezer.thaw.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(60), first).await.expect("the thawed owner answers");
    assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE));
    assert_eq!(rig.stats().await["settled"], 1);
    let (again, replayed) = until_final(&retrier, &owner.agent, &key, &body).await;
    assert_eq!((again, replayed), (status, env));
}

#[actix_web::test]
async fn a_takeover_resends_the_same_solana_transaction_and_it_lands_once() {
    take_over_a_frozen_payment(false).await;
}

#[actix_web::test]
async fn a_takeover_signs_again_only_after_the_old_transaction_can_never_land() {
    take_over_a_frozen_payment(true).await;
}

#[actix_web::test]
async fn a_solana_rpc_of_another_chain_is_never_believed() {
    let rig = SolanaRig::start(&[]).await;
    let other = tokio::task::spawn_blocking(|| {
        x402_router_testkit::solana::SolanaChain::start(&[
            "--genesis-hash",
            "4uhcVJyU9pJkvQyS88uRDiswHXSCkY3zQawwpjk2NsNY",
        ])
    })
    .await
    .unwrap()
    .unwrap();
    let app = spawn_app_with(AppOptions {
        extra: rig.router_extra_via(&[other.field("rpc_url").into()]),
        ..Default::default()
    })
    .await;
    let before = rig.balances().await;
    let (status, env) = route(&app, &new_key(), &call(&rig, "/svm/v2/paid")).await;
    assert_eq!((status, env["code"].as_str()), (503, Some("payment_network_unavailable")), "{env}");
    assert_eq!(ledger(&app, "SELECT count(*) AS n FROM payments").await, 0);
    assert_eq!(rig.balances().await, before);
    assert_eq!(rig.stats().await["settled"], 0);
}

/// Races: the same call sent 8 times at once under one key pays once; 8 calls under 8 keys
/// against a budget for 3 pay exactly 3, on two router instances sharing the ledger.
#[actix_web::test]
async fn racing_solana_calls_pay_once_per_key_and_never_past_the_budget() {
    let rig = SolanaRig::start(&[]).await;
    let db = Arc::new(TestDb::new().await);
    let options = || AppOptions { extra: rig.router_extra(), ..Default::default() };
    let one = spawn_app_on(Arc::clone(&db), options()).await;
    let two = spawn_app_on(Arc::clone(&db), options()).await;
    let agent = one.agent.clone();
    let (payer0, pay_to0) = rig.balances().await;
    let apps = [&one, &two];

    let key = new_key();
    let body = call(&rig, "/svm/v2/paid");
    let same: Vec<_> =
        (0..8).map(|i| spawn_route(&apps[i % 2].client, &apps[i % 2].address, &agent, &key, &body)).collect();
    for call in same {
        let _ = call.await.unwrap().unwrap();
    }
    let (status, env) = until_final(&one, &agent, &key, &body).await;
    assert_eq!((status, &env["payment"]["status"]), (200, &json!("settled")), "{env}");
    assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE), "one key, one payment");

    exec(&db, &format!("UPDATE agents SET daily_budget = {} WHERE id = '{}'", 4 * SVM_PRICE, agent.id)).await;
    let keys: Vec<String> = (0..8).map(|_| new_key()).collect();
    let calls: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| spawn_route(&apps[i % 2].client, &apps[i % 2].address, &agent, k, &body))
        .collect();
    let mut paid = 0;
    for (call, key) in calls.into_iter().zip(&keys) {
        let _ = call.await.unwrap().unwrap();
        let (status, env) = until_final(&one, &agent, key, &body).await;
        match status {
            200 => paid += 1,
            402 => assert_eq!(env["code"], "payment_over_budget", "{env}"),
            _ => panic!("{status} {env}"),
        }
    }
    assert_eq!(paid, 3, "the budget left room for 3");
    assert_eq!(rig.balances().await, (payer0 - 4 * SVM_PRICE, pay_to0 + 4 * SVM_PRICE));
    assert_eq!(rig.stats().await["settled"], 4);
}

/// The upstream settles and answers 3 s later; the router gives each upstream exchange 1.5 s:
/// the paid answer is lost in transit, the chain shows the transfer, and the same call re-sends
/// the identical payment (payment-identifier) until the upstream has its original answer.
#[actix_web::test]
async fn a_solana_answer_lost_to_the_upstream_timeout_is_recovered_within_the_same_call() {
    let rig = SolanaRig::start(&[]).await;
    let app =
        spawn_app_with(AppOptions { upstream_timeout_ms: 1500, extra: rig.router_extra(), ..Default::default() }).await;
    let (payer0, pay_to0) = rig.balances().await;
    let key = new_key();
    let body = call(&rig, "/svm/v2/pid?slow=3");
    let (status, env) = route(&app, &key, &body).await;
    assert_eq!(status, 200, "{env}");
    assert_eq!(env["body"], json!({"paid": true}), "the original answer: {env}");
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(env["payment"]["recovery"], "recovered", "{env}");
    assert!(env["payment"]["tx_hash"].is_string(), "{env}");
    assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE));
    assert_eq!(rig.stats().await["settled"], 1);
    let (again, replayed) = route(&app, &key, &body).await;
    assert_eq!((again, replayed), (status, env));
}

/// An owner frozen after its paid request was answered, before recording: the takeover finds
/// the transfer on chain and gets the original answer back with a byte-identical re-send;
/// without payment-identifier it is `settled_response_lost`. Nothing is paid twice.
#[actix_web::test]
async fn a_takeover_of_a_settled_solana_payment_gets_its_answer_back_or_pays_nothing_more() {
    let rig = SolanaRig::start(&[]).await;
    for (path, recovered) in [("/svm/v2/pid", true), ("/svm/v2/paid", false)] {
        let db = Arc::new(TestDb::new().await);
        let options = |hooks| AppOptions {
            abandon_ms: 1000,
            heartbeat_ms: 200,
            extra: rig.router_extra(),
            hooks,
            ..Default::default()
        };
        let (hook, freezer) = freeze_at(Point::PaidAnswered);
        let owner = spawn_app_on(Arc::clone(&db), options(Hooks { at: Some(hook), ..Default::default() })).await;
        let retrier = spawn_app_on(Arc::clone(&db), options(Hooks::default())).await;
        let (payer0, pay_to0) = rig.balances().await;
        let key = new_key();
        let body = call(&rig, path);
        let first = spawn_route(&owner.client, &owner.address, &owner.agent, &key, &body);
        tokio::time::timeout(Duration::from_secs(30), freezer.reached.notified())
            .await
            .expect("the owner reached the point");
        let (status, env) = until_final(&retrier, &owner.agent, &key, &body).await;
        if recovered {
            assert_eq!((status, &env["payment"]["recovery"]), (200, &json!("recovered")), "{env}");
            assert_eq!(env["payment"]["status"], "settled");
        } else {
            assert_eq!((status, env["code"].as_str()), (502, Some("settled_response_lost")), "{env}");
            assert!(env["payment"]["tx_hash"].is_string(), "{env}");
        }
        assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE), "{path}");
        freezer.thaw.send_replace(true);
        let _ = tokio::time::timeout(Duration::from_secs(60), first).await.expect("the thawed owner answers");
        assert_eq!(rig.balances().await, (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE), "{path}");
    }
    assert_eq!(rig.stats().await["settled"], 2);
}

/// A Solana answer lost with recovery off in the call (`RECOVER_LOST_ANSWERS=false`) is
/// `settled_response_lost`; `reconcile` then gets the original answer back, once.
#[actix_web::test]
async fn reconcile_recovers_a_lost_solana_answer() {
    let rig = SolanaRig::start(&[]).await;
    let mut extra = rig.router_extra();
    extra.push(("recover-lost-answers".into(), "false".into()));
    let app = spawn_app_with(AppOptions { upstream_timeout_ms: 1500, extra, ..Default::default() }).await;
    let (status, env) = route(&app, &new_key(), &call(&rig, "/svm/v2/pid?slow=3")).await;
    assert_eq!((status, env["code"].as_str()), (504, Some("settled_response_lost")), "{env}");
    let out = router_command()
        .args(["reconcile", "--older-than-secs", "0", "--upstream-allow-private", "true"])
        .env("DATABASE_URL", &app.db.url)
        .env("X402_RPC_URLS", format!("{}={}", rig.chain.field("network"), rig.chain.field("rpc_url")))
        .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["recovered"], 1, "{report}");
    let recovered =
        "SELECT count(*) AS n FROM payments WHERE status = 'settled' AND recovery->>'outcome' = 'recovered'";
    assert_eq!(ledger(&app, recovered).await, 1);
    assert_eq!(rig.stats().await["settled"], 1);
}

/// Mints: an offer in a mint the router is not configured for is declined, and a configured
/// mint whose decimals the chain says differ from the setting is never signed for.
#[actix_web::test]
async fn unknown_mints_and_mints_the_chain_contradicts_are_never_paid() {
    let rig = SolanaRig::start(&[]).await;
    let before = rig.balances().await;
    let network = rig.chain.field("network").to_owned();
    let with_assets = |assets: String| {
        let mut extra = rig.router_extra();
        extra.retain(|(k, _)| k != "x402-assets");
        extra.push(("x402-assets".into(), assets));
        AppOptions { extra, ..Default::default() }
    };
    // Devnet's USDC is configured; the upstream asks for the chain's test mint.
    let other = spawn_app_with(with_assets(format!("{network}=4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU@6"))).await;
    let (status, env) = route(&other, &new_key(), &call(&rig, "/svm/v2/paid")).await;
    assert_eq!((status, env["code"].as_str()), (402, Some("payment_unsupported")), "{env}");
    // The test mint configured with 9 decimals: the chain says 6, nothing is signed.
    let wrong = spawn_app_with(with_assets(format!("{network}={}@9", rig.chain.field("mint")))).await;
    let (status, env) = route(&wrong, &new_key(), &call(&rig, "/svm/v2/paid")).await;
    assert_eq!((status, env["code"].as_str()), (502, Some("payment_not_made")), "{env}");
    assert!(env["error"].as_str().unwrap().contains("decimals"), "{env}");
    for app in [&other, &wrong] {
        assert_eq!(ledger(app, "SELECT count(*) AS n FROM payments").await, 0);
    }
    assert_eq!(rig.balances().await, before);
    assert_eq!(rig.stats().await, json!({"settled": 0, "kept": 0, "refused": 0}));
}

/// Recovery never gives up on an answer because the chain could not be read to check it
/// (chaos found it: an RPC stall made four re-sent original answers "not proven", for good):
/// it asks again while it may and leaves the payment worth retrying; with the chain readable
/// the same re-send is the original answer.
#[actix_web::test]
async fn an_answer_the_chain_cannot_be_read_to_check_is_retried_not_refused() {
    use diesel::{QueryDsl, SelectableHelper};
    use diesel_async::RunQueryDsl;
    use x402_router::payments::store::PaymentRow;
    use x402_router::recovery::{self, Ending, Proof};
    use x402_router::x402::svm::{SvmNetwork, SvmRpc};
    let rig = SolanaRig::start(&[]).await;
    // Held before recording: the request as sent and the payment header are opened from the
    // ledger while the call may still need them (they are dropped once it is settled).
    let (hook, held, armed) = hold_at(x402_router::faults::Point::BeforeRecord);
    let hooks = x402_router::startup::Hooks { at: Some(hook), ..Default::default() };
    let app = spawn_app_with(AppOptions { extra: rig.router_extra(), hooks, ..Default::default() }).await;
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let key = new_key();
    let paid = spawn_route(&app.client, &app.address, &app.agent, &key, &call(&rig, "/svm/v2/pid"));
    held.reached.notified().await;
    let opened = opened_intent(&app.db, &key).await;
    assert!(opened.exact().is_ok(), "{opened:?}");
    held.thaw.send(true).unwrap();
    let resp = paid.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let row: PaymentRow = x402_router::db::schema::payments::table
        .select(PaymentRow::as_select())
        .first(&mut app.db.conn().await)
        .await
        .unwrap();
    assert!(row.sealed.is_none(), "dropped once settled");
    let transfer = x402_router::relay::view::decode_svm_transfer(
        &row.signed_authorization,
        (&row.network, &row.asset, &row.payer),
    )
    .unwrap();
    let upstream = x402_router::upstream::UpstreamClient::new(&x402_router::config::UpstreamConfig {
        allow_private: true,
        allow_cidrs: vec![],
        connect_timeout: Duration::from_secs(2),
        timeout: Duration::from_secs(5),
        max_response_bytes: 1 << 20,
    })
    .unwrap();
    let network = SvmNetwork::parse(rig.chain.field("network")).unwrap();
    let nobody = format!("http://127.0.0.1:{}", free_port()).parse().unwrap();
    let unreadable = SvmRpc::new(network.clone(), nobody, Duration::from_millis(500)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    let tried = recovery::recover(&upstream, Proof::Svm(&unreadable, &transfer), (&row, &opened), deadline).await;
    assert!(matches!(tried.ending, Ending::Lost), "{:?}", tried.log);
    assert!(tried.sends >= 2, "asked again: {:?}", tried.log);
    assert!(recovery::worth_retrying(&tried.log), "left for reconcile: {:?}", tried.log);
    let readable = SvmRpc::new(network, rig.chain.field("rpc_url").parse().unwrap(), Duration::from_secs(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    match recovery::recover(&upstream, Proof::Svm(&readable, &transfer), (&row, &opened), deadline).await.ending {
        Ending::Recovered { resp, tx_hash } => {
            assert_eq!(resp.status, 200);
            assert_eq!(Some(tx_hash), row.tx_hash);
        }
        Ending::Lost => panic!("the original answer was not recognised"),
    }
    assert_eq!(rig.stats().await["settled"], 1, "re-sends settle nothing");
}

/// Asks until the answer is not "in flight" (the owner's lease has to run out first): the
/// first answer a router decides.
async fn until_decided(app: &TestApp, agent: &Agent, key: &str, body: &Value) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let resp = route_at(&app.client, &app.address, agent, key, body).await;
        let status = resp.status().as_u16();
        let env: Value = resp.json().await.unwrap_or(Value::Null);
        if !(status == 409 && env["code"] == "idempotency_key_in_flight") {
            return (status, env);
        }
        assert!(Instant::now() < deadline, "still in flight: {env}");
        // lets time pass: the owner's lease (abandon_ms) runs out.
        let_time_pass(Duration::from_millis(200)).await;
    }
}

/// Router settings with a short lease, reading the chain at `rpc_urls`.
fn takeover_options(rig: &SolanaRig, rpc_urls: &[String], hooks: Hooks) -> AppOptions {
    AppOptions {
        abandon_ms: 1000,
        heartbeat_ms: 200,
        extra: rig.router_extra_via(rpc_urls),
        hooks,
        ..Default::default()
    }
}

const SIGNATURE: &str = "SELECT signed_authorization->>'signature' AS t FROM payments";

/// Issue 38, item 5: a signature index that lags behind the ledger is one RPC's word that a
/// landed transfer never landed. An owner is frozen after its paid request was answered (the
/// transfer landed); the chain moves past the blockhash's last valid height; the main RPC
/// URL's index omits the transfer. A takeover reading only that URL must not sign again (503,
/// the key stays in flight); one that also has a second URL finds the transfer there:
/// `settled_response_lost`, exactly one transfer. On the old code the first takeover signed
/// a second transfer and the upstream settled it (two prices moved).
#[actix_web::test]
async fn a_lagging_signature_index_never_makes_a_takeover_pay_twice() {
    let rig = SolanaRig::start(&["--slot-ms", "0"]).await;
    let db = Arc::new(TestDb::new().await);
    let main = vec![rig.chain.field("rpc_url").to_owned()];
    let (hook, freezer) = freeze_at(Point::PaidAnswered);
    let owner =
        spawn_app_on(Arc::clone(&db), takeover_options(&rig, &main, Hooks { at: Some(hook), ..Default::default() }))
            .await;
    let lone = spawn_app_on(Arc::clone(&db), takeover_options(&rig, &main, Hooks::default())).await;
    let (payer0, pay_to0) = rig.balances().await;
    let paid_once = (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE);
    let key = new_key();
    let body = call(&rig, "/svm/v2/paid");
    let first = spawn_route(&owner.client, &owner.address, &owner.agent, &key, &body);
    tokio::time::timeout(Duration::from_secs(30), freezer.reached.notified())
        .await
        .expect("the owner reached the point");
    assert_eq!(rig.balances().await, paid_once, "the transfer landed");
    let signed = count_text(&owner, SIGNATURE).await;
    rig.chain.index("", 1_000_000, 0).await.unwrap();
    rig.chain.advance(200).await.unwrap();

    for _ in 0..2 {
        let (status, env) = until_decided(&lone, &owner.agent, &key, &body).await;
        assert_eq!((status, env["code"].as_str()), (503, Some("payment_network_unavailable")), "{env}");
        assert_eq!(rig.balances().await, paid_once, "never a second transfer on one RPC's word");
        assert_eq!(count_text(&owner, SIGNATURE).await, signed, "never signed again");
    }
    assert_eq!(rig.stats().await["settled"], 1);

    let full = spawn_app_on(Arc::clone(&db), takeover_options(&rig, &rig.rpc_urls(), Hooks::default())).await;
    let (status, env) = until_final(&full, &owner.agent, &key, &body).await;
    assert_eq!((status, env["code"].as_str()), (502, Some("settled_response_lost")), "{env}");
    assert!(env["payment"]["tx_hash"].is_string(), "the second URL shows the transfer: {env}");
    assert_eq!(count_text(&owner, SIGNATURE).await, signed);
    assert_eq!(ledger(&owner, "SELECT count(*) AS n FROM payments").await, 1);
    freezer.thaw.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(60), first).await.expect("the thawed owner answers");
    assert_eq!(rig.balances().await, paid_once);
    assert_eq!(rig.stats().await["settled"], 1);
}

/// Issue 38, item 5, the other ways to "can never land": `reconcile` (which would release the
/// reservation) and a key reused after GC for the same request (which would sign again). The
/// upstream keeps the transaction and submits it later; past its blockhash's last valid
/// height the main URL's index omits it. Reading that URL alone, reconcile leaves the intent
/// as it is (counted as an error); with the second URL, it finds the transfer; and the reused
/// key, reading the main URL alone, is 503, nothing signed. On the old code reconcile marked
/// it `expired` (the agent's budget got the price back) and the reused key signed again.
#[actix_web::test]
async fn a_lagging_signature_index_never_releases_nor_re_signs_a_landed_payment() {
    let rig = SolanaRig::start(&["--slot-ms", "0"]).await;
    let main = vec![rig.chain.field("rpc_url").to_owned()];
    let app = spawn_app_with(AppOptions { extra: rig.router_extra_via(&main), ..Default::default() }).await;
    set_budget(&app, 100_000).await;
    let (payer0, pay_to0) = rig.balances().await;
    let paid_once = (payer0 - SVM_PRICE, pay_to0 + SVM_PRICE);
    let reserved = (100_000 - SVM_PRICE).to_string();
    let key = new_key();
    let body = call(&rig, "/svm/v2/keep");
    let (status, env) = route(&app, &key, &body).await;
    assert_eq!((status, env["code"].as_str()), (502, Some("payment_rejected")), "{env}");
    assert_eq!(rig.settle_kept().await["settled"].as_array().map(Vec::len), Some(1));
    assert_eq!(rig.balances().await, paid_once);
    let signed = count_text(&app, SIGNATURE).await;
    rig.chain.index("", 1_000_000, 0).await.unwrap();
    rig.chain.advance(200).await.unwrap();

    let (ok, report, stderr) = rig.reconcile_via(&app.db, &main);
    assert_eq!((report["expired"].as_u64(), report["errors"].as_u64()), (Some(0), Some(1)), "{report}");
    assert!(!ok && stderr.contains("could not be checked"), "a scheduler notices: {stderr}");
    assert_eq!(remaining(&app).await, reserved, "still reserved");
    assert_eq!(ledger(&app, "SELECT count(*) AS n FROM payments WHERE status = 'rejected'").await, 1);

    let report = rig.reconcile(&app.db);
    assert_eq!((report["settled_response_lost"].as_u64(), report["expired"].as_u64()), (Some(1), Some(0)), "{report}");
    assert_eq!(remaining(&app).await, reserved, "spent");

    // The key is reused after GC, for the same request: the router asks the chain again.
    exec(&app.db, &format!("DELETE FROM idempotency_keys WHERE key = '{key}'")).await;
    app.forget_cached(&key).await;
    let (status, env) = route(&app, &key, &body).await;
    assert_eq!((status, env["code"].as_str()), (503, Some("payment_network_unavailable")), "{env}");
    assert_eq!(count_text(&app, SIGNATURE).await, signed, "never signed again");
    assert_eq!(ledger(&app, "SELECT attempts::bigint AS n FROM payments").await, 1);
    assert_eq!(rig.balances().await, paid_once);
    assert_eq!(ledger(&app, "SELECT count(*) AS n FROM payments").await, 1);
}

/// An SPL mint has no `symbol()` to read: the console shows its amounts (and, when every
/// asset shares it, budgets) in the symbol the operator gave it in `X402_ASSETS`
/// (`<mint>@6:USDC`), as `/.well-known/x402-router` says; without one, none.
#[actix_web::test]
async fn a_mint_is_shown_in_the_symbol_the_operator_gave_it() {
    let rig = SolanaRig::start(&[]).await;
    let (network, mint) = (rig.chain.field("network").to_owned(), rig.chain.field("mint").to_owned());
    let described = |known: &Value| {
        let assets = known["networks"].as_array().unwrap().iter().find(|n| n["network"] == network.as_str()).unwrap();
        let asset = assets["assets"].as_array().unwrap().iter().find(|a| a["asset"] == mint.as_str()).unwrap();
        (asset["symbol"].clone(), asset["decimals"].clone(), known["unit"].clone())
    };
    let mut extra = rig.router_extra();
    extra.retain(|(k, _)| k != "x402-assets");
    extra.push(("x402-assets".into(), format!("{network}={mint}@6:USDC")));
    let named = spawn_app_with(AppOptions { extra, ..Default::default() }).await;
    let known: Value =
        reqwest::get(format!("{}/.well-known/x402-router", named.address)).await.unwrap().json().await.unwrap();
    assert_eq!(described(&known), (json!("USDC"), json!(6), json!({"decimals": 6, "symbol": "USDC"})), "{known}");

    let unnamed = solana_app(&rig).await;
    let known: Value =
        reqwest::get(format!("{}/.well-known/x402-router", unnamed.address)).await.unwrap().json().await.unwrap();
    assert_eq!(described(&known).0, Value::Null, "{known}");
}
