//! The operator console: `GET /audit/overview` (its one aggregate endpoint), and the page's
//! security headers. The console itself is tested in a browser by `scripts/console-test`.

use serde_json::Value;
use uuid::Uuid;

use crate::helpers::*;

const OPERATOR_TOKEN: &str = "operator-token-for-console-tests-0123";

async fn operator_app() -> TestApp {
    spawn_app_with(AppOptions { extra: vec![("operator-token".into(), OPERATOR_TOKEN.into())], ..Default::default() })
        .await
}

async fn get(app: &TestApp, path: &str, token: Option<&str>) -> reqwest::Response {
    let req = app.client.get(format!("{}{path}", app.address));
    let req = match token {
        Some(t) => req.bearer_auth(t),
        None => req,
    };
    req.send().await.unwrap()
}

/// A payment intent `ago` (an SQL interval) old, for `network`/`asset`.
async fn payment(db: &TestDb, agent: Uuid, status: &str, ago: &str, asset: &str) {
    Seed::new(agent, status).asset(asset).ago(ago).insert(db).await;
}

/// A receipt `ago` old, with or without a payment.
async fn receipt(db: &TestDb, agent: Uuid, ago: &str, paid: bool) {
    let id = Uuid::new_v4();
    let payment = if paid { "'{\"amount\": \"1\"}'" } else { "NULL" };
    exec(
        db,
        &format!(
            "INSERT INTO receipts (id, agent_id, idempotency_key, request_hash, method, url, upstream_status, \
             upstream_body_sha256, payment, outcome, created_at, signer, signature) VALUES \
             ('{id}', '{agent}', 'r-{}', 'h', 'GET', 'http://example.test/', 200, 's', {payment}, 'completed', \
             now() - interval '{ago}', '0x0', '0x0')",
            id.simple()
        ),
    )
    .await;
}

fn sum(buckets: &Value, field: &str) -> i64 {
    buckets.as_array().unwrap().iter().map(|b| b[field].as_i64().unwrap()).sum()
}

#[actix_web::test]
async fn the_overview_counts_per_hour_and_day_and_sums_what_moved_per_asset() {
    let app = operator_app().await;
    let a = app.agent.id;
    let (usdc, other) = ("0x036CbD53842c5426634e7929541eC2318f3dCF7e", "0x1111111111111111111111111111111111111111");
    payment(&app.db, a, "settled", "1 second", usdc).await;
    payment(&app.db, a, "settled", "2 seconds", other).await;
    payment(&app.db, a, "rejected", "3 seconds", usdc).await;
    payment(&app.db, a, "settled", "3 hours", usdc).await;
    payment(&app.db, a, "signed", "70 minutes", usdc).await; // stuck
    payment(&app.db, a, "unknown", "5 seconds", usdc).await; // pending
    payment(&app.db, a, "unconfirmed", "6 seconds", usdc).await; // pending
    payment(&app.db, a, "settled", "2 days", usdc).await; // a day bucket only
    payment(&app.db, a, "settled", "40 days", usdc).await; // neither
    receipt(&app.db, a, "1 second", true).await;
    receipt(&app.db, a, "2 seconds", false).await;
    receipt(&app.db, a, "5 hours", true).await;
    receipt(&app.db, a, "45 days", true).await;

    let resp = get(&app, "/audit/overview", Some(OPERATOR_TOKEN)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["cache-control"], "no-store");
    let o: Value = resp.json().await.unwrap();
    let (hourly, daily) = (&o["hourly"], &o["daily"]);
    assert_eq!(hourly.as_array().unwrap().len(), 24);
    assert_eq!(daily.as_array().unwrap().len(), 30);
    let this_hour = chrono::Utc::now().format("%Y-%m-%dT%H:00:00").to_string();
    assert!(hourly[23]["start"].as_str().unwrap().starts_with(&this_hour), "{}", hourly[23]["start"]);
    assert!(
        daily[29]["start"].as_str().unwrap().starts_with(&chrono::Utc::now().format("%Y-%m-%dT00:00:00").to_string())
    );
    assert_eq!((sum(hourly, "payments"), sum(hourly, "settled")), (7, 3));
    assert_eq!((sum(hourly, "calls"), sum(hourly, "paid_calls")), (3, 2));
    assert_eq!((sum(daily, "payments"), sum(daily, "settled")), (8, 4));
    assert_eq!((sum(daily, "calls"), sum(daily, "paid_calls")), (3, 2));
    // The five made seconds ago are in the current hour or, just after the hour turned, the one
    // before; the 3-hour-old one is in neither.
    let recent = hourly[23]["payments"].as_i64().unwrap() + hourly[22]["payments"].as_i64().unwrap();
    assert!((5..=6).contains(&recent), "{recent}");
    // Per bucket: the queues by signing time, and the amount settled per asset.
    assert_eq!((sum(hourly, "stuck"), sum(daily, "stuck")), (1, 1));
    assert_eq!((sum(hourly, "paid_not_served"), sum(daily, "paid_not_served")), (3, 4));
    let moved_in = |buckets: &Value, asset: &str| -> u64 {
        buckets
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|b| b["moved"].as_array().unwrap().clone())
            .filter(|m| m["asset"] == asset)
            .map(|m| m["amount"].as_str().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!((moved_in(hourly, usdc), moved_in(hourly, other)), (20000, 10000));
    assert_eq!((moved_in(daily, usdc), moved_in(daily, other)), (30000, 10000));
    let moved = o["moved"].as_array().unwrap();
    assert_eq!(moved.len(), 2);
    let of = |asset: &str| moved.iter().find(|m| m["asset"] == asset).unwrap().clone();
    assert_eq!((of(usdc)["settled_24h"].as_str(), of(usdc)["settled_30d"].as_str()), (Some("20000"), Some("30000")));
    assert_eq!((of(other)["settled_24h"].as_str(), of(other)["settled_30d"].as_str()), (Some("10000"), Some("10000")));
    assert_eq!(o["stuck"], 1);
    assert_eq!(o["settlement_pending"], 2);
    // The same definition as the list the queue shows.
    let list: Value =
        get(&app, "/audit/payments?status=paid_not_served", Some(OPERATOR_TOKEN)).await.json().await.unwrap();
    assert_eq!(o["paid_not_served"].as_i64().unwrap(), list["payments"].as_array().unwrap().len() as i64);
    assert_eq!(o["paid_not_served"], 5);

    assert_eq!(get(&app, "/audit/overview", None).await.status(), 401);
    assert_eq!(get(&app, "/audit/overview", Some("wrong-token-wrong-token")).await.status(), 401);
    assert_eq!(get(&app, "/audit/overview", Some(&app.agent.key)).await.status(), 403);
}

#[actix_web::test]
async fn the_console_is_served_with_its_security_headers_and_nothing_else_under_it() {
    let app = operator_app().await;
    for (path, kind) in
        [("/console", "text/html"), ("/console/app.js", "text/javascript"), ("/console/app.css", "text/css")]
    {
        let resp = get(&app, path, None).await;
        assert_eq!(resp.status(), 200, "{path}");
        let h = resp.headers();
        assert!(h["content-type"].to_str().unwrap().starts_with(kind), "{path}");
        assert_eq!(h["content-security-policy"], x402_router::console::CONTENT_SECURITY_POLICY);
        assert!(h["content-security-policy"].to_str().unwrap().contains("frame-ancestors 'none'"));
        assert_eq!(h["cache-control"], "no-store");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["referrer-policy"], "no-referrer");
    }
    for path in ["/console/index.html.bak", "/console/..%2Fsrc%2Fmain.rs", "/console/x/app.js"] {
        assert_eq!(get(&app, path, None).await.status(), 404, "{path}");
    }
}

