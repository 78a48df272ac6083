//! An operator's stop stops everything (issue 38, items 1 and 3), attacked as an agent with a
//! stolen key and a slow upstream would: calls let in before the operator acted are already in
//! flight when the agent is disabled, its key rotated or payments paused. Nothing is signed or
//! sent after the stop; counted at the upstream and on-chain. (A pause against a sign-in:
//! `recovery::a_pause_stops_the_sign_in_of_a_takeover_and_resuming_re_accesses_once`.)

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use alloy::primitives::U256;
use futures_util::future::join_all;
use serde_json::{Value, json};
use x402_router::faults::Point;
use x402_router::operators::Role;
use x402_router::startup::Hooks;

use crate::helpers::*;

async fn stat(chain: &Devnet, path: &str, field: &str) -> u64 {
    chain.stats().await[path][field].as_u64().unwrap_or(0)
}

/// POST `path` on the admin API with a fresh admin token; the status.
async fn admin_post(app: &TestApp, path: &str, body: Option<Value>) -> u16 {
    let (_, token) = create_operator(&app.db, &format!("admin-{}", uuid::Uuid::new_v4().simple()), Role::Admin).await;
    let mut req = app.client.post(format!("{}{path}", app.address)).bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    req.send().await.unwrap().status().as_u16()
}

/// Fires `n` calls with fresh keys to `url`, waits until the upstream holds all of them, runs
/// `stop`, and returns every call's (status, body).
async fn calls_in_flight_then<F: std::future::Future<Output = ()>>(
    app: &Arc<TestApp>,
    chain: &Devnet,
    n: usize,
    path: &str,
    stop: F,
) -> Vec<(u16, Value)> {
    let url = chain.url(&format!("{path}?hold=8"));
    let calls = join_all((0..n).map(|_| {
        let (app, url) = (Arc::clone(app), url.clone());
        async move {
            let resp = app.route(&new_key(), &json!({"url": url, "max_amount": "50000"})).await;
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    }));
    let act = async {
        x402_router_testkit::wait_until(Duration::from_secs(10), "every call to reach the upstream", || async {
            stat(chain, path, "requests").await >= n as u64
        })
        .await
        .unwrap();
        stop.await;
    };
    let (results, ()) = tokio::join!(calls, act);
    results
}

/// Six calls are held by an upstream that names its price only after 8 s; the operator
/// disables the agent while they wait. None of them signs or sends anything afterwards.
#[actix_web::test]
async fn disabling_an_agent_stops_its_calls_already_in_flight() {
    let chain = Devnet::start().await;
    let app = Arc::new(paid_app_with(&chain, &[]).await);
    let (router0, pay_to0) = (chain.balance(ROUTER_ADDRESS).await, chain.balance(PAY_TO).await);
    let path = format!("/admin/agents/{}/disable", app.agent.id);
    let results = calls_in_flight_then(&app, &chain, 6, "/v2/weather", async {
        assert_eq!(admin_post(&app, &path, None).await, 200);
    })
    .await;
    for (status, body) in &results {
        assert_eq!((*status, body["code"].as_str()), (403, Some("agent_disabled")), "{body}");
    }
    assert_eq!(stat(&chain, "/v2/weather", "payment_attempts").await, 0, "no payment reached the upstream");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0, "nothing reserved");
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 0);
    assert_eq!((chain.balance(ROUTER_ADDRESS).await, chain.balance(PAY_TO).await), (router0, pay_to0));
}

