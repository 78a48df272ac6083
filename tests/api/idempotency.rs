//! The seed's ten idempotency scenarios, end to end.

use std::sync::Arc;

use serde_json::{Value, json};
use x402_router::startup::Hooks;

use crate::helpers::*;

#[actix_web::test]
async fn happy_path_executes_once_and_writes_one_receipt() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/happy"), "method": "GET"});

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    let receipt_header = resp.headers().get("x-receipt-id").unwrap().to_str().unwrap().to_owned();
    assert!(resp.headers().get("x-idempotent-replay").is_none());
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["status"], 200);
    assert_eq!(env["body"]["path"], "/ok/happy");
    assert_eq!(env["payment"], Value::Null);
    assert_eq!(env["receipt_id"], receipt_header);

    let again = app.route(&key, &body).await;
    assert_eq!(again.status(), 200);
    assert_eq!(up.hits.get("/ok/happy"), 1);
    assert_eq!(app.receipt_rows().await, 1);
}

#[actix_web::test]
async fn replay_of_completed_key_returns_cached_response_without_reexecuting() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/replay")});
    let first: Value = app.route(&key, &body).await.json().await.unwrap();

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(resp.headers().get("x-receipt-id").unwrap().to_str().unwrap(), first["receipt_id"].as_str().unwrap());
    let second: Value = resp.json().await.unwrap();
    assert_eq!(first, second);
    assert_eq!(up.hits.get("/ok/replay"), 1);
    assert_eq!(app.receipt_rows().await, 1);
}

#[actix_web::test]
async fn errored_call_is_replayed_as_stored_and_never_reexecuted() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/status/503")});

    let first = app.route(&key, &body).await;
    assert_eq!(first.status(), 502);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["status"], 503);
    assert!(first["error"].as_str().unwrap().contains("503"));

    for _ in 0..3 {
        let again = app.route(&key, &body).await;
        assert_eq!(again.status(), 502);
        assert_eq!(again.headers().get("x-idempotent-replay").unwrap(), "true");
        assert_eq!(again.json::<Value>().await.unwrap(), first);
    }
    assert_eq!(up.hits.get("/status/503"), 1);
    let status = count(&app.db, "SELECT count(*) AS n FROM idempotency_keys WHERE status = 'errored'").await;
    assert_eq!(status, 1);
}

#[actix_web::test]
async fn unreachable_upstream_is_errored_and_replayed() {
    let app = spawn_app().await;
    let key = new_key();
    let body = json!({"url": format!("http://127.0.0.1:{}/nothing-listens", free_port())});
    let first = app.route(&key, &body).await;
    assert_eq!(first.status(), 502);
    let first: Value = first.json().await.unwrap();
    assert!(first["error"].as_str().unwrap().contains("unreachable"), "{first}");
    let again = app.route(&key, &body).await;
    assert_eq!(again.status(), 502);
    assert_eq!(again.headers().get("x-idempotent-replay").unwrap(), "true");
}

#[actix_web::test]
async fn same_key_with_different_body_is_a_conflict() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    assert_eq!(app.route(&key, &json!({"url": up.url("/ok/a")})).await.status(), 200);

    for other in [json!({"url": up.url("/ok/b")}), json!({"url": up.url("/ok/a"), "max_amount": "1"})] {
        let resp = app.route(&key, &other).await;
        assert_eq!(resp.status(), 409);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "Idempotency-Key reused with different body");
        assert_eq!(body["code"], "idempotency_key_reused");
    }
    // Same mismatch answer when only Postgres knows the key (Redis entry removed).
    app.db.conn().await; // keep db alive
    app.forget_cached(&key).await;
    let resp = app.route(&key, &json!({"url": up.url("/ok/b")})).await;
    assert_eq!(resp.status(), 409);
    assert_eq!(up.hits.get("/ok/b"), 0);
}

