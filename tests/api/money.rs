//! Money safety against hostile upstreams (issue: "a hostile upstream can never move more
//! than the agent allowed"). Real anvil, the project's token and its hostile test routes;
//! money is counted on-chain.

use alloy::primitives::U256;
use serde_json::{Value, json};
use x402_router_testkit::Deadline;

use crate::helpers::*;

async fn set_budget(app: &TestApp, budget: u64) {
    exec(&app.db, &format!("UPDATE agents SET daily_budget = {budget} WHERE id = '{}'", app.agent.id)).await;
}

/// What GC leaves of a key after its expiry: no idempotency row, no Redis entry.
async fn forget_key(app: &TestApp, key: &str) {
    exec(&app.db, &format!("DELETE FROM idempotency_keys WHERE key = '{key}'")).await;
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{}idem:{{{}}}:{key}", app.redis_prefix, app.agent.id))
        .query_async(&mut conn)
        .await
        .unwrap();
}

async fn moved(chain: &Devnet) -> U256 {
    chain.balance(PAY_TO).await
}

/// The attack: take the signed authorization, answer "payment failed" (or 200 without a
/// settlement), keep it, repeat with fresh keys, then submit everything on-chain as a third
/// party. On the old code an agent with a budget of 3 prices handed out 6 authorizations.
#[actix_web::test]
async fn an_upstream_that_keeps_authorizations_never_moves_more_than_the_budget() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    set_budget(&app, 3 * PRICE).await;
    let before = moved(&chain).await;
    let mut statuses = Vec::new();
    for route in ["/v2/keep-reject", "/v2/keep-answer", "/v2/keep-reject", "/v2/keep-answer", "/v2/keep-reject"] {
        let body = json!({"url": chain.url(route), "max_amount": PRICE.to_string()});
        statuses.push(app.route(&new_key(), &body).await.status().as_u16());
    }
    // Three authorizations fit the budget; the upstream's "failed" released none of them.
    assert_eq!(statuses.iter().filter(|s| **s == 402).count(), 2, "{statuses:?}");
    let stats = chain.stats().await;
    let kept = stats["/v2/keep-reject"]["kept"].as_u64().unwrap() + stats["/v2/keep-answer"]["kept"].as_u64().unwrap();
    assert_eq!(kept, 3);
    let spend = x402_router::payments::store::agent_spend(&mut app.db.conn().await, app.agent.id, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(spend.reserved_24h, (3 * PRICE).to_string());

    // The upstream settles everything it kept, as a third party: at most the budget moves.
    assert_eq!(settle_kept(&chain).await["settled"], 3);
    assert_eq!(moved(&chain).await - before, U256::from(3 * PRICE));
    // Reconcile finds the money moved; the budget stays spent.
    let report = reconcile_now(&app.db, &chain);
    assert_eq!(report["settled"].as_u64().unwrap() + report["settled_response_lost"].as_u64().unwrap(), 3, "{report}");
    let over = app.route(&new_key(), &json!({"url": chain.url("/v2/weather"), "max_amount": "10000"})).await;
    assert_eq!(over.status(), 402);
    assert_eq!(moved(&chain).await - before, U256::from(3 * PRICE));
}

/// A reservation is released by the chain only (unused past validBefore, found by
/// reconcile), and counts however old it is.
#[actix_web::test]
async fn a_reservation_is_released_only_when_the_chain_shows_it_can_no_longer_move_money() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    set_budget(&app, PRICE).await;
    // Verified, not settled (the upstream says 500): the authorization may still be used.
    let failed = app.route(&new_key(), &json!({"url": chain.url("/v2/error500"), "max_amount": "10000"})).await;
    assert_eq!(failed.status(), 502);
    let weather = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    assert_eq!(app.route(&new_key(), &weather).await.status(), 402, "the budget is still reserved");
    // Older than the 24 h window, still spendable: still counted.
    exec(&app.db, "UPDATE payments SET created_at = now() - interval '25 hours'").await;
    assert_eq!(app.route(&new_key(), &weather).await.status(), 402, "old but live reservations count");
    // Still valid on-chain: reconcile leaves it.
    let report = reconcile_now(&app.db, &chain);
    assert_eq!(report["expired"], 0, "{report}");
    // Past validBefore and unused: reconcile releases it, and the agent can pay again.
    exec(&app.db, "UPDATE payments SET valid_before = extract(epoch from now())::bigint - 3600").await;
    let report = reconcile_now(&app.db, &chain);
    assert_eq!(report["expired"], 1, "{report}");
    let ok = app.route(&new_key(), &weather).await;
    assert_eq!(ok.status(), 200);
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 1);
}

