//! Deterministic fault points, one after another: the owner of a paid call is frozen (the
//! whole owner: its call and its heartbeats) or crashed at each `faults::Point`, another
//! router *process* retries the call until it has a final answer, the frozen owner is let go
//! again, and then the money invariants are checked from the chain's logs and the ledger
//! (`helpers::invariants`): every used nonce on a ledger row, at most one per request, money
//! moved = used authorizations, every used nonce served with a receipt or flagged, nothing
//! left in flight, every replay equal to the key's final answer.

use std::sync::Arc;
use std::time::{Duration, Instant};
use x402_router_testkit::wait::let_time_pass;

use serde_json::{Value, json};
use x402_router::faults::Point;
use x402_router::startup::Hooks;

use crate::helpers::invariants::{self, Target};
use crate::helpers::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGSTOP-like: the owner stops, and goes on after the retry finished (it must be fenced).
    Freeze,
    /// kill -9-like: the owner never runs again; its open transaction dies with its connection.
    Crash,
}

/// POSTs until the answer is final (not "in flight", not 503), honouring `Retry-After` (capped,
/// the test's windows are short). Returns status and body bytes.
async fn until_final(
    client: &reqwest::Client,
    address: &str,
    agent: &Agent,
    key: &str,
    body: &Value,
    limit: Duration,
) -> Option<(u16, Vec<u8>)> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let sent = client
            .post(format!("{address}/route"))
            .bearer_auth(&agent.key)
            .header("Idempotency-Key", key)
            .json(body)
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        let mut wait = Duration::from_millis(100);
        if let Ok(resp) = sent {
            let status = resp.status().as_u16();
            let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            let bytes = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
            let code = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| v["code"].as_str().map(str::to_owned));
            let retry = status == 503 || (status == 409 && code.as_deref() == Some("idempotency_key_in_flight"));
            if !retry {
                return Some((status, bytes));
            }
            wait = Duration::from_secs(retry_after.unwrap_or(1)).min(Duration::from_millis(250));
        }
        // lets time pass: the router's Retry-After (at most 250 ms) before the next attempt.
        let_time_pass(wait).await;
    }
    None
}

/// Every point, frozen or crashed in turn, on one chain and one ledger.
async fn every_point(fault: Fault) {
    let chain = Devnet::start().await;
    let db = Arc::new(TestDb::new().await);
    let timing = |hooks| AppOptions {
        abandon_ms: 1000,
        heartbeat_ms: 200,
        deadline_ms: 20_000,
        extra: chain.router_extra(),
        hooks,
        ..Default::default()
    };
    let retrier = RouterProcess::spawn(&db.url, &timing(Hooks::default()), "faults:").await;
    let client = reqwest::Client::new();
    let mut paid_before = 0;
    for point in Point::ALL {
        let (hook, freezer) = freeze_at(point);
        let owner = spawn_app_on(Arc::clone(&db), timing(Hooks { at: Some(hook), ..Default::default() })).await;
        let key = new_key();
        // A call long enough for a heartbeat to come before the payment when that is the point.
        let path = if point == Point::Heartbeat { "/v2/slow-settle?seconds=1" } else { "/v2/weather" };
        let body = json!({"url": chain.url(path), "max_amount": "10000"});
        match point {
            // A takeover of an intent the previous owner signed and never sent (still valid).
            Point::ResumeStart => crash_after_signing(&owner, &chain, &key, &body, 3600).await,
            // ... or whose validity ran out (re-signed with the same nonce).
            Point::BeforeResign => crash_after_signing(&owner, &chain, &key, &body, -10).await,
            _ => {}
        }
        let first = spawn_route(&owner.client, &owner.address, &owner.agent, &key, &body);
        tokio::time::timeout(Duration::from_secs(30), freezer.reached.notified())
            .await
            .unwrap_or_else(|_| panic!("{point:?}: the owner never reached the point"));
        if fault == Fault::Crash && point == Point::BeforeCommit {
            end_crashed_transaction(&db).await;
        }

        // Another process retries until the call has a final answer.
        let limit = if fault == Fault::Freeze { Duration::from_secs(8) } else { Duration::from_secs(60) };
        let mut last = until_final(&client, &retrier.address, &owner.agent, &key, &body, limit).await;
        if fault == Fault::Freeze {
            // The frozen owner goes on (inside its transaction at BeforeCommit, where nobody
            // could finish before it): fenced unless it had committed, never a second payment.
            freezer.thaw.send_replace(true);
            let own = tokio::time::timeout(Duration::from_secs(60), first).await;
            let own = own.unwrap_or_else(|_| panic!("{point:?}: the thawed owner never answered"));
            let own = own.unwrap().unwrap();
            if last.is_none() {
                assert_eq!(own.status(), 200, "{point:?}: only a committed owner answers itself");
            }
            if last.is_none() {
                last = until_final(&client, &retrier.address, &owner.agent, &key, &body, Duration::from_secs(60)).await;
            }
        } else {
            drop(first);
        }
        let (status, final_body) = last.unwrap_or_else(|| panic!("{point:?}: no final answer"));
        let env: Value = serde_json::from_slice(&final_body).unwrap();
        assert!(matches!(status, 200 | 502), "{point:?}/{fault:?}: final {status} {env}");
        // Every later replay, from either router, is the same answer.
        let routers =
            if fault == Fault::Freeze { vec![&retrier.address, &owner.address] } else { vec![&retrier.address] };
        for address in routers {
            let again = until_final(&client, address, &owner.agent, &key, &body, Duration::from_secs(10)).await;
            assert_eq!(again, Some((status, final_body.clone())), "{point:?}/{fault:?}: replay differs");
        }
        let stats = chain.stats().await;
        let paid: u64 = stats.as_object().unwrap().values().map(|r| r["paid"].as_u64().unwrap()).sum();
        assert!(paid - paid_before <= 1, "{point:?}/{fault:?}: the upstream settled {} times", paid - paid_before);
        paid_before = paid;
        drop(freezer);
    }

    let report = invariants::check(&Target {
        database_url: &db.url,
        rpc_url: &chain.rpc_url,
        token: chain.token,
        payer: ROUTER_ADDRESS,
    })
    .await
    .unwrap();
    assert!(report.violations.is_empty(), "{fault:?}: {:#?}", report.violations);
    assert!(report.used_nonces >= 10, "{fault:?}: most points lead to one payment: {report:?}");
}

#[actix_web::test]
async fn an_owner_frozen_at_any_point_is_fenced_and_nothing_is_paid_twice() {
    every_point(Fault::Freeze).await;
}

#[actix_web::test]
async fn an_owner_crashed_at_any_point_is_taken_over_and_nothing_is_paid_twice() {
    every_point(Fault::Crash).await;
}
