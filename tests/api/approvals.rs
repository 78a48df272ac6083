//! Approvals (issue 42, item 1): a paid call above the agent's `approval_above` waits for an
//! operator; attacked as an agent and as operators would: polling on two routers, two admins
//! deciding at once, a budget spent between the approval and the retry, terms changed after
//! the approval. Money counted on-chain and at the upstream.

use std::sync::Arc;

use alloy::primitives::U256;
use futures_util::future::join_all;
use serde_json::{Value, json};
use x402_router::operators::Role;

use crate::helpers::*;

type Answer = (u16, Value);

async fn paid_app(chain: &Devnet) -> TestApp {
    spawn_app_with(AppOptions { acquire_timeout_ms: 10_000, extra: chain.router_extra(), ..Default::default() }).await
}

fn body(chain: &Devnet) -> Value {
    json!({"url": chain.url("/v2/weather"), "max_amount": "100000"})
}

async fn set(db: &TestDb, agent: &Agent, assignments: &str) {
    exec(db, &format!("UPDATE agents SET {assignments} WHERE id = '{}'", agent.id)).await;
}

async fn call(app: &TestApp, key: &str, body: &Value) -> (u16, Option<String>, Value) {
    let resp = app.route(key, body).await;
    let status = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (status, retry, resp.json().await.unwrap_or(Value::Null))
}

async fn operator_call(app: &TestApp, token: &str, method: &str, path: &str) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let resp = app.client.request(method, format!("{}{path}", app.address)).bearer_auth(token).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn decide(app: &TestApp, token: &str, id: &str, what: &str) -> Answer {
    operator_call(app, token, "POST", &format!("/admin/approvals/{id}/{what}")).await
}

async fn admin(app: &TestApp, name: &str) -> String {
    create_operator(&app.db, name, Role::Admin).await.1
}

/// A call held for approval: its approval's id.
async fn held(app: &TestApp, key: &str, body: &Value) -> String {
    let (status, retry, b) = call(app, key, body).await;
    assert_eq!((status, b["code"].as_str()), (202, Some("approval_pending")), "{b}");
    assert_eq!(retry.as_deref(), Some("5"));
    b["approval"]["id"].as_str().unwrap().to_owned()
}

async fn moved(chain: &Devnet) -> U256 {
    chain.balance(PAY_TO).await
}

async fn paid_at_upstream(chain: &Devnet) -> u64 {
    chain.stats().await["/v2/weather"]["paid"].as_u64().unwrap_or(0)
}