#[actix_web::test]
async fn an_authorization_lives_at_most_x402_max_auth_seconds_whatever_the_upstream_asks() {
    let chain = Devnet::start().await;
    for (setting, cap) in [(None, 300i64), (Some("60"), 60)] {
        let extra: Vec<(&str, &str)> = setting.map(|s| vec![("x402-max-auth-seconds", s)]).unwrap_or_default();
        let app = paid_app_with(&chain, &extra).await;
        let url = chain.url("/v2/weather?max_timeout=10000000000");
        let resp = app.route(&new_key(), &json!({"url": url, "max_amount": "10000"})).await;
        assert_eq!(resp.status(), 200);
        let now = count(&app.db, "SELECT extract(epoch from now())::bigint AS n").await;
        let valid_before = count(&app.db, "SELECT valid_before AS n FROM payments").await;
        assert!(valid_before <= now + cap && valid_before > now + cap - 30, "{valid_before} vs now {now} + {cap}");
    }
}

#[actix_web::test]
async fn a_router_whose_rpc_serves_another_chain_refuses_to_start() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    // The devnet is chain 84532, configured as Base mainnet (8453).
    let out = router_command()
        .arg("serve")
        .env("DATABASE_URL", &db.url)
        .env("REDIS_URL", redis_url())
        .env("BIND", "127.0.0.1:0")
        .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
        .env("X402_RPC_URLS", format!("eip155:8453={}", chain.rpc_url))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("X402_RPC_URLS") && stderr.contains("eip155:8453") && stderr.contains("84532"), "{stderr}");
    assert!(!stderr.contains(&chain.rpc_url), "the RPC URL may carry a key and is never printed: {stderr}");
}

#[actix_web::test]
async fn assets_of_different_units_under_one_budget_are_refused_at_configuration() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let out = router_command()
        .arg("serve")
        .env("DATABASE_URL", &db.url)
        .env("REDIS_URL", redis_url())
        .env("BIND", "127.0.0.1:0")
        .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
        .env("X402_RPC_URLS", format!("eip155:84532={}", chain.rpc_url))
        .env(
            "X402_ASSETS",
            format!("eip155:84532={}@6,eip155:84532=0x036CbD53842c5426634e7929541eC2318f3dCF7e@18", chain.token),
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("X402_ASSETS") && stderr.contains("decimals"), "{stderr}");
}

/// A takeover re-checks the agent's current limits before it sends a recorded payment.
#[actix_web::test]
async fn a_resumed_payment_is_not_sent_when_the_agent_cap_was_lowered_meanwhile() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    crash_after_signing(&app, &chain, &key, &body, 200).await;
    exec(&app.db, &format!("UPDATE agents SET max_per_call = {} WHERE id = '{}'", PRICE - 1, app.agent.id)).await;
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 402);
    let env: Value = resp.json().await.unwrap();
    assert!(env["error"].as_str().unwrap().contains("cap"), "{env}");
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 0, "the stored payment was not sent");
}

/// How an old intent of (agent, key, request) is left behind, before its key expired.
#[derive(Clone, Copy, Debug)]
enum OldIntent {
    Settled,
    Signed,
    Expired,
    Rejected,
    NotSettled,
    Unknown,
}

