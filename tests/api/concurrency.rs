//! Races for real: many tasks, several router processes, paused and killed processes.

use std::sync::Arc;
use std::time::{Duration, Instant};
use x402_router_testkit::Deadline;
use x402_router_testkit::{wait::let_time_pass, wait_until};

use futures_util::future::join_all;
use serde_json::{Value, json};

use crate::helpers::*;

/// Counts the answers of a burst: (executed 200s, replays, 409s, other).
fn tally(statuses: &[(u16, bool)]) -> (usize, usize, usize, usize) {
    let fresh = statuses.iter().filter(|(s, r)| *s == 200 && !r).count();
    let replays = statuses.iter().filter(|(s, r)| *s == 200 && *r).count();
    let conflicts = statuses.iter().filter(|(s, _)| *s == 409).count();
    (fresh, replays, conflicts, statuses.len() - fresh - replays - conflicts)
}

async fn status_and_replay(resp: reqwest::Response) -> (u16, bool) {
    (resp.status().as_u16(), resp.headers().get("x-idempotent-replay").is_some())
}

#[actix_web::test]
async fn fifty_concurrent_same_key_requests_execute_exactly_once() {
    let app = Arc::new(spawn_app().await);
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/slow/fifty?ms=300")});
    let results = join_all((0..50).map(|_| {
        let (app, key, body) = (Arc::clone(&app), key.clone(), body.clone());
        async move { status_and_replay(app.route(&key, &body).await).await }
    }))
    .await;
    let (fresh, replays, conflicts, other) = tally(&results);
    assert_eq!(fresh, 1, "{results:?}");
    assert_eq!(other, 0, "{results:?}");
    assert_eq!(fresh + replays + conflicts, 50);
    assert_eq!(up.hits.get("/slow/fifty"), 1);
    assert_eq!(app.receipt_rows().await, 1);
}

#[actix_web::test]
async fn three_router_processes_sharing_one_ledger_execute_a_key_once() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "multi").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions::default();
    let routers = [
        RouterProcess::spawn(&db.url, &opts, &prefix).await,
        RouterProcess::spawn(&db.url, &opts, &prefix).await,
        RouterProcess::spawn(&db.url, &opts, &prefix).await,
    ];
    let up = TestUpstream::start().await;
    let client = reqwest::Client::new();

    for round in 0..3 {
        let key = new_key();
        let path = format!("/slow/procs-{round}");
        let body = json!({"url": up.url(&format!("{path}?ms=200"))});
        let results = join_all((0..60).map(|i| {
            let (client, addr, agent, key, body) =
                (client.clone(), routers[i % 3].address.clone(), agent.clone(), key.clone(), body.clone());
            async move { status_and_replay(route_at(&client, &addr, &agent, &key, &body).await).await }
        }))
        .await;
        let (fresh, _, _, other) = tally(&results);
        assert_eq!((fresh, other), (1, 0), "round {round}: {results:?}");
        assert_eq!(up.hits.get(&path), 1, "round {round}");
    }
    assert_eq!(count(&db, "SELECT count(*) AS n FROM receipts").await, 3);
}

#[actix_web::test]
async fn slow_but_alive_request_is_not_taken_over_thanks_to_its_heartbeat() {
    // Abandonment after 1 s of silence; the owner beats every 200 ms and runs 2.5 s.
    let app = Arc::new(
        spawn_app_with(AppOptions { abandon_ms: 1000, heartbeat_ms: 200, deadline_ms: 10_000, ..Default::default() })
            .await,
    );
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/slow/alive?ms=2500")});
    let first = {
        let (app, key, body) = (Arc::clone(&app), key.clone(), body.clone());
        tokio::spawn(async move { app.route(&key, &body).await })
    };
    for _ in 0..3 {
        // lets time pass: more than the abandonment window elapses while the owner is alive.
        let_time_pass(Duration::from_millis(600)).await;
        let retry = app.route(&key, &body).await;
        assert_eq!(retry.status(), 409, "a live owner must not be taken over");
    }
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(up.hits.get("/slow/alive"), 1);
    assert_eq!(count(&app.db, "SELECT takeovers::bigint AS n FROM idempotency_keys").await, 0);
}

