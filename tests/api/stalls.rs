//! Stalls and lost acknowledgements (issue: "no stall can re-execute a call or lose a held
//! result"): a lease lost before a payment leaves, a heartbeat that finds its lease gone, the
//! route deadline landing during the settlement check, a lost `COMMIT` acknowledgement, and an
//! outcome that cannot be stored. Deterministic fault points (`x402_router::faults`) pause the
//! owner at an exact step instead of sleeping.

use std::sync::Arc;
use std::time::{Duration, Instant};
use x402_router_testkit::Deadline;
use x402_router_testkit::wait::let_time_pass;

use serde_json::{Value, json};
use tokio::sync::{Mutex, Notify};
use x402_router::faults::{Hook, Inject, Point};
use x402_router::startup::Hooks;

use crate::helpers::*;

/// A hook that pauses the owner at `point` (once) until the test releases it.
pub(crate) struct Pause {
    pub(crate) reached: Arc<Notify>,
    pub(crate) release: Arc<Notify>,
}

pub(crate) fn pause_at(point: Point) -> (Hook, Pause) {
    let (reached, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let done = Arc::new(Mutex::new(false));
    let (r, l) = (Arc::clone(&reached), Arc::clone(&release));
    let hook: Hook = Arc::new(move |p| {
        let (r, l, done) = (Arc::clone(&r), Arc::clone(&l), Arc::clone(&done));
        Box::pin(async move {
            let mut first = done.lock().await;
            if p == point && !*first {
                *first = true;
                drop(first);
                r.notify_one();
                l.notified().await;
            }
            Inject::Nothing
        })
    });
    (hook, Pause { reached, release })
}

pub(crate) async fn steal_lease(app: &TestApp, key: &str) {
    let n = exec(&app.db, &format!("UPDATE idempotency_keys SET lease = gen_random_uuid() WHERE key = '{key}'")).await;
    assert_eq!(n, 1);
}

#[actix_web::test]
async fn an_owner_that_lost_its_lease_while_paused_before_paying_sends_no_payment() {
    let chain = Devnet::start().await;
    let (hook, pause) = pause_at(Point::BeforePaidSend);
    let hooks = Hooks { at: Some(hook), ..Default::default() };
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), hooks, ..Default::default() }).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    let call = spawn_route(&app.client, &app.address, &app.agent, &key, &body);
    tokio::time::timeout(Duration::from_secs(20), pause.reached.notified()).await.expect("the owner reaches the send");
    // Meanwhile the owner was presumed dead and the key taken over.
    steal_lease(&app, &key).await;
    pause.release.notify_one();
    let resp = call.await.unwrap().unwrap();
    assert_eq!(resp.status(), 409);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["code"], "superseded");
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 0, "no payment left the router");
}

#[actix_web::test]
async fn an_owner_whose_heartbeat_finds_the_lease_gone_stops_before_its_answer() {
    let up = TestUpstream::start().await;
    let app = spawn_app_with(AppOptions { heartbeat_ms: 50, abandon_ms: 60_000, ..Default::default() }).await;
    let key = new_key();
    let body = json!({"url": up.url("/slow/lease?ms=20000")});
    let started = Instant::now();
    let call = spawn_route(&app.client, &app.address, &app.agent, &key, &body);
    let mut reached =
        Deadline::after(Duration::from_secs(10), "the upstream call started").every(Duration::from_millis(10));
    while up.hits.get("/slow/lease") == 0 {
        reached.next_poll().await.unwrap();
    }
    steal_lease(&app, &key).await;
    let resp = call.await.unwrap().unwrap();
    assert_eq!(resp.status(), 409);
    assert!(started.elapsed() < Duration::from_secs(15), "stopped without waiting for the upstream");
    assert_eq!(app.receipt_rows().await, 0, "a stopped owner records nothing");
}

#[actix_web::test]
async fn the_deadline_during_the_settlement_check_keeps_the_answer_and_writes_a_receipt() {
    let chain = Devnet::start().await;
    let (hook, pause) = pause_at(Point::BeforeConfirm);
    let hooks = Hooks { at: Some(hook), ..Default::default() };
    let app =
        spawn_app_with(AppOptions { extra: chain.router_extra(), hooks, deadline_ms: 3000, ..Default::default() })
            .await;
    let key = new_key();
    // The lying route claims a settlement the chain never shows: confirming would poll past
    // the deadline.
    let body = json!({"url": chain.url("/v2/lie"), "max_amount": "10000"});
    let call = spawn_route(&app.client, &app.address, &app.agent, &key, &body);
    tokio::time::timeout(Duration::from_secs(20), pause.reached.notified()).await.expect("the answer arrives");
    // Hold the owner until the route deadline has passed, then let it go on.
    // lets time pass: the 3 s route deadline is wall time; nothing signals it has passed.
    let_time_pass(Duration::from_millis(3200)).await;
    pause.release.notify_one();
    let resp = call.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200, "the upstream's answer is kept");
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["status"], 200);
    assert_eq!(env["payment"]["status"], "unknown", "{env}");
    assert!(env["receipt_id"].is_string());
    assert_eq!(app.receipt_rows().await, 1);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'unknown'").await, 1);
}