#[actix_web::test]
async fn a_payment_above_the_threshold_waits_for_an_operator_then_pays_exactly_once() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let ada = admin(&app, "ada").await;
    set(&app.db, &app.agent, &format!("approval_above = {}", PRICE - 1)).await;
    let before = moved(&chain).await;
    let (key, b) = (new_key(), body(&chain));
    let (status, _, first) = call(&app, &key, &b).await;
    assert_eq!(status, 202, "{first}");
    let a = &first["approval"];
    assert_eq!(first["code"], "approval_pending");
    assert_eq!((a["state"].as_str(), a["amount"].as_str()), (Some("pending"), Some("10000")), "{first}");
    assert_eq!(a["network"], "eip155:84532");
    assert_eq!(a["payTo"].as_str().unwrap().to_lowercase(), PAY_TO.to_string().to_lowercase());
    assert!(a["asset"].as_str().unwrap().starts_with("0x"));
    assert_eq!(a["upstream_url"], chain.url("/v2/weather"));
    assert_eq!(a["idempotency_key"], key.as_str());
    let id = a["id"].as_str().unwrap().to_owned();
    // Polling: the same approval, nothing signed, nothing paid.
    for _ in 0..3 {
        assert_eq!(held(&app, &key, &b).await, id);
    }
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM approvals").await, 1);
    // The queue shows it, with its agent's name; a viewer may read it but not decide.
    let (s, queue) = operator_call(&app, &app.viewer_token, "GET", "/admin/approvals?state=pending").await;
    assert_eq!((s, queue["approvals"][0]["id"].as_str()), (200, Some(id.as_str())), "{queue}");
    assert_eq!(queue["approvals"][0]["agent_name"], "test-agent");
    assert_eq!(decide(&app, &app.viewer_token, &id, "approve").await.0, 403);
    let (s, _) = operator_call(&app, &app.viewer_token, "GET", "/admin/approvals?state=maybe").await;
    assert_eq!(s, 400);
    let (s, decided) = decide(&app, &ada, &id, "approve").await;
    assert_eq!((s, decided["state"].as_str(), decided["decided_by"].as_str()), (200, Some("approved"), Some("ada")));
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM operator_events WHERE action = 'approval.approve'").await, 1);
    // Deciding again: 409, nothing changed.
    let (s, again) = decide(&app, &ada, &id, "deny").await;
    assert_eq!(
        (s, again["code"].as_str(), again["approval"]["state"].as_str()),
        (409, Some("approval_decided"), Some("approved"))
    );
    // The retry pays and calls the upstream, once; later retries replay.
    let (status, _, paid) = call(&app, &key, &b).await;
    assert_eq!((status, paid["payment"]["status"].as_str()), (200, Some("settled")), "{paid}");
    let (status, _, replay) = call(&app, &key, &b).await;
    assert_eq!((status, &replay["receipt_id"]), (200, &paid["receipt_id"]));
    assert_eq!(moved(&chain).await - before, U256::from(PRICE));
    assert_eq!(paid_at_upstream(&chain).await, 1);
    // A price at the threshold is paid at once; a key reused with another body is refused.
    set(&app.db, &app.agent, &format!("approval_above = {PRICE}")).await;
    assert_eq!(call(&app, &new_key(), &b).await.0, 200);
    assert_eq!(moved(&chain).await - before, U256::from(2 * PRICE));
}

#[actix_web::test]
async fn a_denied_or_expired_payment_is_never_signed_and_a_late_decision_is_refused() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let ada = admin(&app, "ada").await;
    set(&app.db, &app.agent, "approval_above = 0").await;
    let before = moved(&chain).await;
    let b = body(&chain);
    // Denied.
    let denied_key = new_key();
    let id = held(&app, &denied_key, &b).await;
    let (s, d) = decide(&app, &ada, &id, "deny").await;
    assert_eq!((s, d["state"].as_str()), (200, Some("denied")));
    for _ in 0..2 {
        let (status, _, r) = call(&app, &denied_key, &b).await;
        assert_eq!(
            (status, r["code"].as_str(), r["approval"]["id"].as_str()),
            (403, Some("approval_denied"), Some(id.as_str()))
        );
    }
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM operator_events WHERE action = 'approval.deny'").await, 1);
    // Expired: nobody decided within the TTL (the database's clock moved past it).
    let late_key = new_key();
    let late = held(&app, &late_key, &b).await;
    exec(&app.db, &format!("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = '{late}'")).await;
    let (status, _, r) = call(&app, &late_key, &b).await;
    assert_eq!((status, r["code"].as_str()), (403, Some("approval_expired")), "{r}");
    let (s, _) = operator_call(&app, &app.viewer_token, "GET", "/admin/approvals?state=expired").await;
    assert_eq!(s, 200);
    let (s, r) = decide(&app, &ada, &late, "approve").await;
    assert_eq!((s, r["approval"]["state"].as_str()), (409, Some("expired")), "{r}");
    assert_eq!(call(&app, &late_key, &b).await.0, 403);
    // The same key with another body: refused, whatever the approval says.
    let other = json!({"url": chain.url("/v2/weather?x=1"), "max_amount": "100000"});
    assert_eq!(call(&app, &denied_key, &other).await.0, 409);
    // Unknown approvals.
    assert_eq!(decide(&app, &ada, &uuid::Uuid::new_v4().to_string(), "approve").await.0, 404);
    assert_eq!(decide(&app, &ada, "not-a-uuid", "approve").await.0, 404);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0);
    assert_eq!(moved(&chain).await, before);
    assert_eq!(paid_at_upstream(&chain).await, 0);
}