/// Calls authenticated with a key that is rotated while they wait sign nothing; a call that
/// reserved its payment before the rotation finishes and is paid once.
#[actix_web::test]
async fn a_rotated_key_signs_nothing_new_but_a_reservation_made_before_it_finishes() {
    let chain = Devnet::start().await;
    let (hook, held, armed) = hold_at(Point::PaymentLeaving);
    let hooks = Hooks { at: Some(hook), ..Default::default() };
    let app = Arc::new(spawn_app_with(AppOptions { extra: chain.router_extra(), hooks, ..Default::default() }).await);
    let pay_to0 = chain.balance(PAY_TO).await;
    // One call reserved its payment and is held just before it leaves.
    armed.store(true, Ordering::SeqCst);
    let reserved = {
        let app = Arc::clone(&app);
        let url = chain.url("/v2/weather");
        tokio::spawn(async move {
            let resp = app.route(&new_key(), &json!({"url": url, "max_amount": "50000"})).await;
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        })
    };
    held.reached.notified().await;
    let path = format!("/admin/agents/{}/rotate-key", app.agent.id);
    let results = calls_in_flight_then(&app, &chain, 6, "/v2/multi", async {
        assert_eq!(admin_post(&app, &path, None).await, 200);
        held.thaw.send(true).unwrap();
    })
    .await;
    for (status, body) in &results {
        assert_eq!((*status, body["code"].as_str()), (401, Some("unauthorized")), "{body}");
    }
    assert_eq!(stat(&chain, "/v2/multi", "payment_attempts").await, 0, "the rotated key's calls paid nothing");
    let (status, env) = reserved.await.unwrap();
    assert_eq!((status, &env["payment"]["status"]), (200, &json!("settled")), "{env}");
    assert_eq!(chain.balance(PAY_TO).await - pay_to0, U256::from(PRICE), "the reserved call, once");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 1);
}

/// A payment reserved before the agent was disabled, not yet sent: it is never sent.
#[actix_web::test]
async fn a_payment_reserved_before_a_disable_never_leaves_after_it() {
    let chain = Devnet::start().await;
    let (hook, held, armed) = hold_at(Point::BeforePaidSend);
    let hooks = Hooks { at: Some(hook), ..Default::default() };
    let app = Arc::new(spawn_app_with(AppOptions { extra: chain.router_extra(), hooks, ..Default::default() }).await);
    armed.store(true, Ordering::SeqCst);
    let call = {
        let app = Arc::clone(&app);
        let url = chain.url("/v2/weather");
        tokio::spawn(async move { app.route(&new_key(), &json!({"url": url, "max_amount": "50000"})).await.status() })
    };
    held.reached.notified().await;
    assert_eq!(admin_post(&app, &format!("/admin/agents/{}/disable", app.agent.id), None).await, 200);
    held.thaw.send(true).unwrap();
    assert_eq!(call.await.unwrap(), 403);
    assert_eq!(stat(&chain, "/v2/weather", "payment_attempts").await, 0);
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 0);
}

/// Pause, then a takeover of a paid call whose owner crashed after committing its intent: the
/// recorded, still valid authorization is not re-sent; after the pause it is, once.
#[actix_web::test]
async fn a_pause_holds_back_a_takeovers_recorded_authorization() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "50000"});
    // Still valid for 200 s: a takeover would re-send it as recorded.
    crash_after_signing(&app, &chain, &key, &body, 200).await;
    let pay_to0 = chain.balance(PAY_TO).await;
    assert_eq!(admin_post(&app, "/admin/pause", Some(json!({}))).await, 200);
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payments_paused");
    assert_eq!(stat(&chain, "/v2/weather", "payment_attempts").await, 0, "nothing re-sent while paused");
    assert_eq!(chain.balance(PAY_TO).await, pay_to0);
    // Resumed: the same key's next retry takes over again and sends the recorded payment once.
    let (_, token) = create_operator(&app.db, "resumer", Role::Admin).await;
    let resumed = app.client.delete(format!("{}/admin/pause", app.address)).bearer_auth(token).send().await.unwrap();
    assert_eq!(resumed.status(), 200);
    exec(&app.db, "UPDATE idempotency_keys SET created_at = now() - interval '10 minutes'").await;
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(chain.balance(PAY_TO).await - pay_to0, U256::from(PRICE));
    assert_eq!(count(&app.db, "SELECT attempts::bigint AS n FROM payments").await, 1, "re-sent, never re-signed");
}