#[actix_web::test]
async fn a_lost_commit_acknowledgement_is_read_back_not_answered_503() {
    let up = TestUpstream::start().await;
    let lost_once = Arc::new(Mutex::new(false));
    let flag = Arc::clone(&lost_once);
    let hook: Hook = Arc::new(move |p| {
        let flag = Arc::clone(&flag);
        Box::pin(async move {
            let mut lost = flag.lock().await;
            if p == Point::AfterCommit && !*lost {
                *lost = true;
                return Inject::ConnectionLost;
            }
            Inject::Nothing
        })
    });
    let app =
        spawn_app_with(AppOptions { hooks: Hooks { at: Some(hook), ..Default::default() }, ..Default::default() })
            .await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/commit")});
    let first = app.route(&key, &body).await;
    assert_eq!(first.status(), 200);
    assert!(*lost_once.lock().await, "the acknowledgement was lost once");
    let first = first.bytes().await.unwrap();
    assert_eq!(app.receipt_rows().await, 1);
    let replay = app.route(&key, &body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(replay.bytes().await.unwrap(), first);
    assert_eq!(up.hits.get("/ok/commit"), 1);
}

/// Makes the app's database refuse to store any answer mentioning "poison": a data error no
/// retry can fix.
pub(crate) async fn refuse_poisoned_answers(app: &TestApp) {
    exec(
        &app.db,
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF position('poison' in convert_from(NEW.response_body, 'UTF8')) > 0 THEN \
             RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$",
    )
    .await;
    exec(
        &app.db,
        "CREATE TRIGGER refuse_poison BEFORE UPDATE ON idempotency_keys FOR EACH ROW \
           WHEN (NEW.response_body IS NOT NULL) EXECUTE FUNCTION refuse_poison()",
    )
    .await;
}

#[actix_web::test]
async fn an_outcome_that_cannot_be_stored_finishes_the_key_errored_and_is_never_executed_again() {
    let up = TestUpstream::start().await;
    let app = spawn_app_with(AppOptions { abandon_ms: 1000, heartbeat_ms: 300, ..Default::default() }).await;
    // A data error no retry can fix: this database refuses any answer mentioning "poison".
    refuse_poisoned_answers(&app).await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/poison")});
    let first = app.route(&key, &body).await;
    assert_eq!(first.status(), 502);
    let first_bytes = first.bytes().await.unwrap();
    let env: Value = serde_json::from_slice(&first_bytes).unwrap();
    assert_eq!(env["code"], "internal_error");
    assert!(env["receipt_id"].is_string(), "the call that reached the upstream has a receipt");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM idempotency_keys WHERE status = 'errored'").await, 1);
    // Past the abandonment window, a retry replays; the upstream is never called again.
    exec(&app.db, "UPDATE idempotency_keys SET created_at = now() - interval '1 hour'").await;
    let again = app.route(&key, &body).await;
    assert_eq!(again.status(), 502);
    assert_eq!(again.bytes().await.unwrap(), first_bytes);
    assert_eq!(up.hits.get("/ok/poison"), 1);
}

#[actix_web::test]
async fn a_call_that_broke_off_after_reaching_the_upstream_has_a_receipt() {
    let up = TestUpstream::start().await;
    let app = spawn_app_with(AppOptions { upstream_timeout_ms: 300, ..Default::default() }).await;
    let resp = app.route(&new_key(), &json!({"url": up.url("/slow/timeout?ms=3000")})).await;
    assert_eq!(resp.status(), 504);
    let env: Value = resp.json().await.unwrap();
    assert!(env["receipt_id"].is_string(), "{env}");
    assert_eq!(app.receipt_rows().await, 1);
    // Never reached (nothing listens there): no receipt.
    let closed = format!("http://127.0.0.1:{}/x", free_port());
    let resp = app.route(&new_key(), &json!({"url": closed})).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(app.receipt_rows().await, 1);
}
