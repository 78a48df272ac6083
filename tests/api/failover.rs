//! Postgres failover under a running router: a primary and a synchronous standby of its
//! own per test (streaming replication), the router given both hosts with
//! `target_session_attrs=read-write`, the standby promoted. `scripts/failover` does the same
//! under paid and free load through two routers and counts the money (RELIABILITY.md).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::pg_replication::PgPair;
use crate::helpers::tls_services::{TestPki, wait_until};
use crate::helpers::*;

/// Migrates the database and creates an agent through the CLI, on `url`.
fn prepare(url: &str) -> Agent {
    let out = router_command().arg("migrate").env("DATABASE_URL", url).output().unwrap();
    assert!(out.status.success(), "migrate: {}", String::from_utf8_lossy(&out.stderr));
    let out = router_command()
        .args(["agents", "create", "--name", "failover-agent"])
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    assert!(out.status.success(), "agents create: {}", String::from_utf8_lossy(&out.stderr));
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    Agent { id: line["agent_id"].as_str().unwrap().parse().unwrap(), key: line["api_key"].as_str().unwrap().into() }
}

async fn status_of(client: &reqwest::Client, router: &RouterProcess, agent: &Agent, key: &str, body: &Value) -> u16 {
    let req = client
        .post(format!("{}/route", router.address))
        .bearer_auth(&agent.key)
        .header("Idempotency-Key", key)
        .json(body)
        .timeout(Duration::from_secs(10));
    req.send().await.map(|r| r.status().as_u16()).unwrap_or(0)
}

#[actix_web::test]
async fn the_router_serves_again_once_the_standby_is_promoted_and_keeps_every_committed_call() {
    let pki = TestPki::generate(&["127.0.0.1"]);
    let mut pair = PgPair::start(Some(&pki)).await;
    pair.exec(pair.primary.port, "CREATE DATABASE x4r").await;
    // Both hosts, TLS verified against the test CA on each.
    let url = pair.conninfo("x4r", &format!("sslmode=verify-full sslrootcert={}", pki.ca.display()));
    let agent = prepare(&url);
    let upstream = TestUpstream::start().await;
    let router = RouterProcess::spawn(&url, &AppOptions::default(), "test:failover:").await;
    let client = reqwest::Client::new();
    let body = json!({"url": upstream.url("/ok")});
    let mut answered = Vec::new();
    for _ in 0..5 {
        let key = new_key();
        assert_eq!(status_of(&client, &router, &agent, &key, &body).await, 200);
        answered.push(key);
    }

    pair.crash_primary();
    pair.promote_standby();
    let promoted = Instant::now();
    wait_until("the router to serve a new call on the promoted standby", Duration::from_secs(30), async || {
        status_of(&client, &router, &agent, &new_key(), &body).await == 200
    })
    .await;
    let recovery = promoted.elapsed();

    // Synchronous replication: every call answered before the primary died is on the new
    // primary, so each replays instead of running again.
    let upstream_calls = upstream.hits.total();
    for key in &answered {
        let resp = route_at(&client, &router.address, &agent, key, &body).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers().get("x-idempotent-replay").map(|v| v.to_str().unwrap()), Some("true"));
    }
    assert_eq!(upstream.hits.total(), upstream_calls, "a replay reached the upstream");
    let keys = answered.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(",");
    let kept = format!(
        "SELECT count(*) FROM idempotency_keys k JOIN receipts r ON r.agent_id = k.agent_id AND r.id = k.receipt_id \
          WHERE k.key IN ({keys}) AND k.status = 'completed'"
    );
    assert_eq!(pair.query_in(pair.standby.port, "x4r", &kept).await.as_deref(), Some("5"));
    assert!(recovery < Duration::from_secs(30), "{recovery:?}");
}

#[actix_web::test]
async fn connections_to_a_primary_that_turned_read_only_are_dropped_and_the_new_primary_is_found() {
    let mut pair = PgPair::start(None).await;
    pair.exec(pair.primary.port, "CREATE DATABASE x4r").await;
    let url = pair.conninfo("x4r", "sslmode=disable");
    let agent = prepare(&url);
    let upstream = TestUpstream::start().await;
    let router = RouterProcess::spawn(&url, &AppOptions::default(), "test:failover-ro:").await;
    let client = reqwest::Client::new();
    let body = json!({"url": upstream.url("/ok")});
    // The router's pool now holds connections to the primary.
    for _ in 0..4 {
        assert_eq!(status_of(&client, &router, &agent, &new_key(), &body).await, 200);
    }

    // The old primary is fenced (read-only, still up, first in the host list) and the standby
    // promoted: open connections to the old one must go, new ones must skip it.
    pair.exec(pair.primary.port, "ALTER SYSTEM SET default_transaction_read_only = on").await;
    pair.exec(pair.primary.port, "SELECT pg_reload_conf()").await;
    pair.promote_standby();
    wait_until("the router to write on the new primary", Duration::from_secs(30), async || {
        status_of(&client, &router, &agent, &new_key(), &body).await == 200
    })
    .await;
    // Every pooled connection now reaches the new primary: a burst of calls all succeed.
    for _ in 0..8 {
        assert_eq!(status_of(&client, &router, &agent, &new_key(), &body).await, 200);
    }
    pair.crash_primary();
}
