//! Operators (issue 23): role tokens made by the CLI, the Viewer/Admin extractors, the
//! append-only operator events, the payments CSV export and the metrics listener. Issue 38:
//! operator tokens over the API (`/admin/operators`, on every router at once), the last-admin
//! rule, retiring the bootstrap token, and the throttle of failed authentications.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use diesel_async::{AsyncConnection, RunQueryDsl};
use serde_json::{Value, json};
use uuid::Uuid;
use x402_router::auth::{Admin, Viewer};
use x402_router::operators::{Actor, Role, events};

use crate::helpers::tls_services::wait_until;
use crate::helpers::*;

const BOOTSTRAP: &str = "operators-bootstrap-token-0123456789";

/// `x402-router operators …` on `db`: success, stdout.
fn cli(db: &TestDb, args: &[&str]) -> (bool, String) {
    let out = router_command().arg("operators").args(args).env("DATABASE_URL", &db.url).output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap())
}

async fn get(app: &TestApp, path: &str, token: &str) -> reqwest::Response {
    app.client.get(format!("{}{path}", app.address)).bearer_auth(token).send().await.unwrap()
}

#[actix_web::test]
async fn cli_tokens_have_roles_and_a_revoked_token_is_refused_at_once() {
    let app = spawn_app().await;
    let (ok, out) = cli(&app.db, &["create", "--name", "alice", "--role", "viewer"]);
    assert!(ok, "{out}");
    assert_eq!(out.lines().count(), 1, "one JSON line: {out}");
    let created: Value = serde_json::from_str(out.trim()).unwrap();
    let token = created["token"].as_str().unwrap().to_owned();
    let id = created["operator_id"].as_str().unwrap().to_owned();
    assert!(token.starts_with("x4o_") && token.len() == 47, "{token}");
    assert_eq!(created["role"], "viewer");
    let hash = x402_router::operators::hash_token(&token);
    assert_eq!(count(&app.db, &format!("SELECT count(*) AS n FROM operators WHERE token_hash = '{hash}'")).await, 1);

    let (ok, listed) = cli(&app.db, &["list"]);
    assert!(ok && listed.contains(&id) && listed.contains("\"alice\""), "{listed}");
    assert!(!listed.contains(&token) && !listed.contains(&hash), "the list never shows a token or its hash");

    // The viewer reads the audit API; agent keys and strangers do not.
    assert_eq!(get(&app, "/audit/payments", &token).await.status(), 200);
    assert_eq!(get(&app, "/audit/operator-events", &token).await.status(), 200);
    let agent = get(&app, "/audit/operator-events", &app.agent.key).await;
    assert_eq!(agent.status(), 403);
    assert_eq!(agent.json::<Value>().await.unwrap()["code"], "operator_only");
    let forged = format!("x4o_{}", "A".repeat(43));
    assert_eq!(get(&app, "/audit/payments", &forged).await.status(), 401);

    let (ok, out) = cli(&app.db, &["revoke", &id]);
    assert!(ok, "{out}");
    // Refused from the moment the revocation committed (no cache).
    let resp = get(&app, "/audit/payments", &token).await;
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "unauthorized");
    assert_eq!(
        app.client.get(format!("{}/metrics", app.address)).bearer_auth(&token).send().await.unwrap().status(),
        401
    );

    // Bad input changes nothing.
    for bad in [
        &["create", "--name", "x", "--role", "root"][..],
        &["create", "--name", " ", "--role", "admin"],
        &["revoke", "nope"],
    ] {
        assert!(!cli(&app.db, bad).0, "{bad:?}");
    }
    let (ok, out) = cli(&app.db, &["revoke", &Uuid::new_v4().to_string()]);
    assert!(!ok && out.contains("no operator"), "{out}");

    // The CLI's changes are in the trail, as `cli`.
    let (_, admin_token) = create_operator(&app.db, "root", Role::Admin).await;
    let body: Value = get(&app, "/audit/operator-events", &admin_token).await.json().await.unwrap();
    let events = body["events"].as_array().unwrap();
    let actions: Vec<&str> = events.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["operator.create", "operator.revoke"], "{body}");
    for e in events {
        assert_eq!(e["operator_name"], "cli");
        assert!(e["operator_id"].is_null() && e["remote_addr"].is_null());
        assert_eq!(e["target"], id.as_str());
        assert!(!e.to_string().contains(&token) && !e.to_string().contains(&hash), "{e}");
    }
    assert!(events[1]["before"]["revoked_at"].is_null() && events[1]["after"]["revoked_at"].is_string());
}