#[actix_web::test]
async fn a_budget_spent_between_the_approval_and_the_retry_refuses_the_payment() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let ada = admin(&app, "ada").await;
    set(&app.db, &app.agent, &format!("approval_above = 0, daily_budget = {PRICE}")).await;
    let before = moved(&chain).await;
    let b = body(&chain);
    let key = new_key();
    let id = held(&app, &key, &b).await;
    assert_eq!(decide(&app, &ada, &id, "approve").await.0, 200);
    // Meanwhile the budget goes: the operator lowers it.
    set(&app.db, &app.agent, "daily_budget = 0").await;
    let (status, _, r) = call(&app, &key, &b).await;
    assert_eq!((status, r["code"].as_str()), (402, Some("payment_over_budget")), "{r}");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0);
    assert_eq!(moved(&chain).await, before);
    assert_eq!(paid_at_upstream(&chain).await, 0);
}

#[actix_web::test]
async fn terms_changed_after_the_approval_are_a_new_approval_never_a_silent_payment() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let ada = admin(&app, "ada").await;
    set(&app.db, &app.agent, "approval_above = 0").await;
    let before = moved(&chain).await;
    let b = body(&chain);
    let key = new_key();
    let id = held(&app, &key, &b).await;
    assert_eq!(decide(&app, &ada, &id, "approve").await.0, 200);
    // The upstream now asks three times the approved price.
    chain.set_defaults(&format!("price={}", 3 * PRICE)).await;
    let (status, _, r) = call(&app, &key, &b).await;
    assert_eq!((status, r["code"].as_str()), (202, Some("approval_pending")), "{r}");
    let second = r["approval"]["id"].as_str().unwrap().to_owned();
    assert_ne!(second, id);
    assert_eq!(r["approval"]["amount"], (3 * PRICE).to_string());
    assert_eq!(moved(&chain).await, before);
    assert_eq!(decide(&app, &ada, &second, "approve").await.0, 200);
    let (status, _, r) = call(&app, &key, &b).await;
    assert_eq!((status, r["payment"]["status"].as_str()), (200, Some("settled")), "{r}");
    assert_eq!(moved(&chain).await - before, U256::from(3 * PRICE));
    chain.set_defaults("").await;
}

#[actix_web::test]
async fn two_admins_deciding_at_once_exactly_one_wins() {
    let chain = Devnet::start().await;
    let app = Arc::new(paid_app(&chain).await);
    let (ada, bob) = (admin(&app, "ada").await, admin(&app, "bob").await);
    set(&app.db, &app.agent, "approval_above = 0").await;
    let b = body(&chain);
    // Four approvals, two decisions each at once: eight operator requests in flight from one
    // address stay under the authentication throttle's ten.
    let mut ids = vec![];
    for _ in 0..4 {
        ids.push(held(&app, &new_key(), &b).await);
    }
    let results = join_all(ids.iter().flat_map(|id| {
        [(ada.clone(), "approve"), (bob.clone(), "deny")].map(|(token, what)| {
            let (app, id) = (Arc::clone(&app), id.clone());
            async move { (id.clone(), what, decide(&app, &token, &id, what).await) }
        })
    }))
    .await;
    for id in &ids {
        let mine: Vec<_> = results.iter().filter(|(i, _, _)| i == id).collect();
        let won: Vec<_> = mine.iter().filter(|(_, _, (s, _))| *s == 200).collect();
        let lost: Vec<_> = mine.iter().filter(|(_, _, (s, _))| *s == 409).collect();
        assert_eq!((won.len(), lost.len()), (1, 1), "{mine:?}");
        let state = if won[0].1 == "approve" { "approved" } else { "denied" };
        assert_eq!(lost[0].2.1["approval"]["state"], state);
        let events = count(&app.db, &format!("SELECT count(*) AS n FROM operator_events WHERE target = '{id}'")).await;
        assert_eq!(events, 1);
        let stored =
            count(&app.db, &format!("SELECT count(*) AS n FROM approvals WHERE id = '{id}' AND state = '{state}'"))
                .await;
        assert_eq!(stored, 1);
    }
}