#[actix_web::test]
async fn a_replay_is_known_by_its_fingerprint_and_anything_else_is_validated_first() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let url = up.url("/ok/fingerprint");
    let first =
        app.route_raw(Some(&key), format!(r#"{{"url":"{url}","headers":{{"b":"2","a":"1"}}}}"#).into_bytes()).await;
    assert_eq!(first.status(), 200);
    // The same request spelled otherwise (member order, whitespace): the same fingerprint,
    // answered from the stored call without being executed again.
    let again = app
        .route_raw(
            Some(&key),
            format!("{{ \"headers\" : {{\"a\":\"1\",\"b\":\"2\"}},\n \"url\" : \"{url}\" }}").into_bytes(),
        )
        .await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers().get("x-idempotent-replay").unwrap(), "true");
    // Under the same key, a body that is not a valid call is a 400 naming the problem, not a
    // 409: with the Redis entry present, and with only Postgres knowing the key.
    let invalid = [
        json!({"url": "ftp://example.com/x"}),
        json!({"url": url.clone(), "method": "TRACE"}),
        json!({"url": url.clone(), "unknown": 1}),
        json!({"url": url.clone(), "max_amount": "-1"}),
    ];
    for round in ["redis", "postgres"] {
        if round == "postgres" {
            app.forget_cached(&key).await;
        }
        for body in &invalid {
            let resp = app.route(&key, body).await;
            assert_eq!(resp.status(), 400, "{round}: {body}");
            let answer: Value = resp.json().await.unwrap();
            assert_eq!(answer["code"], "bad_request", "{round}: {body}");
        }
    }
    // A fresh key with an invalid body writes nothing.
    let rows = app.idempotency_rows().await;
    assert_eq!(app.route(&new_key(), &invalid[0]).await.status(), 400);
    assert_eq!(app.idempotency_rows().await, rows);
    assert_eq!(up.hits.get("/ok/fingerprint"), 1);
}

#[actix_web::test]
async fn two_simultaneous_requests_execute_once_and_the_other_gets_409_retry_after() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/slow/two?ms=800")});
    let (a, b) = tokio::join!(app.route(&key, &body), app.route(&key, &body));
    let mut statuses = vec![a.status().as_u16(), b.status().as_u16()];
    statuses.sort();
    assert_eq!(statuses, vec![200, 409]);
    let loser = if a.status() == 409 { a } else { b };
    assert_eq!(loser.headers().get("retry-after").unwrap(), "5");
    let body: Value = loser.json().await.unwrap();
    assert_eq!(body["error"], "Original request still in flight; retry shortly");
    assert_eq!(body["code"], "idempotency_key_in_flight");
    assert_eq!(up.hits.get("/slow/two"), 1);
}

#[actix_web::test]
async fn abandoned_in_flight_row_is_taken_over_and_executed() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/abandoned")});
    insert_in_flight(&app.db, app.agent.id, &key, &body, 90).await;

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-idempotent-replay").is_none());
    assert_eq!(up.hits.get("/ok/abandoned"), 1);
    let takeovers = count(&app.db, "SELECT takeovers::bigint AS n FROM idempotency_keys").await;
    assert_eq!(takeovers, 1);
    // And now it is completed: a retry replays.
    let again = app.route(&key, &body).await;
    assert_eq!(again.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(up.hits.get("/ok/abandoned"), 1);
}

#[actix_web::test]
async fn young_in_flight_row_is_not_taken_over() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/young")});
    insert_in_flight(&app.db, app.agent.id, &key, &body, 30).await;
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 409);
    assert_eq!(resp.headers().get("retry-after").unwrap(), "5");
    assert_eq!(up.hits.total(), 0);
}

#[actix_web::test]
async fn missing_idempotency_key_is_400() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let resp = app.route_raw(None, json!({"url": up.url("/ok")}).to_string().into_bytes()).await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "Idempotency-Key header required (16–128 chars)");
    assert_eq!(body["code"], "idempotency_key_required");
    assert_eq!(up.hits.total(), 0);
    assert_eq!(app.idempotency_rows().await, 0);
}

#[actix_web::test]
async fn out_of_range_idempotency_keys_are_400() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let body = json!({"url": up.url("/ok")}).to_string().into_bytes();
    for key in
        [String::new(), "a".repeat(15), "a".repeat(129), "has space inside!!".into(), "tab\tinside-000000".into()]
    {
        let resp = app.route_raw(Some(&key), body.clone()).await;
        assert_eq!(resp.status(), 400, "key {key:?}");
        let b: Value = resp.json().await.unwrap();
        assert_eq!(b["error"], "Idempotency-Key header required (16–128 chars)");
    }
    for key in ["a".repeat(16), "~".repeat(128)] {
        assert_eq!(app.route_raw(Some(&key), body.clone()).await.status(), 200, "key of {} chars", key.len());
    }
    assert_eq!(up.hits.total(), 2);
}