/// The extractors on a route of their own (the admin endpoints live elsewhere): a viewer is
/// refused where an admin is needed, with the actor each one carries.
#[actix_web::test]
async fn the_admin_extractor_refuses_viewers_and_names_the_actor() {
    let db = std::sync::Arc::new(TestDb::new().await);
    let mut args = serve_args(&AppOptions::default(), &db.url, "ops:", "127.0.0.1:0");
    args.extend(["--operator-token".into(), BOOTSTRAP.into()]);
    let built = x402_router::startup::Application::build(config_from(&args), Default::default()).unwrap();
    let service = actix_web::test::init_service(
        actix_web::App::new()
            .app_data(web::Data::new(built.state().clone()))
            .route("/admin", web::get().to(|a: Admin| async move { HttpResponse::Ok().json(a.actor) }))
            .route("/viewer", web::get().to(|v: Viewer| async move { HttpResponse::Ok().json(v.actor) })),
    )
    .await;
    let (viewer_id, viewer) = create_operator(&db, "vera", Role::Viewer).await;
    let (admin_id, admin) = create_operator(&db, "adam", Role::Admin).await;
    let agent = create_agent(&db, "bot").await;
    let peer: std::net::SocketAddr = "10.1.2.3:4567".parse().unwrap();
    let call = async |path: &str, token: Option<&str>| {
        let mut req = actix_web::test::TestRequest::get().uri(path).peer_addr(peer);
        if let Some(t) = token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        let resp = actix_web::test::call_service(&service, req.to_request()).await;
        let status = resp.status().as_u16();
        (status, actix_web::test::read_body_json::<Value, _>(resp).await)
    };

    let (status, body) = call("/admin", Some(&viewer)).await;
    assert_eq!((status, body["code"].as_str()), (403, Some("operator_only")), "{body}");
    assert_eq!(body["error"], "this needs an admin operator token");
    let (status, body) = call("/viewer", Some(&viewer)).await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({"operator_id": viewer_id, "name": "vera", "role": "viewer", "remote_addr": "10.1.2.3"}));
    let (status, body) = call("/admin", Some(&admin)).await;
    assert_eq!(status, 200);
    assert_eq!(body["operator_id"], json!(admin_id));
    let (status, body) = call("/admin", Some(BOOTSTRAP)).await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({"operator_id": null, "name": "bootstrap", "role": "admin", "remote_addr": "10.1.2.3"}));
    let (status, body) = call("/admin", Some(&agent.key)).await;
    assert_eq!((status, body["code"].as_str()), (403, Some("operator_only")));
    assert_eq!(call("/admin", None).await.0, 401);
    assert_eq!(call("/viewer", Some("operators-bootstrap-token-012345678")).await.0, 401);
    exec(&db, &format!("UPDATE operators SET revoked_at = now() WHERE id = '{admin_id}'")).await;
    assert_eq!(call("/admin", Some(&admin)).await.0, 401);
}

#[actix_web::test]
async fn operator_events_are_append_only_at_the_database() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    events::record(&mut conn, &Actor::cli(), "test.action", Some("x"), None, Some(&json!({"a": 1}))).await.unwrap();
    for sql in
        ["UPDATE operator_events SET action = 'forged'", "DELETE FROM operator_events", "TRUNCATE operator_events"]
    {
        let e = diesel::sql_query(sql).execute(&mut conn).await.unwrap_err();
        assert!(e.to_string().contains("append-only"), "{sql}: {e}");
    }
    assert_eq!(count(&db, "SELECT count(*) AS n FROM operator_events WHERE action = 'test.action'").await, 1);
}

#[actix_web::test]
async fn a_change_that_fails_leaves_no_event() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let actor = Actor { operator_id: Some(Uuid::new_v4()), name: "eve".into(), role: Role::Admin, remote_addr: None };
    // The event first, then a change the database refuses: both roll back.
    let failed = conn
        .transaction::<(), diesel::result::Error, _>(async |c| {
            events::record(c, &actor, "operator.create", Some("x"), None, None).await?;
            diesel::sql_query(
                "INSERT INTO operators (id, name, role, token_hash) VALUES (gen_random_uuid(), 'x', 'root', 'h')",
            )
            .execute(c)
            .await?;
            Ok(())
        })
        .await;
    assert!(failed.is_err());
    assert_eq!(count(&db, "SELECT count(*) AS n FROM operator_events").await, 0);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM operators").await, 0);
    // And a change that commits commits its event.
    conn.transaction::<(), diesel::result::Error, _>(async |c| {
        events::record(c, &actor, "settings.update", None, Some(&json!({"x": 1})), Some(&json!({"x": 2}))).await
    })
    .await
    .unwrap();
    assert_eq!(count(&db, "SELECT count(*) AS n FROM operator_events WHERE operator_name = 'eve'").await, 1);
}