#[actix_web::test]
async fn stale_owner_is_fenced_and_cannot_overwrite_the_new_owner_or_write_a_receipt() {
    // Router A owns the key, then freezes (SIGSTOP: its heartbeat stops). Router B takes
    // over after the threshold and completes. When A thaws and finishes, its write must
    // match no row.
    let db = TestDb::new().await;
    let agent = create_agent(&db, "fence").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions { abandon_ms: 1000, heartbeat_ms: 200, deadline_ms: 20_000, ..Default::default() };
    let a = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let b = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let up = TestUpstream::start().await;
    let client = reqwest::Client::new();
    let key = new_key();
    let body = json!({"url": up.url("/slow/fence?ms=1500")});

    let a_call = {
        let (client, addr, agent, key, body) =
            (client.clone(), a.address.clone(), agent.clone(), key.clone(), body.clone());
        tokio::spawn(async move { route_at(&client, &addr, &agent, &key, &body).await })
    };
    wait_until(Duration::from_secs(10), "A to reach the upstream", || async { up.hits.get("/slow/fence") > 0 })
        .await
        .unwrap();
    assert_eq!(up.hits.get("/slow/fence"), 1, "A reached the upstream");
    a.signal("STOP");
    // lets time pass: the frozen owner's heartbeat ages past the 1 s abandonment window.
    let_time_pass(Duration::from_millis(1600)).await;

    let b_resp = route_at(&client, &b.address, &agent, &key, &body).await;
    assert_eq!(b_resp.status(), 200, "B took over the abandoned key");
    let b_body: Value = b_resp.json().await.unwrap();
    assert_eq!(up.hits.get("/slow/fence"), 2);

    a.signal("CONT");
    let a_resp = a_call.await.unwrap();
    assert_eq!(a_resp.status(), 409, "the stale owner learns it was superseded");
    let a_body: Value = a_resp.json().await.unwrap();
    assert!(a_body["error"].as_str().unwrap().contains("superseded"));

    // Exactly B's receipt, and the row holds B's response.
    assert_eq!(count(&db, "SELECT count(*) AS n FROM receipts").await, 1);
    let replay = route_at(&client, &b.address, &agent, &key, &body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(replay.json::<Value>().await.unwrap(), b_body);
    let via_a = route_at(&client, &a.address, &agent, &key, &body).await;
    assert_eq!(via_a.json::<Value>().await.unwrap(), b_body);
}

#[actix_web::test]
async fn killed_router_leaves_an_in_flight_key_that_is_409_until_abandoned_then_runs_once_more() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "kill").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions { abandon_ms: 2000, heartbeat_ms: 500, deadline_ms: 20_000, ..Default::default() };
    let mut a = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let b = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let up = TestUpstream::start().await;
    let client = reqwest::Client::new();
    let key = new_key();
    let body = json!({"url": up.url("/slow/kill?ms=3000")});

    let a_call = spawn_route(&client, &a.address, &agent, &key, &body);
    wait_until(Duration::from_secs(10), "A to reach the upstream", || async { up.hits.get("/slow/kill") > 0 })
        .await
        .unwrap();
    a.kill9().await;
    assert!(a_call.await.unwrap().is_err(), "the killed router never answered");
    let killed_at = Instant::now();

    let early = route_at(&client, &b.address, &agent, &key, &body).await;
    assert_eq!(early.status(), 409, "retry before abandonment");
    assert_eq!(early.headers().get("retry-after").unwrap(), "5");

    // lets time pass: the killed owner's heartbeat ages past the abandonment window.
    let_time_pass(Duration::from_millis(2300).saturating_sub(killed_at.elapsed())).await;
    let late = route_at(&client, &b.address, &agent, &key, &body).await;
    assert_eq!(late.status(), 200, "retry after abandonment executes");
    assert_eq!(up.hits.get("/slow/kill"), 2, "once by the killed router, once by the takeover");
    assert_eq!(count(&db, "SELECT count(*) AS n FROM receipts").await, 1);
    let replay = route_at(&client, &b.address, &agent, &key, &body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(up.hits.get("/slow/kill"), 2);
}

#[actix_web::test]
async fn concurrent_retries_of_an_abandoned_key_elect_exactly_one_new_owner() {
    let app = Arc::new(spawn_app().await);
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/slow/elect?ms=300")});
    insert_in_flight(&app.db, app.agent.id, &key, &body, 120).await;
    let results = join_all((0..30).map(|_| {
        let (app, key, body) = (Arc::clone(&app), key.clone(), body.clone());
        async move { status_and_replay(app.route(&key, &body).await).await }
    }))
    .await;
    let (fresh, _, _, other) = tally(&results);
    assert_eq!((fresh, other), (1, 0), "{results:?}");
    assert_eq!(up.hits.get("/slow/elect"), 1);
    assert_eq!(count(&app.db, "SELECT takeovers::bigint AS n FROM idempotency_keys").await, 1);
}

