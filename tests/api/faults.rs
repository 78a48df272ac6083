//! Infrastructure failures: Redis gone, Postgres gone.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;

#[actix_web::test]
async fn with_redis_stopped_every_answer_is_still_correct_and_prompt() {
    let mut redis = PrivateRedis::start().await;
    let app = spawn_app_with(AppOptions { redis_url: redis.url.clone(), ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let done_key = new_key();
    let body = json!({"url": up.url("/ok/redis-down")});
    assert_eq!(app.route(&done_key, &body).await.status(), 200);

    redis.stop();

    let started = Instant::now();
    // Replay of a key completed before Redis died: from Postgres.
    let replay = app.route(&done_key, &body).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    // Mismatch still detected.
    assert_eq!(app.route(&done_key, &json!({"url": up.url("/ok/other")})).await.status(), 409);
    // Fresh keys execute once each.
    for i in 0..5 {
        let key = new_key();
        let b = json!({"url": up.url(&format!("/ok/fresh-{i}"))});
        assert_eq!(app.route(&key, &b).await.status(), 200);
        assert_eq!(app.route(&key, &b).await.headers().get("x-idempotent-replay").unwrap(), "true");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "Redis being down must not stall requests: {:?}",
        started.elapsed()
    );
    assert_eq!(up.hits.get("/ok/redis-down"), 1);
    assert_eq!(up.hits.get("/ok/other"), 0);
    for i in 0..5 {
        assert_eq!(up.hits.get(&format!("/ok/fresh-{i}")), 1);
    }
    let ready: Value = app.client.get(format!("{}/readyz", app.address)).send().await.unwrap().json().await.unwrap();
    assert_eq!(ready["redis"], "unreachable");
    assert_eq!(ready["postgres"], "ok");
}

#[actix_web::test]
async fn redis_that_was_never_reachable_does_not_fail_requests() {
    let app =
        spawn_app_with(AppOptions { redis_url: format!("redis://127.0.0.1:{}", free_port()), ..Default::default() })
            .await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/no-redis")});
    assert_eq!(app.route(&key, &body).await.status(), 200);
    assert_eq!(app.route(&key, &body).await.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(up.hits.get("/ok/no-redis"), 1);
    // Without Redis the key is read first: a key in flight is still decided by the claim
    // statement (409 while its owner lives, taken over once abandoned), a reused key is 409.
    assert_eq!(app.route(&key, &json!({"url": up.url("/ok/other")})).await.status(), 409);
    let (live, abandoned) = (new_key(), new_key());
    let body = json!({"url": up.url("/ok/no-redis-owned")});
    insert_in_flight(&app.db, app.agent.id, &live, &body, 0).await;
    insert_in_flight(&app.db, app.agent.id, &abandoned, &body, 90).await;
    assert_eq!(app.route(&live, &body).await.status(), 409);
    let taken = app.route(&abandoned, &body).await;
    assert_eq!(taken.status(), 200);
    assert!(taken.headers().get("x-idempotent-replay").is_none());
    assert_eq!(up.hits.get("/ok/no-redis-owned"), 1);
    assert_eq!(up.hits.get("/ok/other"), 0);
}

#[actix_web::test]
async fn with_postgres_down_requests_get_503_and_nothing_is_executed() {
    let db = TestDb::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432".into()).await.unwrap();
    let proxied_url = {
        let tail = db.url.rsplit_once('/').unwrap().1;
        format!("postgres://postgres@127.0.0.1:{}/{tail}", proxy.port)
    };
    let app =
        spawn_app_on(std::sync::Arc::new(db), AppOptions { database_url: Some(proxied_url), ..Default::default() })
            .await;
    let up = TestUpstream::start().await;
    let done_key = new_key();
    let body = json!({"url": up.url("/ok/pg")});
    assert_eq!(app.route(&done_key, &body).await.status(), 200);

    proxy.cut();

    for (key, path) in [(new_key(), "/ok/pg-fresh"), (done_key.clone(), "/ok/pg")] {
        let b = json!({"url": up.url(path)});
        let started = Instant::now();
        let resp = app.route(&key, &b).await;
        assert_eq!(resp.status(), 503, "{path}");
        let err: Value = resp.json().await.unwrap();
        assert!(err["error"].as_str().unwrap().contains("unavailable"), "{err}");
        assert_eq!(err["code"], "database_unavailable");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    assert_eq!(up.hits.get("/ok/pg-fresh"), 0, "nothing executed without Postgres");
    assert_eq!(up.hits.get("/ok/pg"), 1);
    let ready = app.client.get(format!("{}/readyz", app.address)).send().await.unwrap();
    assert_eq!(ready.status(), 503);
}

/// Holds an uncommitted in-flight row of `key`, so that a claim of the key waits on it.
async fn hold_uncommitted_claim(app: &TestApp, key: &str, body: &Value) -> diesel_async::AsyncPgConnection {
    use diesel_async::SimpleAsyncConnection;
    let mut writer = app.db.conn().await;
    writer
        .batch_execute(&format!(
            "BEGIN; INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease) \
             VALUES ('{}', '{key}', '{}', 'in_flight', gen_random_uuid())",
            app.agent.id,
            request_hash(body)
        ))
        .await
        .unwrap();
    writer
}

#[actix_web::test]
async fn a_claim_stuck_on_a_lock_is_cut_off_by_the_route_deadline() {
    let app = spawn_app_with(AppOptions { deadline_ms: 1000, ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/stuck-claim")});
    let _writer = hold_uncommitted_claim(&app, &key, &body).await;
    let started = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(10), app.route(&key, &body)).await.expect("the claim waited");
    assert_eq!(resp.status(), 503);
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert_eq!(up.hits.total(), 0);
}

#[actix_web::test]
async fn every_pooled_session_has_a_lock_timeout() {
    let app =
        spawn_app_with(AppOptions { extra: vec![("db-lock-timeout-ms".into(), "300".into())], ..Default::default() })
            .await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/lock-timeout")});
    let _writer = hold_uncommitted_claim(&app, &key, &body).await;
    let started = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(10), app.route(&key, &body)).await.expect("the claim waited");
    assert_eq!(resp.status(), 503, "the lock wait ended by lock_timeout, well before the route deadline");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert_eq!(up.hits.total(), 0);
}