#[actix_web::test]
async fn operator_events_filter_and_paginate() {
    let app = spawn_app().await;
    let (viewer_id, viewer) = create_operator(&app.db, "v", Role::Viewer).await;
    let mut conn = app.db.conn().await;
    let someone = Actor { operator_id: Some(viewer_id), name: "v".into(), role: Role::Viewer, remote_addr: None };
    for i in 0..5 {
        let action = if i % 2 == 0 { "a.even" } else { "a.odd" };
        events::record(&mut conn, &someone, action, Some(&i.to_string()), None, None).await.unwrap();
    }
    events::record(&mut conn, &Actor::cli(), "a.even", None, None, None).await.unwrap();
    let mut seen = vec![];
    let mut cursor: Option<String> = None;
    loop {
        let q = cursor.as_ref().map(|c| format!("&cursor={c}")).unwrap_or_default();
        let body: Value = get(&app, &format!("/audit/operator-events?limit=2&operator_id={viewer_id}{q}"), &viewer)
            .await
            .json()
            .await
            .unwrap();
        seen.extend(body["events"].as_array().unwrap().iter().map(|e| e["target"].as_str().unwrap().to_owned()));
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ["0", "1", "2", "3", "4"]);
    let body: Value = get(&app, "/audit/operator-events?action=a.even", &viewer).await.json().await.unwrap();
    assert_eq!(body["events"].as_array().unwrap().len(), 4);
    let body: Value = get(&app, "/audit/operator-events?to=2000-01-01T00:00:00Z", &viewer).await.json().await.unwrap();
    assert_eq!(body["events"].as_array().unwrap().len(), 0);
    for bad in ["operator_id=x", "limit=0", "cursor=nope", "who=x", "from=yesterday"] {
        assert_eq!(get(&app, &format!("/audit/operator-events?{bad}"), &viewer).await.status(), 400, "{bad}");
    }
}

/// A payment row with chosen text in the cells a spreadsheet might evaluate.
async fn insert_payment(db: &TestDb, agent: Uuid, key: &str, status: &str, error: Option<&str>, age_secs: i64) -> Uuid {
    let nonce = format!("0x{:x}", md5_like(key));
    Seed::new(agent, status)
        .key(key)
        .nonce(&nonce)
        .pay_to("0x209693Bc6afc0C5328bA36FaF03C514EF312287C")
        .signed(r#"{"signature": "0xSECRETSIGNATURE"}"#, "SECRETHEADER")
        .error(error)
        .ago(&format!("{age_secs} seconds"))
        .insert(db)
        .await
}

/// A stable 128-bit value of `key` (the seeded rows' nonces only need to be distinct).
fn md5_like(key: &str) -> u128 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325_u128, |h, b| (h ^ u128::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Parses RFC 4180 CSV (quoted cells, doubled quotes, CRLF rows).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let (mut rows, mut row, mut cell, mut quoted, mut chars) =
        (vec![], vec![], String::new(), false, text.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => row.push(std::mem::take(&mut cell)),
            ('\r', false) => {}
            ('\n', false) => {
                row.push(std::mem::take(&mut cell));
                rows.push(std::mem::take(&mut row));
            }
            (c, _) => cell.push(c),
        }
    }
    rows
}

#[actix_web::test]
async fn the_payments_csv_is_quoted_neutralized_filtered_and_streams_every_page() {
    let app = spawn_app().await;
    let other = create_agent(&app.db, "other").await;
    let (_, viewer) = create_operator(&app.db, "v", Role::Viewer).await;
    let tricky = insert_payment(
        &app.db,
        app.agent.id,
        "key,with \"quotes\"\nand a line",
        "rejected",
        Some("=HYPERLINK(\"http://evil\")"),
        50,
    )
    .await;
    let minus = insert_payment(&app.db, app.agent.id, "-2+3-key-0123456789", "settled", Some("@SUM(A1)"), 40).await;
    let mut settled = vec![minus];
    for i in 0..7 {
        settled.push(
            insert_payment(&app.db, app.agent.id, &format!("bulk-key-{i:04}-0123456789"), "settled", None, 30 - i)
                .await,
        );
    }
    insert_payment(&app.db, other.id, "other-agent-key-0123456789", "settled", None, 1).await;

    let resp = get(&app, "/audit/payments.csv", &viewer).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/csv"));
    let text = resp.text().await.unwrap();
    assert!(!text.contains("SECRET"), "never the signed authorization or the header");
    let rows = parse_csv(&text);
    let header = &rows[0];
    assert_eq!(&header[..3], ["id", "agent_id", "idempotency_key"]);
    assert_eq!(rows.len(), 1 + 10, "{text}");
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let row_of = |id: Uuid| rows.iter().find(|r| r[0] == id.to_string()).unwrap().clone();
    let t = row_of(tricky);
    assert_eq!(t[col("idempotency_key")], "key,with \"quotes\"\nand a line");
    assert_eq!(t[col("error")], "'=HYPERLINK(\"http://evil\")");
    let m = row_of(minus);
    assert_eq!(m[col("idempotency_key")], "'-2+3-key-0123456789");
    assert_eq!(m[col("error")], "'@SUM(A1)");
    assert_eq!(m[col("amount")], "10000");
    assert_eq!(
        (t[col("agent_name")].as_str(), row_of(minus)[col("agent_name")].as_str()),
        ("test-agent", "test-agent")
    );
    let others: Vec<&Vec<String>> = rows[1..].iter().filter(|r| r[col("agent_id")] == other.id.to_string()).collect();
    assert_eq!(others.len(), 1);
    assert_eq!(others[0][col("agent_name")], "other", "each row names its own agent");

    // Filters as /audit/payments; pages of 2 walked to the end (9 rows: 5 pages).
    let text = get(&app, &format!("/audit/payments.csv?status=settled&agent_id={}&limit=2", app.agent.id), &viewer)
        .await
        .text()
        .await
        .unwrap();
    let ids: Vec<String> = parse_csv(&text)[1..].iter().map(|r| r[0].clone()).collect();
    assert_eq!(ids, settled.iter().map(Uuid::to_string).collect::<Vec<_>>(), "oldest first, every page once");
    let none = get(&app, "/audit/payments.csv?to=2000-01-01T00:00:00Z", &viewer).await.text().await.unwrap();
    assert_eq!(parse_csv(&none).len(), 1, "the header row only");

    assert_eq!(get(&app, "/audit/payments.csv?status=lost", &viewer).await.status(), 400);
    assert_eq!(get(&app, "/audit/payments.csv", &app.agent.key).await.status(), 403);
    assert_eq!(app.client.get(format!("{}/audit/payments.csv", app.address)).send().await.unwrap().status(), 401);
}