#[actix_web::test]
async fn redis_flushed_mid_flight_falls_back_to_postgres_and_stays_correct() {
    let redis = PrivateRedis::start().await;
    let app = spawn_app_with(AppOptions { redis_url: redis.url.clone(), ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/slow/flush?ms=1000")});

    let app = Arc::new(app);
    let first = {
        let (app, key, body) = (Arc::clone(&app), key.clone(), body.clone());
        tokio::spawn(async move { app.route(&key, &body).await })
    };
    let cached = || async { !redis.keys().await.is_empty() };
    x402_router_testkit::wait_until(std::time::Duration::from_millis(900), "the in-flight entry cached", cached)
        .await
        .unwrap();
    redis.flushall().await;
    // While in flight, with Redis empty: Postgres still says in flight.
    let during = app.route(&key, &body).await;
    assert_eq!(during.status(), 409);
    let first = first.await.unwrap();
    assert_eq!(first.status(), 200);
    let first: Value = first.json().await.unwrap();

    redis.flushall().await;
    let after = app.route(&key, &body).await;
    assert_eq!(after.status(), 200);
    assert_eq!(after.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(after.json::<Value>().await.unwrap(), first);
    assert_eq!(up.hits.get("/slow/flush"), 1);
    // The Postgres replay warmed the cache again.
    assert!(!redis.keys().await.is_empty());
}

#[actix_web::test]
async fn row_deleted_between_conflict_and_lookup_is_retried_and_proceeds() {
    // The GC race (seed Race 5). The claim inserts and reads in one statement, so the
    // window is a row that another writer commits while our insert waits on it: our
    // statement's snapshot does not show it, a second statement reads it, and here the
    // janitor deletes it (it is expired) just before that read. The router must retry the
    // claim and execute, once.
    use diesel_async::SimpleAsyncConnection;
    let db = Arc::new(TestDb::new().await);
    let db_for_hook = Arc::clone(&db);
    let fired = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let fired2 = Arc::clone(&fired);
    let hook: x402_router::idempotency::FaultHook = Arc::new(move || {
        let db = Arc::clone(&db_for_hook);
        let fired = Arc::clone(&fired2);
        Box::pin(async move {
            if fired.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                let mut conn = db.conn().await;
                let n = x402_router::idempotency::gc::run(&mut conn, 100, None).await.unwrap();
                assert_eq!(n, 1, "the janitor removed the expired row");
            }
        })
    });
    let app = spawn_app_on(
        Arc::clone(&db),
        AppOptions { hooks: Hooks { after_conflict: Some(hook), ..Default::default() }, ..Default::default() },
    )
    .await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/gc-race")});
    let hash = request_hash(&body);

    // Another writer holds the (already expired) row in an open transaction.
    let mut writer = db.conn().await;
    writer
        .batch_execute(&format!(
            "BEGIN; INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease, response_status_code, response_body, expires_at) \
             VALUES ('{}', '{key}', '{hash}', 'completed', gen_random_uuid(), 200, '{{\"old\": true}}', now() - interval '1 minute')",
            app.agent.id
        ))
        .await
        .unwrap();
    let call = spawn_route(&app.client, &app.address, &app.agent, &key, &body);
    wait_for_lock_waiter(&db).await;
    writer.batch_execute("COMMIT").await.unwrap();

    let resp = call.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-idempotent-replay").is_none());
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["body"]["path"], "/ok/gc-race");
    assert_eq!(fired.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(up.hits.get("/ok/gc-race"), 1);
}

#[actix_web::test]
async fn claim_that_waited_on_a_concurrent_claim_reads_its_row() {
    // Without the janitor: the row committed while our claim waited is read by the second
    // statement and decides (here: in flight, so 409), nothing is executed twice.
    use diesel_async::SimpleAsyncConnection;
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/unseen")});
    let hash = request_hash(&body);
    let mut writer = app.db.conn().await;
    writer
        .batch_execute(&format!(
            "BEGIN; INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease) \
             VALUES ('{}', '{key}', '{hash}', 'in_flight', gen_random_uuid())",
            app.agent.id
        ))
        .await
        .unwrap();
    let call = spawn_route(&app.client, &app.address, &app.agent, &key, &body);
    wait_for_lock_waiter(&app.db).await;
    writer.batch_execute("COMMIT").await.unwrap();
    let resp = call.await.unwrap().unwrap();
    assert_eq!(resp.status(), 409);
    assert_eq!(up.hits.get("/ok/unseen"), 0);
}

#[actix_web::test]
async fn upstream_body_kinds_are_enveloped() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let text: Value = app.route(&new_key(), &json!({"url": up.url("/text")})).await.json().await.unwrap();
    assert_eq!(text["body"], json!({"text": "plain text"}));
    let bin: Value = app.route(&new_key(), &json!({"url": up.url("/binary")})).await.json().await.unwrap();
    assert_eq!(bin["body"], json!({"base64": "AJ+Slg=="}));
    let echo: Value = app
        .route(&new_key(), &json!({"url": up.url("/echo?q=1"), "method": "POST", "headers": {"x-custom": "yes", "host": "evil.example"}, "body": {"n": 1}}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(echo["body"]["method"], "POST");
    assert_eq!(echo["body"]["body"], json!({"n": 1}));
    assert_eq!(echo["body"]["headers"]["x-custom"], "yes");
    assert_eq!(echo["body"]["headers"]["content-type"], "application/json");
    assert_ne!(echo["body"]["headers"]["host"], "evil.example");
}

#[actix_web::test]
async fn oversized_upstream_response_is_errored_502() {
    let app = spawn_app_with(AppOptions { max_response_bytes: 10_000, ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let resp = app.route(&new_key(), &json!({"url": up.url("/big?bytes=20000")})).await;
    assert_eq!(resp.status(), 502);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("exceeds 10000 bytes"), "{body}");
}

#[actix_web::test]
async fn upstream_timeout_is_504_and_errored() {
    let app = spawn_app_with(AppOptions { upstream_timeout_ms: 300, ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/slow/timeout?ms=2000")});
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 504);
    let again = app.route(&key, &body).await;
    assert_eq!(again.status(), 504);
    assert_eq!(again.headers().get("x-idempotent-replay").unwrap(), "true");
}

#[actix_web::test]
async fn upstream_402_without_payment_support_is_answered_402_and_completed() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let resp = app.route(&key, &json!({"url": up.url("/v1-402")})).await;
    assert_eq!(resp.status(), 402);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"].is_string());
    assert!(body["accepts"].is_array());
    let n = count(&app.db, "SELECT count(*) AS n FROM idempotency_keys WHERE status = 'completed'").await;
    assert_eq!(n, 1);
}

#[actix_web::test]
async fn forged_or_corrupt_redis_entries_are_ignored_and_postgres_answers() {
    use base64::Engine;
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let mut redis =
        redis::Client::open(app.options.redis_url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let rkey = |key: &str| format!("{}idem:{{{}}}:{}", app.redis_prefix, app.agent.id, key);
    let body = json!({"url": up.url("/ok/forged")});
    let hash = request_hash(&body);
    let forged_answer = br#"{"status":200,"headers":{},"body":{"forged":true},"payment":null,"receipt_id":null}"#;
    let forged = json!({
        "status": "completed", "request_hash": hash, "response_status_code": 200,
        "response_body": {"forged": true},
        "response": base64::engine::general_purpose::STANDARD.encode(forged_answer),
        "receipt_id": null,
    })
    .to_string();

    // Two completed keys of the same request.
    let (a, b) = (new_key(), new_key());
    let a_first = app.route(&a, &body).await.bytes().await.unwrap();
    let b_first = app.route(&b, &body).await.bytes().await.unwrap();
    assert_eq!(up.hits.get("/ok/forged"), 2);
    let genuine_a: Vec<u8> = redis::cmd("GET").arg(rkey(&a)).query_async(&mut redis).await.unwrap();
    let genuine_b: Vec<u8> = redis::cmd("GET").arg(rkey(&b)).query_async(&mut redis).await.unwrap();
    let mut corrupt = genuine_b.clone();
    let last = corrupt.len() - 2;
    corrupt[last] ^= 0x01;

    // A forged entry, a corrupted genuine one, and a genuine one of another key.
    for (key, value, first) in
        [(&a, forged.as_bytes().to_vec(), &a_first), (&b, corrupt, &b_first), (&b, genuine_a, &b_first)]
    {
        let _: () = redis::cmd("SET").arg(rkey(key)).arg(value).query_async(&mut redis).await.unwrap();
        let replay = app.route(key, &body).await;
        assert_eq!(replay.status(), 200);
        assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
        assert_eq!(&replay.bytes().await.unwrap(), first, "Postgres answered, not the forged entry");
    }

    // Forged entries for keys Postgres does not know: neither a forged answer nor a forged
    // mismatch is believed; the call executes.
    let mismatch = json!({"status": "completed", "request_hash": "0".repeat(64)}).to_string();
    for value in [forged.clone(), mismatch] {
        let key = new_key();
        let _: () = redis::cmd("SET").arg(rkey(&key)).arg(value).query_async(&mut redis).await.unwrap();
        let resp = app.route(&key, &body).await;
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("x-idempotent-replay").is_none());
        let env: Value = resp.json().await.unwrap();
        assert_eq!(env["body"]["path"], "/ok/forged");
    }
    assert_eq!(up.hits.get("/ok/forged"), 4);

    let metrics = app.metrics_text().await;
    assert!(metrics.contains("x402_router_cache_entries_rejected_total 5"), "{metrics}");
}

/// Milliseconds until the row of `key` expires (database clock).
async fn row_expires_in_ms(app: &TestApp, key: &str) -> i64 {
    count(
        &app.db,
        &format!("SELECT (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::bigint AS n FROM idempotency_keys WHERE key = '{key}'"),
    )
    .await
}

#[actix_web::test]
async fn a_cached_answer_expires_with_its_row_and_an_expired_row_is_never_cached() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let mut redis =
        redis::Client::open(app.options.redis_url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let key = new_key();
    let rkey = format!("{}idem:{{{}}}:{}", app.redis_prefix, app.agent.id, key);
    let body = json!({"url": up.url("/ok/expiry")});
    let pttl = async |redis: &mut redis::aio::MultiplexedConnection| -> i64 {
        redis::cmd("PTTL").arg(&rkey).query_async(redis).await.unwrap()
    };
    let close = |a: i64, b: i64| (a - b).abs() < 3_000;

    // Written after the call: it expires when the row may be collected, not a fixed TTL later.
    assert_eq!(app.route(&key, &body).await.status(), 200);
    let (cached, row) = (pttl(&mut redis).await, row_expires_in_ms(&app, &key).await);
    assert!(close(cached, row), "cache expires in {cached} ms, its row in {row} ms");

    // Re-filled from Postgres on a replay: same rule, with the row's own expiry.
    exec(&app.db, &format!("UPDATE idempotency_keys SET expires_at = now() + interval '1 hour' WHERE key = '{key}'"))
        .await;
    let _: () = redis::cmd("DEL").arg(&rkey).query_async(&mut redis).await.unwrap();
    assert_eq!(app.route(&key, &body).await.headers().get("x-idempotent-replay").unwrap(), "true");
    let (cached, row) = (pttl(&mut redis).await, row_expires_in_ms(&app, &key).await);
    assert!(close(cached, row) && row < 3_700_000, "cache expires in {cached} ms, its row in {row} ms");

    // A row past its expiry (about to be collected) is served but never cached again: a copy
    // could otherwise answer for the key's next life after the GC.
    exec(&app.db, &format!("UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = '{key}'"))
        .await;
    let _: () = redis::cmd("DEL").arg(&rkey).query_async(&mut redis).await.unwrap();
    assert_eq!(app.route(&key, &body).await.headers().get("x-idempotent-replay").unwrap(), "true");
    let exists: i64 = redis::cmd("EXISTS").arg(&rkey).query_async(&mut redis).await.unwrap();
    assert_eq!(exists, 0, "no cache entry for an expired row");
    assert_eq!(up.hits.get("/ok/expiry"), 1);
}
