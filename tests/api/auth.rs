//! Agent authentication and isolation.

use serde_json::{Value, json};
use x402_router_testkit::Deadline;

use crate::helpers::*;

#[actix_web::test]
async fn missing_or_unknown_keys_are_401_and_disabled_agents_403() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let body = json!({"url": up.url("/ok")});
    let url = format!("{}/route", app.address);

    let none = app.client.post(&url).header("Idempotency-Key", new_key()).json(&body).send().await.unwrap();
    assert_eq!(none.status(), 401);
    let err: Value = none.json().await.unwrap();
    assert_eq!(err["error"], "missing or unknown API key");
    assert_eq!(err["code"], "unauthorized");
    for bad in ["x4r_not-a-real-key", "Bearer", "sk_live_whatever"] {
        let r = app
            .client
            .post(&url)
            .bearer_auth(bad)
            .header("Idempotency-Key", new_key())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{bad}");
    }
    exec(&app.db, &format!("UPDATE agents SET disabled = true WHERE id = '{}'", app.agent.id)).await;
    let disabled = app.route(&new_key(), &body).await;
    assert_eq!(disabled.status(), 403);
    let err: Value = disabled.json().await.unwrap();
    assert_eq!(err["error"], "agent is disabled");
    assert_eq!(err["code"], "agent_disabled");
    assert_eq!(up.hits.total(), 0);
    assert_eq!(app.idempotency_rows().await, 0);
}

#[actix_web::test]
async fn agents_are_isolated_keys_and_receipts() {
    let app = spawn_app().await;
    let other = create_agent(&app.db, "other").await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/iso")});

    let mine: Value = app.route(&key, &body).await.json().await.unwrap();
    // Same key, other agent: its own fresh execution, not a replay of mine.
    let theirs = app.route_as(&other, &key, &body).await;
    assert_eq!(theirs.status(), 200);
    assert!(theirs.headers().get("x-idempotent-replay").is_none());
    let theirs: Value = theirs.json().await.unwrap();
    assert_ne!(mine["receipt_id"], theirs["receipt_id"]);
    assert_eq!(up.hits.get("/ok/iso"), 2);
    // A different body under the same key is not a conflict across agents.
    assert_eq!(app.route_as(&other, &new_key(), &json!({"url": up.url("/ok/x")})).await.status(), 200);

    let my_receipt = mine["receipt_id"].as_str().unwrap();
    let own = app
        .client
        .get(format!("{}/receipts/{my_receipt}", app.address))
        .bearer_auth(&app.agent.key)
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 200);
    let receipt: Value = own.json().await.unwrap();
    assert_eq!(receipt["agent_id"], app.agent.id.to_string());
    assert_eq!(receipt["idempotency_key"], key);
    assert!(x402_router::receipts::Receipt::verify_json(&receipt.to_string()).is_ok());

    let foreign =
        app.client.get(format!("{}/receipts/{my_receipt}", app.address)).bearer_auth(&other.key).send().await.unwrap();
    assert_eq!(foreign.status(), 404, "another agent's receipt does not exist for them");
}

#[actix_web::test]
async fn a_disabled_agent_is_refused_within_the_agent_cache_ttl() {
    use std::time::{Duration, Instant};
    use x402_router::auth::cache::TTL;

    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let body = json!({"url": up.url("/ok/ttl")});
    // Authenticated once: the router now holds the agent as enabled for at most TTL.
    assert_eq!(app.route(&new_key(), &body).await.status(), 200);
    exec(&app.db, &format!("UPDATE agents SET disabled = true WHERE id = '{}'", app.agent.id)).await;
    let disabled_at = Instant::now();
    let mut polling = Deadline::after(TTL * 2, "the agent to be refused").every(Duration::from_millis(50));
    loop {
        let sent = Instant::now();
        let resp = app.route(&new_key(), &body).await;
        if resp.status() == 403 {
            break;
        }
        assert_eq!(resp.status(), 200);
        assert!(sent < disabled_at + TTL, "served {:?} after the agent was disabled (TTL {TTL:?})", sent - disabled_at);
        polling.next_poll().await.unwrap();
    }
    // Once refused, always refused.
    for _ in 0..3 {
        assert_eq!(app.route(&new_key(), &body).await.status(), 403);
    }
}