#[actix_web::test]
async fn metrics_need_a_token_on_the_main_listener_and_none_on_metrics_addr() {
    let app =
        spawn_app_with(AppOptions { extra: vec![("metrics-addr".into(), "127.0.0.1:0".into())], ..Default::default() })
            .await;
    let main = format!("{}/metrics", app.address);
    assert_eq!(app.client.get(&main).send().await.unwrap().status(), 401);
    assert_eq!(app.client.get(&main).bearer_auth(&app.agent.key).send().await.unwrap().status(), 403);
    let text = app.metrics_text().await;
    assert!(text.contains(&format!("x402_router_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))), "{text}");
    let open = app.metrics_address.clone().expect("a metrics listener");
    let resp = app.client.get(format!("{open}/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("x402_router_build_info"));
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        assert!(line.starts_with("x402_router_") || line.starts_with("process_"), "unprefixed metric: {line}");
    }
    // Only /metrics there: the API is not reachable through the open listener.
    for path in ["/audit/payments", "/healthz", "/route"] {
        assert_eq!(app.client.get(format!("{open}{path}")).send().await.unwrap().status(), 404, "{path}");
    }
    // The ledger gauge by status is read at start.
    wait_until("payments_by_status", std::time::Duration::from_secs(10), async || {
        app.metrics_text().await.contains("x402_router_payments_by_status{status=\"settled\"} 0")
    })
    .await;
}

#[test]
fn a_bad_metrics_addr_stops_start_up_naming_it() {
    for bad in ["nope", "127.0.0.1:8080"] {
        let out = router_command()
            .args(["serve", "--bind", "127.0.0.1:8080", "--metrics-addr", bad])
            .env("DATABASE_URL", "postgres://x/y")
            .env("REDIS_URL", "redis://x")
            .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("METRICS_ADDR"), "{bad}");
    }
}

#[actix_web::test]
async fn a_paid_call_adds_its_amount_to_the_paid_amount_counter() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    let asset = env["payment"]["asset"].as_str().unwrap().to_owned();
    let text = app.metrics_text().await;
    let name = format!("x402_router_paid_amount_total{{asset=\"{asset}\",network=\"eip155:84532\"}}");
    let value = text.lines().find(|l| l.starts_with(&name)).and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert_eq!(value, Some(PRICE), "{text}");
}

// Issue 38: operator tokens over the API.

/// An answer: status, `Retry-After` and the JSON body (null when not JSON).
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: Value,
}

impl Answer {
    fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or_default()
    }
}

async fn send(
    client: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = client.request(method, format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b.to_owned());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
    Answer { status, retry_after, body: resp.json().await.unwrap_or(Value::Null) }
}