#[actix_web::test]
async fn payments_are_listed_between_from_and_to() {
    let app = operator_app().await;
    let usdc = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
    for ago in ["3 days", "30 hours", "2 hours", "1 second"] {
        payment(&app.db, app.agent.id, "settled", ago, usdc).await;
    }
    let count = |body: Value| body["payments"].as_array().unwrap().len();
    let at = |hours: i64| (chrono::Utc::now() - chrono::Duration::hours(hours)).to_rfc3339();
    let q = |query: String| {
        let app = &app;
        async move {
            let resp = get(app, &format!("/audit/payments?{query}"), Some(OPERATOR_TOKEN)).await;
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let enc = |t: String| t.replace('+', "%2B");
    let (status, body) = q(format!("from={}", enc(at(24)))).await;
    assert_eq!((status, count(body)), (200, 2));
    let (_, body) = q(format!("from={}&to={}", enc(at(48)), enc(at(1)))).await;
    assert_eq!(count(body), 2, "30 hours and 2 hours ago");
    let (_, body) = q(format!("to={}&status=settled", enc(at(48)))).await;
    assert_eq!(count(body), 1);
    // Bounds compose with the cursor: pages of one still cover the window once.
    let (mut seen, mut cursor) = (0, String::new());
    loop {
        let (_, body) = q(format!("from={}&limit=1{cursor}", enc(at(48)))).await;
        seen += count(body.clone());
        match body["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, 3);
    let (status, body) = q(format!("from={}&to={}", enc(at(1)), enc(at(2)))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(q("from=yesterday".into()).await.0, 400);
}

#[actix_web::test]
async fn whoami_names_the_operator_and_its_role_for_the_console() {
    let app = operator_app().await;
    let (viewer_id, viewer) = create_operator(&app.db, "vera", x402_router::operators::Role::Viewer).await;
    let (admin_id, admin) = create_operator(&app.db, "adam", x402_router::operators::Role::Admin).await;
    let me = |token: String| {
        let app = &app;
        async move {
            let resp = get(app, "/audit/whoami", Some(&token)).await;
            assert_eq!(resp.status(), 200);
            resp.json::<Value>().await.unwrap()
        }
    };
    let v = me(viewer).await;
    assert_eq!(
        (v["operator_id"].as_str(), v["name"].as_str(), v["role"].as_str()),
        (Some(viewer_id.to_string().as_str()), Some("vera"), Some("viewer"))
    );
    let a = me(admin).await;
    assert_eq!(
        (a["operator_id"].as_str(), a["name"].as_str(), a["role"].as_str()),
        (Some(admin_id.to_string().as_str()), Some("adam"), Some("admin"))
    );
    let b = me(OPERATOR_TOKEN.to_owned()).await;
    assert_eq!((b["operator_id"].is_null(), b["role"].as_str()), (true, Some("admin")));
    assert_eq!(get(&app, "/audit/whoami", None).await.status(), 401);
    assert_eq!(get(&app, "/audit/whoami", Some(&app.agent.key)).await.status(), 403);
}
