//! Operations: metrics, readiness, graceful shutdown.

use std::time::Duration;
use x402_router_testkit::wait_until;

use serde_json::json;

use crate::helpers::*;

fn metric(text: &str, name_and_labels: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name_and_labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[actix_web::test]
async fn metrics_counters_move_as_requests_are_made() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let scrape = || async { app.metrics_text().await };
    let before = scrape().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/metrics")});
    app.route(&key, &body).await;
    app.route(&key, &body).await;
    app.route(&key, &json!({"url": up.url("/ok/other")})).await;
    let after = scrape().await;
    let delta = |m: &str| metric(&after, m) - metric(&before, m);
    assert_eq!(delta(r#"x402_router_idempotency_outcomes_total{outcome="fresh"}"#), 1);
    assert_eq!(delta(r#"x402_router_idempotency_outcomes_total{outcome="replay-redis"}"#), 1);
    assert_eq!(delta(r#"x402_router_idempotency_outcomes_total{outcome="mismatch-409"}"#), 1);
    assert_eq!(delta(r#"x402_router_http_requests_total{route="/route",status="200"}"#), 2);
    assert_eq!(delta(r#"x402_router_http_requests_total{route="/route",status="409"}"#), 1);
    assert!(after.contains("x402_router_upstream_seconds_bucket"));
}

#[actix_web::test]
async fn sigterm_during_a_request_lets_it_complete() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "term").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let mut router = RouterProcess::spawn(&db.url, &AppOptions::default(), &prefix).await;
    let up = TestUpstream::start().await;
    let client = reqwest::Client::new();
    let key = new_key();
    let call = {
        let (client, addr, agent, key) = (client.clone(), router.address.clone(), agent.clone(), key.clone());
        let body = json!({"url": up.url("/slow/term?ms=1500")});
        tokio::spawn(async move { route_at(&client, &addr, &agent, &key, &body).await })
    };
    wait_until(Duration::from_secs(10), "the call to reach the upstream", || async { up.hits.get("/slow/term") > 0 })
        .await
        .unwrap();
    router.signal("TERM");
    let resp = call.await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM idempotency_keys WHERE status = 'completed'").await, 1);
    // New connections are refused once it has stopped.
    assert!(router.wait_exit(Duration::from_secs(10)).await.is_some(), "it exits once drained");
    assert!(client.get(format!("{}/healthz", router.address)).send().await.is_err());
}

#[actix_web::test]
async fn health_and_well_known_describe_the_router() {
    let app = spawn_app().await;
    let health = app.client.get(format!("{}/healthz", app.address)).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert!(health.headers().get("x-request-id").is_some());
    let wk: serde_json::Value =
        app.client.get(format!("{}/.well-known/x402-router", app.address)).send().await.unwrap().json().await.unwrap();
    assert_eq!(wk["receipt_signer"], ROUTER_ADDRESS.to_checksum(None));
    // This router has no payment network: it says it pays with nothing.
    assert_eq!((&wk["x402_versions"], &wk["schemes"], &wk["networks"]), (&json!([]), &json!([]), &json!([])), "{wk}");
    assert_eq!(wk["unit"], serde_json::Value::Null, "no unit to show amounts in");
}