async fn api(app: &TestApp, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Answer {
    send(&app.client, &app.address, method, path, token, body).await
}

/// `POST /admin/operators` as `admin`: the new operator's id and token.
async fn create_over_api(app: &TestApp, admin: &str, name: &str, role: &str) -> (String, String) {
    let made =
        api(app, "POST", "/admin/operators", Some(admin), Some(&json!({"name": name, "role": role}).to_string())).await;
    assert_eq!(made.status, 201, "{}", made.body);
    (made.body["operator"]["id"].as_str().unwrap().to_owned(), made.body["token"].as_str().unwrap().to_owned())
}

async fn live_admins(db: &TestDb) -> i64 {
    count(db, "SELECT count(*) AS n FROM operators WHERE role = 'admin' AND revoked_at IS NULL").await
}

#[actix_web::test]
async fn tokens_made_over_the_api_work_at_once_and_a_revocation_is_refused_at_once_by_every_router() {
    let a = spawn_app().await;
    let b = spawn_app_on(a.db.clone(), AppOptions::default()).await;
    let (admin_id, admin) = create_operator(&a.db, "root", Role::Admin).await;

    let made =
        api(&a, "POST", "/admin/operators", Some(&admin), Some(r#"{"name": "ci-reader", "role": "viewer"}"#)).await;
    assert_eq!(made.status, 201, "{}", made.body);
    let token = made.body["token"].as_str().unwrap().to_owned();
    let id = made.body["operator"]["id"].as_str().unwrap().to_owned();
    assert!(token.starts_with("x4o_") && token.len() == 47, "{token}");
    let operator = &made.body["operator"];
    assert_eq!((operator["name"].as_str(), operator["role"].as_str()), (Some("ci-reader"), Some("viewer")));
    assert!(operator["revoked_at"].is_null() && operator.get("token_hash").is_none(), "{operator}");
    let hash = x402_router::operators::hash_token(&token);

    // Works at once, on the other router too.
    assert_eq!(api(&b, "GET", "/audit/payments", Some(&token), None).await.status, 200);
    let me = api(&b, "GET", "/audit/whoami", Some(&token), None).await.body;
    assert_eq!((me["operator_id"].as_str(), me["role"].as_str()), (Some(id.as_str()), Some("viewer")), "{me}");
    // An admin made over the API administers at once.
    let (_, second) = create_over_api(&a, &admin, "second-admin", "admin").await;
    let listed = api(&b, "GET", "/admin/operators", Some(&second), None).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let names: Vec<&str> =
        listed.body["operators"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"ci-reader") && names.contains(&"second-admin"), "{names:?}");
    let text = listed.body.to_string();
    for secret in [&token, &hash, &second, &x402_router::operators::hash_token(&second)] {
        assert!(!text.contains(secret.as_str()), "the list never shows a token or its hash");
    }

    // Revoked through A: refused by B from the commit on (no cache, nothing to wait for).
    let revoked = api(&a, "DELETE", &format!("/admin/operators/{id}"), Some(&admin), None).await;
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    assert!(revoked.body["revoked_at"].is_string(), "{}", revoked.body);
    for router in [&b, &a] {
        let refused = api(router, "GET", "/audit/payments", Some(&token), None).await;
        assert_eq!((refused.status, refused.code()), (401, "unauthorized"));
    }
    // Idempotent: the same answer again, and no second event.
    let again = api(&b, "DELETE", &format!("/admin/operators/{id}"), Some(&second), None).await;
    assert_eq!((again.status, &again.body["revoked_at"]), (200, &revoked.body["revoked_at"]));
    for unknown in [Uuid::new_v4().to_string(), "nope".into()] {
        let a404 = api(&a, "DELETE", &format!("/admin/operators/{unknown}"), Some(&admin), None).await;
        assert_eq!((a404.status, a404.code()), (404, "not_found"), "{unknown}");
    }

    // The trail: who, from where, what; never a token or its hash.
    let events = api(&a, "GET", "/audit/operator-events?limit=500", Some(&admin), None).await.body["events"].clone();
    let of = |action: &str| -> Vec<Value> {
        events.as_array().unwrap().iter().filter(|e| e["action"] == action).cloned().collect()
    };
    let (creates, revokes) = (of("operator.create"), of("operator.revoke"));
    assert_eq!((creates.len(), revokes.len()), (2, 1), "{events}");
    assert_eq!(creates[0]["operator_id"], json!(admin_id));
    assert_eq!(
        (creates[0]["operator_name"].as_str(), creates[0]["remote_addr"].as_str()),
        (Some("root"), Some("127.0.0.1"))
    );
    assert_eq!(
        (creates[0]["target"].as_str(), creates[0]["after"]["role"].as_str()),
        (Some(id.as_str()), Some("viewer"))
    );
    assert!(creates[0]["before"].is_null());
    assert_eq!(revokes[0]["target"].as_str(), Some(id.as_str()));
    assert!(revokes[0]["before"]["revoked_at"].is_null() && revokes[0]["after"]["revoked_at"].is_string());
    let stored = count(&a.db, "SELECT count(*) AS n FROM operator_events e WHERE strpos(e::text, 'x4o_') > 0").await;
    assert_eq!(stored, 0, "no event holds a token");
    for h in [&hash, &x402_router::operators::hash_token(&second)] {
        let sql = format!("SELECT count(*) AS n FROM operator_events e WHERE strpos(e::text, '{h}') > 0");
        assert_eq!(count(&a.db, &sql).await, 0, "no event holds a token's hash");
    }
}

#[actix_web::test]
async fn viewers_agents_and_strangers_are_refused_by_every_operator_endpoint_and_change_nothing() {
    let app = spawn_app().await;
    let (victim, _) = create_operator(&app.db, "victim", Role::Admin).await;
    let (_, viewer) = create_operator(&app.db, "vera", Role::Viewer).await;
    let before = (count(&app.db, "SELECT count(*) AS n FROM operators").await, events_count(&app.db).await);
    let revoke = format!("/admin/operators/{victim}");
    let create = r#"{"name": "mallory", "role": "admin"}"#;
    for (method, path, body) in [
        ("POST", "/admin/operators", Some(create)),
        ("GET", "/admin/operators", None),
        ("DELETE", revoke.as_str(), None),
    ] {
        let v = api(&app, method, path, Some(&viewer), body).await;
        assert_eq!((v.status, v.code()), (403, "operator_only"), "{method} {path} as a viewer");
        assert_eq!(v.body["error"], "this needs an admin operator token");
        let k = api(&app, method, path, Some(&app.agent.key), body).await;
        assert_eq!((k.status, k.code()), (403, "operator_only"), "{method} {path} with an agent key");
        assert_eq!(api(&app, method, path, None, body).await.status, 401, "{method} {path} without a token");
    }
    let after = (count(&app.db, "SELECT count(*) AS n FROM operators").await, events_count(&app.db).await);
    assert_eq!(after, before, "nothing created, revoked or recorded");
    assert_eq!(live_admins(&app.db).await, 1);
}

async fn events_count(db: &TestDb) -> i64 {
    count(db, "SELECT count(*) AS n FROM operator_events").await
}

#[actix_web::test]
async fn a_new_operator_is_parsed_strictly_and_bad_input_changes_nothing() {
    let app = spawn_app().await;
    let (_, admin) = create_operator(&app.db, "root", Role::Admin).await;
    let before = count(&app.db, "SELECT count(*) AS n FROM operators").await;
    let long = "n".repeat(201);
    let huge = "n".repeat(5000);
    let bodies = [
        r#"{"name": "a", "role": "admin", "token": "x4o_chosen-by-the-caller-0000000000000000000000"}"#.to_owned(),
        r#"{"name": "a", "role": "viewer", "role": "admin"}"#.into(),
        r#"{"name": "a"}"#.into(),
        r#"{"role": "admin"}"#.into(),
        r#"{"name": "a", "role": "Admin"}"#.into(),
        r#"{"name": "a", "role": "root"}"#.into(),
        r#"{"name": "a", "role": ["admin"]}"#.into(),
        r#"{"name": 7, "role": "viewer"}"#.into(),
        r#"{"name": "", "role": "viewer"}"#.into(),
        r#"{"name": "   ", "role": "viewer"}"#.into(),
        r#"{"name": "line\nbreak", "role": "viewer"}"#.into(),
        r#"{"name": "nul\u0000", "role": "viewer"}"#.into(),
        r#"{"name": "evil\u202etxt.exe", "role": "viewer"}"#.into(),
        r#"{"name": "zero\u200bwidth", "role": "viewer"}"#.into(),
        format!(r#"{{"name": "{long}", "role": "viewer"}}"#),
        r#"["a", "admin"]"#.into(),
        "null".into(),
        "{".into(),
        String::new(),
    ];
    for body in &bodies {
        let a = api(&app, "POST", "/admin/operators", Some(&admin), Some(body)).await;
        assert_eq!((a.status, a.code()), (400, "bad_request"), "{body}: {}", a.body);
    }
    let too_big = format!(r#"{{"name": "{huge}", "role": "viewer"}}"#);
    assert_eq!(api(&app, "POST", "/admin/operators", Some(&admin), Some(&too_big)).await.status, 413);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM operators").await, before, "nothing created");
    assert_eq!(events_count(&app.db).await, 0);
    // The limits themselves pass: 200 characters (not bytes), trimmed spaces.
    let edge = "é".repeat(200);
    let made = api(
        &app,
        "POST",
        "/admin/operators",
        Some(&admin),
        Some(&json!({"name": format!(" {edge} "), "role": "viewer"}).to_string()),
    )
    .await;
    assert_eq!((made.status, made.body["operator"]["name"].as_str()), (201, Some(edge.as_str())), "{}", made.body);
}

#[actix_web::test]
async fn the_last_live_admin_is_not_revoked_without_a_bootstrap_token() {
    let app = spawn_app().await;
    let (a_id, a) = create_operator(&app.db, "a", Role::Admin).await;
    let (b_id, _) = create_operator(&app.db, "b", Role::Admin).await;
    assert_eq!(api(&app, "DELETE", &format!("/admin/operators/{b_id}"), Some(&a), None).await.status, 200);
    // `a` is the last live admin (viewers do not count): refused, nothing changed or recorded.
    let refused = api(&app, "DELETE", &format!("/admin/operators/{a_id}"), Some(&a), None).await;
    assert_eq!((refused.status, refused.code()), (409, "last_admin"), "{}", refused.body);
    assert!(refused.body["error"].as_str().unwrap().contains("OPERATOR_TOKEN"), "{}", refused.body);
    assert_eq!(api(&app, "GET", "/admin/operators", Some(&a), None).await.status, 200, "still an admin");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM operator_events WHERE action = 'operator.revoke'").await, 1);
    // The command line refuses it as well.
    let (ok, out) = cli(&app.db, &["revoke", &a_id.to_string()]);
    assert!(!ok && out.contains("last live admin"), "{out}");

    // Two admins revoking each other at once: one wins, one admin is always left.
    let mut survivor = a;
    for round in 0..5 {
        let (s_id, _) = whoami_id(&app, &survivor).await;
        let (n_id, newcomer) = create_over_api(&app, &survivor, &format!("n{round}"), "admin").await;
        let (revoke_n, revoke_s) = (format!("/admin/operators/{n_id}"), format!("/admin/operators/{s_id}"));
        let (x, y) = tokio::join!(
            api(&app, "DELETE", &revoke_n, Some(&survivor), None),
            api(&app, "DELETE", &revoke_s, Some(&newcomer), None),
        );
        assert_eq!(live_admins(&app.db).await, 1, "round {round}: {} {} / {} {}", x.status, x.body, y.status, y.body);
        assert_eq!([x.status, y.status].iter().filter(|s| **s == 200).count(), 1, "round {round}");
        if y.status == 200 {
            survivor = newcomer;
        }
    }

    // With a bootstrap token on the router, the last admin may go: the bootstrap remains.
    let extra = vec![("operator-token".to_owned(), BOOTSTRAP.to_owned())];
    let boot = spawn_app_on(app.db.clone(), AppOptions { extra, ..Default::default() }).await;
    let (s_id, _) = whoami_id(&app, &survivor).await;
    assert_eq!(api(&boot, "DELETE", &format!("/admin/operators/{s_id}"), Some(BOOTSTRAP), None).await.status, 200);
    assert_eq!(live_admins(&app.db).await, 0);
    assert_eq!(api(&boot, "GET", "/admin/operators", Some(BOOTSTRAP), None).await.status, 200);
}

/// The operator id of a token (`GET /audit/whoami`) and its name.
async fn whoami_id(app: &TestApp, token: &str) -> (String, String) {
    let me = api(app, "GET", "/audit/whoami", Some(token), None).await.body;
    (me["operator_id"].as_str().unwrap().to_owned(), me["name"].as_str().unwrap().to_owned())
}

/// Retiring the bootstrap token (docs/operations.md): an admin made with it, then a router
/// without `OPERATOR_TOKEN`, where the new admin does everything.
#[actix_web::test]
async fn the_bootstrap_token_can_be_retired_for_an_admin_token() {
    let db = std::sync::Arc::new(TestDb::new().await);
    let extra = vec![("operator-token".to_owned(), BOOTSTRAP.to_owned())];
    let with = spawn_app_on(db.clone(), AppOptions { extra, ..Default::default() }).await;
    let (admin_id, admin) = create_over_api(&with, BOOTSTRAP, "first-admin", "admin").await;
    let ev = api(&with, "GET", "/audit/operator-events?action=operator.create", Some(&admin), None).await.body;
    assert_eq!(ev["events"][0]["operator_name"], "bootstrap", "{ev}");
    assert!(ev["events"][0]["operator_id"].is_null());
    drop(with);

    let without = spawn_app_on(db.clone(), AppOptions::default()).await;
    assert_eq!(api(&without, "GET", "/admin/operators", Some(BOOTSTRAP), None).await.status, 401, "retired");
    assert_eq!(api(&without, "GET", "/admin/operators", Some(&admin), None).await.status, 200);
    let (_, viewer) = create_over_api(&without, &admin, "reader", "viewer").await;
    assert_eq!(api(&without, "GET", "/audit/payments", Some(&viewer), None).await.status, 200);
    assert_eq!(api(&without, "GET", "/metrics", Some(&admin), None).await.status, 200);
    // And the new admin cannot lock everyone out by revoking itself.
    let last = api(&without, "DELETE", &format!("/admin/operators/{admin_id}"), Some(&admin), None).await;
    assert_eq!((last.status, last.code()), (409, "last_admin"));
}

/// A counter's value on the open metrics listener (0 when absent).
async fn counter(app: &TestApp, series: &str) -> u64 {
    let open = app.metrics_address.clone().expect("a metrics listener");
    let text = reqwest::get(format!("{open}/metrics")).await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0)
}

fn throttled_app(failures: u32, window_ms: u64) -> AppOptions {
    let extra = [
        ("operator-auth-max-failures", failures.to_string()),
        ("operator-auth-window-ms", window_ms.to_string()),
        ("metrics-addr", "127.0.0.1:0".into()),
        ("operator-token", BOOTSTRAP.into()),
    ];
    AppOptions { extra: extra.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(), ..Default::default() }
}

const FAILURES: &str = "x402_router_operator_auth_failures_total";

#[actix_web::test]
async fn failed_operator_authentications_are_throttled_per_address_until_the_window_passes() {
    let app = spawn_app_with(throttled_app(4, 4000)).await;
    let (_, admin) = create_operator(&app.db, "root", Role::Admin).await;
    let forged = format!("x4o_{}", "A".repeat(43));
    // Successes are no failures, however many.
    for _ in 0..12 {
        assert_eq!(api(&app, "GET", "/admin/operators", Some(&admin), None).await.status, 200);
    }
    // Four failures of each kind, a success in between (which clears nothing).
    assert_eq!(api(&app, "GET", "/audit/payments", Some(&forged), None).await.status, 401);
    assert_eq!(api(&app, "GET", "/admin/operators", Some(&app.agent.key), None).await.status, 403);
    assert_eq!(api(&app, "GET", "/admin/operators", Some(&admin), None).await.status, 200);
    assert_eq!(api(&app, "GET", "/metrics", None, None).await.status, 401);
    assert_eq!(
        api(&app, "POST", "/admin/operators", Some("operators-bootstrap-token-0123456780"), Some("{}")).await.status,
        401
    );
    // Past the limit: 429 before anything is looked up, for a guess and for the right token alike.
    let throttled = api(&app, "GET", "/audit/payments", Some(&forged), None).await;
    assert_eq!((throttled.status, throttled.code()), (429, "auth_throttled"), "{}", throttled.body);
    assert!(throttled.retry_after.is_some_and(|s| (1..=4).contains(&s)), "Retry-After {:?}", throttled.retry_after);
    for token in [admin.as_str(), BOOTSTRAP] {
        let refused = api(&app, "GET", "/admin/operators", Some(token), None).await;
        assert_eq!((refused.status, refused.code()), (429, "auth_throttled"));
    }
    // Counted by reason; a refusal is no new failure.
    for (reason, n) in [("unknown", 2), ("agent_key", 1), ("missing", 1)] {
        assert_eq!(counter(&app, &format!("{FAILURES}{{reason=\"{reason}\"}}")).await, n, "{reason}");
    }
    assert_eq!(counter(&app, "x402_router_operator_auth_throttled_total").await, 3);
    // Another address is not affected (the TCP peer counts, never a forwarded header).
    let other =
        reqwest::Client::builder().local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    assert_eq!(send(&other, &app.address, "GET", "/admin/operators", Some(&admin), None).await.status, 200);
    let forwarded = app
        .client
        .get(format!("{}/admin/operators", app.address))
        .bearer_auth(&admin)
        .header("X-Forwarded-For", "127.0.0.9")
        .send()
        .await
        .unwrap();
    assert_eq!(forwarded.status(), 429, "a forwarded header changes nothing");

    // Once the window has passed, the address may try again, with a fresh count.
    wait_until("the window to pass", Duration::from_secs(15), async || {
        api(&app, "GET", "/admin/operators", Some(&admin), None).await.status == 200
    })
    .await;
    assert_eq!(api(&app, "GET", "/audit/payments", Some(&forged), None).await.status, 401);
}

#[actix_web::test]
async fn a_burst_of_concurrent_guesses_gets_no_more_answers_than_the_limit() {
    let app = spawn_app_with(throttled_app(5, 60_000)).await;
    let guesses = futures_util::future::join_all((0..40).map(|i| {
        let token = format!("x4o_{i:0>43}");
        let (client, base) = (app.client.clone(), app.address.clone());
        async move { send(&client, &base, "GET", "/audit/payments", Some(&token), None).await.status }
    }))
    .await;
    let answered = guesses.iter().filter(|s| **s == 401).count();
    assert_eq!(answered, 5, "{guesses:?}");
    assert_eq!(guesses.iter().filter(|s| **s == 429).count(), 35, "{guesses:?}");
    assert_eq!(counter(&app, &format!("{FAILURES}{{reason=\"unknown\"}}")).await, 5);
}