#[actix_web::test]
async fn an_agent_polling_on_two_routers_after_the_approval_pays_exactly_once() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "poller").await;
    set(&db, &agent, "approval_above = 0").await;
    let (_, ada) = create_operator(&db, "ada", Role::Admin).await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions { acquire_timeout_ms: 10_000, extra: chain.router_extra(), ..Default::default() };
    let routers =
        [RouterProcess::spawn(&db.url, &opts, &prefix).await, RouterProcess::spawn(&db.url, &opts, &prefix).await];
    let client = reqwest::Client::new();
    let (key, b) = (new_key(), body(&chain));
    let before = moved(&chain).await;
    let poll = |i: usize| {
        let (client, addr, agent, key, b) =
            (client.clone(), routers[i % 2].address.clone(), agent.clone(), key.clone(), b.clone());
        async move {
            let resp = route_at(&client, &addr, &agent, &key, &b).await;
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // Before the decision: every poll on either router is held (or finds the key in flight).
    let waiting = join_all((0..10).map(poll)).await;
    assert!(waiting.iter().all(|(s, b)| *s == 202 || b["code"] == "idempotency_key_in_flight"), "{waiting:?}");
    let id = waiting.iter().find(|(s, _)| *s == 202).unwrap().1["approval"]["id"].as_str().unwrap().to_owned();
    assert_eq!(count(&db, "SELECT count(*) AS n FROM approvals").await, 1);
    let resp = client
        .post(format!("{}/admin/approvals/{id}/approve", routers[0].address))
        .bearer_auth(&ada)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // After it: twenty polls at once on both routers.
    let polled = join_all((0..20).map(poll)).await;
    assert!(polled.iter().all(|(s, b)| *s == 200 || b["code"] == "idempotency_key_in_flight"), "{polled:?}");
    let last = x402_router_testkit::wait_until(std::time::Duration::from_secs(30), "the paid answer", || {
        let p = poll(0);
        async move { p.await.0 == 200 }
    })
    .await;
    assert!(last.is_ok());
    assert_eq!(count(&db, "SELECT count(*) AS n FROM payments").await, 1);
    assert_eq!(moved(&chain).await - before, U256::from(PRICE));
    assert_eq!(paid_at_upstream(&chain).await, 1);
}

/// Under the two-person rule a held payment is approved by a named admin: the bootstrap
/// `OPERATOR_TOKEN` names nobody (it may be any admin's), so its approval is refused and
/// nothing is signed; it may still deny.
#[actix_web::test]
async fn under_the_two_person_rule_the_bootstrap_token_cannot_approve_a_payment() {
    const BOOTSTRAP: &str = "bootstrap-token-for-approval-tests-0123";
    let chain = Devnet::start().await;
    let mut extra = chain.router_extra();
    extra.extend([
        ("require-second-admin".to_owned(), "true".to_owned()),
        ("operator-token".to_owned(), BOOTSTRAP.to_owned()),
    ]);
    let app = spawn_app_with(AppOptions { acquire_timeout_ms: 10_000, extra, ..Default::default() }).await;
    set(&app.db, &app.agent, "approval_above = 0").await;
    let before = moved(&chain).await;
    let (key, body) = (new_key(), body(&chain));
    let id = held(&app, &key, &body).await;
    let (status, refused) = decide(&app, BOOTSTRAP, &id, "approve").await;
    assert_eq!((status, refused["code"].as_str()), (403, Some("own_change")), "{refused}");
    assert_eq!(held(&app, &key, &body).await, id, "still held");
    assert_eq!((moved(&chain).await, paid_at_upstream(&chain).await), (before, 0));

    let ada = admin(&app, "ada").await;
    assert_eq!(decide(&app, &ada, &id, "approve").await.0, 200);
    assert_eq!(call(&app, &key, &body).await.0, 200);
    assert_eq!(paid_at_upstream(&chain).await, 1);

    let (other_key, other_body) =
        (new_key(), json!({"url": chain.url("/v2/weather?second=1"), "max_amount": "100000"}));
    let second = held(&app, &other_key, &other_body).await;
    assert_eq!(decide(&app, BOOTSTRAP, &second, "deny").await.0, 200, "the bootstrap token may still stop a payment");
}