/// Key reuse after expiry works like a new key: a different request pays again, exactly
/// once; the same request re-sent never pays twice, whatever state its old intent is in.
#[actix_web::test]
async fn a_key_reused_after_expiry_pays_once_per_request_and_never_twice_for_the_same_one() {
    use OldIntent::*;
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    for state in [Settled, Signed, Expired, Rejected, NotSettled, Unknown] {
        let key = new_key();
        let first = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
        let before = moved(&chain).await;
        let mut paid_for_first = 0u64;
        match state {
            Settled => {
                assert_eq!(app.route(&key, &first).await.status(), 200);
                paid_for_first = 1;
            }
            _ => {
                // A router signed (valid, or already expired for `Expired`) and never sent it.
                let offset = if matches!(state, Expired) { -5 } else { 200 };
                crash_after_signing(&app, &chain, &key, &first, offset).await;
                let status = match state {
                    Signed => "signed",
                    Expired => "expired",
                    Rejected => "rejected",
                    NotSettled => "not_settled",
                    _ => "unknown",
                };
                exec(&app.db, &format!("UPDATE payments SET status = '{status}' WHERE idempotency_key = '{key}'"))
                    .await;
            }
        }
        forget_key(&app, &key).await;

        // The same request again: it may complete its own payment once, never a second.
        let again = app.route(&key, &first).await;
        let again_status = again.status().as_u16();
        let env: Value = again.json().await.unwrap();
        if matches!(state, Settled) {
            assert_eq!(again_status, 409, "{state:?}: {env}");
            assert_eq!(env["code"], "already_paid");
            assert!(env["previous_receipt_id"].is_string(), "{env}");
        } else {
            assert_eq!(again_status, 200, "{state:?}: {env}");
            paid_for_first += 1;
        }
        forget_key(&app, &key).await;
        let third = app.route(&key, &first).await;
        assert_eq!(third.status(), 409, "{state:?}: the same request never pays twice");
        assert_eq!(moved(&chain).await - before, U256::from(paid_for_first * PRICE), "{state:?}");

        // A different request under the same key, after it expired: a new payment, exactly once.
        forget_key(&app, &key).await;
        let other = json!({"url": chain.url("/v2/weather?city=other"), "max_amount": "10000"});
        let resp = app.route(&key, &other).await;
        assert_eq!(resp.status(), 200, "{state:?}");
        let env: Value = resp.json().await.unwrap();
        assert_eq!(env["payment"]["nonce"], router_nonce(app.agent.id, &key, &other).to_string());
        assert_ne!(router_nonce(app.agent.id, &key, &other), router_nonce(app.agent.id, &key, &first));
        assert_eq!(app.route(&key, &other).await.headers().get("x-idempotent-replay").unwrap(), "true");
        assert_eq!(moved(&chain).await - before, U256::from((paid_for_first + 1) * PRICE), "{state:?}");
    }
}

/// Waits (polling the wall clock, at most `limit`) until Unix time `t` has passed: an
/// authorization valid before `t` can then never move money.
async fn until_past(t: i64, limit: std::time::Duration) {
    let mut deadline = Deadline::after(limit, "the condition").every(std::time::Duration::from_millis(100));
    while x402_router::clock::now_unix_i64() <= t {
        if deadline.next_poll().await.is_err() {
            panic!("the clock did not pass {t} in time");
        }
    }
}

/// Calls `body` (a `/v2/keep-reject` route with a short `max_timeout`) under `key`: the lying
/// upstream refuses the payment and keeps the authorization; returns once that authorization
/// has expired unused (the wall clock passed its validBefore).
async fn refused_kept_and_expired(app: &TestApp, key: &str, body: &Value) {
    let first = app.route(key, body).await;
    let status = first.status();
    let env: Value = first.json().await.unwrap();
    assert_eq!((status.as_u16(), env["code"].as_str()), (502, Some("payment_rejected")), "kept and refused: {env}");
    let valid_before =
        count(&app.db, &format!("SELECT valid_before AS n FROM payments WHERE idempotency_key = '{key}'")).await;
    until_past(valid_before, std::time::Duration::from_secs(30)).await;
}

/// The attack on the rolling window (issue 22, item 1): a payment the upstream refused (and
/// kept), aged past 24 h and expired by reconcile, is re-signed for the same request when
/// the key is reused after GC; the upstream submits the new authorization. On the old code
/// the window read the row's creation, so the settled re-signing fell outside it at once and
/// the agent could spend its whole budget again: 3 prices moved on a budget of 2.
#[actix_web::test]
async fn a_re_signed_payment_counts_against_the_budget_from_the_moment_it_is_signed() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    set_budget(&app, 2 * PRICE).await;
    let before = moved(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/keep-reject?max_timeout=6"), "max_amount": PRICE.to_string()});
    refused_kept_and_expired(&app, &key, &body).await;

    // A day later: the refused intent's rows are old, and reconcile finds it expired unused.
    exec(
        &app.db,
        "UPDATE payments SET created_at = now() - interval '25 hours', updated_at = now() - interval '25 hours', \
                signed_at = now() - interval '25 hours', valid_before = extract(epoch from now())::bigint - 3600",
    )
    .await;
    let report = reconcile_now(&app.db, &chain);
    assert_eq!(report["expired"], 1, "{report}");

    // The key is reused after GC for the same request: the same intent is re-signed (same
    // nonce), the upstream keeps the new authorization and submits it.
    forget_key(&app, &key).await;
    assert_eq!(app.route(&key, &body).await.status(), 502, "refused again, and kept");
    assert_eq!(count(&app.db, "SELECT attempts::bigint AS n FROM payments").await, 2, "re-signed, not a new intent");
    assert_eq!(settle_kept(&chain).await["settled"], 1, "the re-signed authorization moves money");
    assert_eq!(moved(&chain).await - before, U256::from(PRICE));
    let report = reconcile_now(&app.db, &chain);
    assert_eq!(report["settled_response_lost"], 1, "{report}");

    // Spent now, so only one more price fits the budget of two.
    let weather = |city: &str| json!({"url": chain.url(&format!("/v2/weather?city={city}")), "max_amount": "10000"});
    assert_eq!(app.route(&new_key(), &weather("a")).await.status(), 200);
    let over = app.route(&new_key(), &weather("b")).await;
    assert_eq!(over.status(), 402, "over the budget");
    let env: Value = over.json().await.unwrap();
    assert_eq!(env["code"], "payment_over_budget", "{env}");
    assert_eq!(moved(&chain).await - before, U256::from(2 * PRICE), "counted on-chain: never more than the budget");
    // The audit API shows when the settled payment was signed: now, not a day ago.
    let signed_recently =
        count(&app.db, "SELECT count(*) AS n FROM payments WHERE signed_at > now() - interval '1 hour'").await;
    assert_eq!(signed_recently, 2);
}

