//! Garbage collection of expired idempotency rows.

use serde_json::json;
use x402_router_testkit::Deadline;

use crate::helpers::*;

#[actix_web::test]
async fn gc_removes_only_expired_rows_in_batches_and_keeps_receipts() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    for i in 0..3 {
        assert_eq!(app.route(&new_key(), &json!({"url": up.url(&format!("/ok/gc{i}"))})).await.status(), 200);
    }
    // 7 expired rows (completed and in-flight alike), 3 live ones from the calls above.
    for i in 0..7 {
        exec(
            &app.db,
            &format!(
                "INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease, response_status_code, response_body, expires_at) \
                 VALUES ('{}', 'expired-key-{i:08}', 'h', {}, gen_random_uuid(), {}, {}, now() - interval '1 second')",
                app.agent.id,
                if i % 2 == 0 { "'completed'" } else { "'in_flight'" },
                if i % 2 == 0 { "200" } else { "NULL" },
                if i % 2 == 0 { "'{}'" } else { "NULL" },
            ),
        )
        .await;
    }
    let mut conn = app.db.conn().await;
    let deleted = x402_router::idempotency::gc::run(&mut conn, 2, None).await.unwrap();
    // In-flight rows are left to their owner or its takeover, however old.
    assert_eq!(deleted, 4);
    assert_eq!(app.idempotency_rows().await, 6);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM idempotency_keys WHERE status = 'in_flight'").await, 3);
    assert_eq!(app.receipt_rows().await, 3);
    assert_eq!(x402_router::idempotency::gc::run(&mut conn, 2, None).await.unwrap(), 0);
}

#[actix_web::test]
async fn gc_during_a_takeover_does_not_delete_the_in_flight_row() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let path = "/slow/gc-takeover";
    let body = json!({"url": up.url(&format!("{path}?ms=1500"))});
    // Its first owner died long ago, and its expiry has passed.
    insert_in_flight(&app.db, app.agent.id, &key, &body, 90).await;
    exec(&app.db, "UPDATE idempotency_keys SET expires_at = now() - interval '1 minute'").await;

    let call = spawn_route(&app.client, &app.address, &app.agent, &key, &body);
    let mut deadline = Deadline::after(std::time::Duration::from_secs(10), "the takeover never called the upstream")
        .every(std::time::Duration::from_millis(10));
    while up.hits.get(path) == 0 {
        deadline.next_poll().await.unwrap();
    }
    let mut conn = app.db.conn().await;
    assert_eq!(x402_router::idempotency::gc::run(&mut conn, 100, None).await.unwrap(), 0, "GC deleted a row in flight");
    let retry = app.route(&key, &body).await;
    assert_eq!(retry.status(), 409, "a retry during the takeover waits; it does not execute afresh");

    let resp = call.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    // The takeover extended the expiry: the fresh result is kept and replayed.
    assert_eq!(x402_router::idempotency::gc::run(&mut conn, 100, None).await.unwrap(), 0);
    let replay = app.route(&key, &body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(up.hits.get(path), 1);
}

#[actix_web::test]
async fn gc_command_prints_the_count_and_fails_loudly_without_a_database() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "gc").await;
    exec(
        &db,
        &format!(
            "INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease, response_status_code, expires_at) \
             VALUES ('{}', 'expired-key-cli-0001', 'h', 'errored', gen_random_uuid(), 502, now() - interval '1 hour')",
            agent.id
        ),
    )
    .await;
    let out = router_command().args(["gc", "--database-url", &db.url, "--gc-batch-size", "10"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), r#"{"deleted":1,"secrets_dropped":0}"#);

    let out = router_command()
        .args(["gc", "--database-url", &format!("postgres://postgres@127.0.0.1:{}/none", free_port())])
        .env("DATABASE_ACQUIRE_TIMEOUT_MS", "500")
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[actix_web::test]
async fn paced_gc_keeps_to_its_rows_per_second_budget() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "gc-paced").await;
    exec(
        &db,
        &format!(
            "INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease, response_status_code, expires_at) \
             SELECT '{}', 'expired-key-paced-' || lpad(i::text, 4, '0'), 'h', 'completed', gen_random_uuid(), 200, \
                    now() - interval '1 hour' FROM generate_series(1, 7) AS i",
            agent.id
        ),
    )
    .await;
    let mut conn = db.conn().await;
    // 7 rows, 2 per batch, 10 rows/s: the batches after 2, 4 and 6 rows are due at
    // 200, 400 and 600 ms.
    let started = std::time::Instant::now();
    let deleted = x402_router::idempotency::gc::run(&mut conn, 2, std::num::NonZeroU64::new(10)).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(deleted, 7);
    assert!(elapsed >= std::time::Duration::from_millis(600), "paced GC took only {elapsed:?}");
    assert_eq!(count(&db, "SELECT count(*) AS n FROM idempotency_keys").await, 0);

    let out =
        router_command().args(["gc", "--database-url", &db.url, "--gc-max-rows-per-second", "fast"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("GC_MAX_ROWS_PER_SECOND"));
}

#[actix_web::test]
async fn gc_without_a_terminal_logs_one_progress_line_per_batch() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "gc-progress").await;
    // 5 expired rows (2 per batch: 2, 2, 1) and one in flight, which is neither counted nor deleted.
    exec(
        &db,
        &format!(
            "INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease, response_status_code, expires_at) \
             SELECT '{0}', 'expired-key-progress-' || lpad(i::text, 4, '0'), 'h', \
                    CASE WHEN i = 6 THEN 'in_flight' ELSE 'completed' END, gen_random_uuid(), \
                    CASE WHEN i = 6 THEN NULL ELSE 200 END, now() - interval '1 hour' \
               FROM generate_series(1, 6) AS i",
            agent.id
        ),
    )
    .await;
    let out = router_command()
        .args(["gc", "--database-url", &db.url, "--gc-batch-size", "2", "--gc-max-rows-per-second", "0"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["deleted"], 5, "{printed}");
    crate::cli::assert_steps(&crate::cli::progress_lines(&stderr, "gc"), "rows", &[2, 2, 1]);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM idempotency_keys").await, 1);
}