#[actix_web::test]
async fn a_router_frozen_inside_reserve_releases_the_agent_lock_and_nobody_is_taken_over() {
    use diesel_async::SimpleAsyncConnection;
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "frozen").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    // Short abandonment; small main pools that the queued payments drain; Postgres ends the
    // frozen router's session after 2.5 s idle in its transaction: the calls queue on the
    // agent's lock longer than the abandonment window.
    let opts = AppOptions {
        abandon_ms: 1500,
        heartbeat_ms: 300,
        deadline_ms: 20_000,
        acquire_timeout_ms: 20_000,
        extra: [
            chain.router_extra(),
            vec![
                ("database-pool-size".into(), "3".into()),
                ("db-lock-timeout-ms".into(), "15000".into()),
                ("db-idle-in-transaction-timeout-ms".into(), "2500".into()),
            ],
        ]
        .concat(),
        ..Default::default()
    };
    let frozen = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let routers =
        [RouterProcess::spawn(&db.url, &opts, &prefix).await, RouterProcess::spawn(&db.url, &opts, &prefix).await];
    // Retries go through a router whose own pool is not drained.
    let retrier = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});

    // Stop the frozen router inside its reserve transaction, holding the agent's lock: an
    // uncommitted intent for its key makes its intent insert wait (after the agent lock).
    let key = new_key();
    let mut blocker = db.conn().await;
    blocker
        .batch_execute(&format!(
            "BEGIN; {}",
            Seed::new(agent.id, "signed")
                .key(&key)
                .asset("0xblock")
                .pay_to("0xblock")
                .nonce("0xblock")
                .amount(1)
                .signed("{}", "x")
                .request_hash(&request_hash(&body))
                .sql()
        ))
        .await
        .unwrap();
    let frozen_call = spawn_route(&client, &frozen.address, &agent, &key, &body);
    wait_for_lock_waiter(&db).await;
    frozen.signal("STOP");
    blocker.batch_execute("ROLLBACK").await.unwrap();

    // 30 paid calls of the same agent on the two other routers.
    let keys: Vec<String> = (0..30).map(|_| new_key()).collect();
    let calls: Vec<_> =
        keys.iter().enumerate().map(|(i, k)| spawn_route(&client, &routers[i % 2].address, &agent, k, &body)).collect();
    // Once every call owns its key, and while they queue on the agent's lock, retry every
    // key, well past the abandonment window: a live owner must never be taken over.
    let claimed = "SELECT count(*) AS n FROM idempotency_keys WHERE key LIKE 'test-%'";
    let mut deadline =
        Deadline::after(Duration::from_secs(20), "the calls never claimed their keys").every(Duration::from_millis(20));
    while count(&db, claimed).await < 31 {
        deadline.next_poll().await.unwrap();
    }
    let mut fresh_retries = vec![];
    let mut ticker = tokio::time::interval(Duration::from_millis(300));
    while calls.iter().any(|c| !c.is_finished()) {
        ticker.tick().await;
        for k in &keys {
            let r = route_at(&client, &retrier.address, &agent, k, &body).await;
            let (status, replay) = (r.status().as_u16(), r.headers().get("x-idempotent-replay").is_some());
            if !(status == 409 || (status == 200 && replay)) {
                fresh_retries.push((k.clone(), status));
            }
        }
    }
    let mut statuses = vec![];
    for c in calls {
        statuses.push(c.await.unwrap().unwrap().status().as_u16());
    }
    assert!(fresh_retries.is_empty(), "retries executed or failed: {fresh_retries:?}");
    assert_eq!(statuses, vec![200; 30], "every call paid once the frozen router's lock was released");
    assert_eq!(count(&db, "SELECT COALESCE(sum(takeovers), 0)::bigint AS n FROM idempotency_keys").await, 0);
    let stats = &chain.stats().await["/v2/weather"];
    assert_eq!(stats["paid"], 30, "{stats}");
    assert_eq!(stats["payment_attempts"], 30, "{stats}");
    // Unpaid probes: the frozen router's, and each router's until it knows the terms (then it
    // pays with the first request; src/upstream/known_terms.rs).
    let probes = stats["requests"].as_u64().unwrap() - 30;
    assert!((3..=31).contains(&probes), "at most one unpaid probe per key, the frozen router's included: {stats}");

    // The frozen router's transaction was ended by Postgres: its intent never committed.
    frozen.signal("CONT");
    let frozen_answer = frozen_call.await.unwrap().unwrap().status().as_u16();
    // 503: its session was ended, nothing decided; 504: its deadline passed while it was stopped.
    assert!(matches!(frozen_answer, 503 | 504), "{frozen_answer}");
    assert_eq!(count(&db, &format!("SELECT count(*) AS n FROM payments WHERE idempotency_key = '{key}'")).await, 0);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await, 30);
}