/// The race on reconcile's write (issue 22, item 2): reconcile reads a refused intent whose
/// authorization has expired unused, and decides `expired`; before it writes, the key is
/// reused after GC and the same intent is re-signed (same nonce, a new validBefore), refused
/// again by the lying upstream that keeps the new, live authorization. On the old code the
/// write checked the status only (`rejected` both times) and released the live
/// authorization's reservation: the agent could pay again beyond its budget.
#[actix_web::test]
async fn reconcile_never_releases_an_intent_re_signed_between_its_read_and_its_write() {
    use std::sync::Arc;
    use tokio::sync::Notify;
    use x402_router::faults::{Hook, Inject, Point};
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    set_budget(&app, 2 * PRICE).await;
    let before = moved(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/keep-reject?max_timeout=6"), "max_amount": PRICE.to_string()});
    refused_kept_and_expired(&app, &key, &body).await;
    // Past reconcile's safety margin too (as if the margin had passed).
    exec(&app.db, "UPDATE payments SET valid_before = extract(epoch from now())::bigint - 3600").await;

    // Reconcile in this process, paused between its read and its write.
    let (reached, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (r, l) = (Arc::clone(&reached), Arc::clone(&release));
    let hook: Hook = Arc::new(move |p| {
        let (r, l) = (Arc::clone(&r), Arc::clone(&l));
        Box::pin(async move {
            if p == Point::ReconcileDecided {
                r.notify_one();
                l.notified().await;
            }
            Inject::Nothing
        })
    });
    let networks = x402_router::config::parse_rpc_urls(&format!("eip155:84532={}", chain.rpc_url)).unwrap();
    let rpc = x402_router::x402::Chain::new(networks, std::time::Duration::from_secs(5));
    let settings = x402_router::audit::reconcile::Settings {
        older_than: std::time::Duration::ZERO,
        abandon_after: std::time::Duration::from_secs(60),
        faults: Some(hook),
        only: None,
        solana: None,
        progress: None,
    };
    let mut conn = app.db.conn().await;
    let run = tokio::spawn(async move { x402_router::audit::reconcile::run(&mut conn, &rpc, &settings, None).await });
    tokio::time::timeout(std::time::Duration::from_secs(30), reached.notified()).await.expect("reconcile decided");

    forget_key(&app, &key).await;
    assert_eq!(app.route(&key, &body).await.status(), 502, "re-signed, refused again, kept again");
    assert_eq!(count(&app.db, "SELECT attempts::bigint AS n FROM payments").await, 2);
    release.notify_one();
    let report = run.await.unwrap().unwrap();
    assert_eq!((report.expired, report.pending), (0, 1), "{report:?}");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'rejected'").await, 1);

    // The live authorization still holds its part of the budget; the upstream submits it.
    assert_eq!(settle_kept(&chain).await["settled"], 1, "the re-signed authorization moves money");
    let weather = |city: &str| json!({"url": chain.url(&format!("/v2/weather?city={city}")), "max_amount": "10000"});
    assert_eq!(app.route(&new_key(), &weather("a")).await.status(), 200);
    assert_eq!(app.route(&new_key(), &weather("b")).await.status(), 402, "over the budget");
    assert_eq!(moved(&chain).await - before, U256::from(2 * PRICE), "counted on-chain: never more than the budget");
}
