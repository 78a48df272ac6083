//! The operator surface: the audit API, `reconcile`, `receipts verify`, and the OpenAPI
//! document held to the route table.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use x402_router_testkit::{wait::let_time_pass, wait_for};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::*;

const OPERATOR_TOKEN: &str = "operator-token-for-tests-0123456789";

fn with_operator(mut extra: Vec<(String, String)>) -> AppOptions {
    extra.push(("operator-token".into(), OPERATOR_TOKEN.into()));
    AppOptions { extra, ..Default::default() }
}

/// A router that lets the tests below fail to authenticate more often than the operator-auth
/// throttle allows one address by default (they try every credential on every path).
fn lenient(mut options: AppOptions) -> AppOptions {
    options.extra.push(("operator-auth-max-failures".into(), "1000".into()));
    options
}

async fn operator_app() -> TestApp {
    spawn_app_with(with_operator(vec![])).await
}

/// GET `path` (with its query) as the operator: status and JSON body.
async fn audit(app: &TestApp, path: &str) -> (u16, Value) {
    let resp = app.client.get(format!("{}{path}", app.address)).bearer_auth(OPERATOR_TOKEN).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// GET `path` as the operator: the raw body text (to look for leaked secrets).
async fn audit_text(app: &TestApp, path: &str) -> String {
    app.client
        .get(format!("{}{path}", app.address))
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect()
}

/// A receipt row with the given `created_at` (an SQL expression) and payment network (or
/// no payment). Its signature is not valid: these rows exercise queries, not signatures.
async fn insert_receipt(db: &TestDb, agent: Uuid, created_at: &str, network: Option<&str>) -> Uuid {
    let id = Uuid::new_v4();
    let payment = network
        .map_or("NULL".to_owned(), |n| format!("'{}'", json!({"network": n, "amount": "1", "status": "settled"})));
    exec(
        db,
        &format!(
            "INSERT INTO receipts (id, agent_id, idempotency_key, request_hash, method, url, upstream_status, \
             upstream_body_sha256, payment, outcome, created_at, signer, signature) VALUES \
             ('{id}', '{agent}', 'key-{}', 'h', 'GET', 'http://example.test/', 200, 's', {payment}, 'completed', \
             {created_at}, '0x0', '0x0')",
            id.simple()
        ),
    )
    .await;
    id
}

/// A payment intent row whose header and signature are recognisable fakes ("SECRET…").
async fn insert_payment(db: &TestDb, agent: Uuid, status: &str, created_at: &str) -> Uuid {
    let seed = Seed::new(agent, status).written_at(created_at);
    let header = format!("SECRETHEADER{}", seed.id.simple());
    seed.signed(r#"{"signature": "0xSECRETSIGNATURE"}"#, &header).insert(db).await
}

#[derive(diesel::QueryableByName)]
struct Text {
    #[diesel(sql_type = diesel::sql_types::Text)]
    t: String,
}

/// Runs a `SELECT … AS t` returning one text value.
async fn text(db: &TestDb, sql: &str) -> String {
    use diesel_async::RunQueryDsl;
    let mut conn = db.conn().await;
    let row: Text = diesel::sql_query(sql).get_result(&mut conn).await.unwrap();
    row.t
}

/// Runs `x402-router reconcile` on `db` against `rpc_url`: exit success and the JSON line.
fn reconcile(db: &TestDb, rpc_url: &str) -> (bool, Value) {
    let out = router_command()
        .arg("reconcile")
        .env("DATABASE_URL", &db.url)
        .env("X402_RPC_URLS", format!("eip155:84532={rpc_url}"))
        .env("X402_RPC_TIMEOUT_MS", "1000")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout:?}");
    (out.status.success(), serde_json::from_str(&stdout).unwrap())
}

const AUDIT_PATHS: &[&str] = &[
    "/audit/receipts",
    "/audit/receipts/00000000-0000-0000-0000-000000000000",
    "/audit/idempotency?agent_id=00000000-0000-0000-0000-000000000000&key=some-key-0123456789",
    "/audit/payments?status=stuck",
    "/audit/agents/00000000-0000-0000-0000-000000000000/spend",
    "/audit/overview",
];

#[actix_web::test]
async fn audit_endpoints_refuse_absent_wrong_and_agent_credentials() {
    let app = spawn_app_with(lenient(with_operator(vec![]))).await;
    for path in AUDIT_PATHS {
        let url = format!("{}{path}", app.address);
        let none = app.client.get(&url).send().await.unwrap();
        assert_eq!(none.status(), 401, "{path}");
        assert!(none.json::<Value>().await.unwrap()["error"].is_string());
        for wrong in ["operator-token-for-tests-012345678", "operator-token-for-tests-01234567890", "x"] {
            let r = app.client.get(&url).bearer_auth(wrong).send().await.unwrap();
            assert_eq!(r.status(), 401, "{path} with {wrong}");
        }
        let agent = app.client.get(&url).bearer_auth(&app.agent.key).send().await.unwrap();
        assert_eq!(agent.status(), 403, "{path} with an agent key");
        assert_eq!(agent.json::<Value>().await.unwrap()["code"], "operator_only");
        let (status, _) = audit(&app, path).await;
        assert!(![401, 403].contains(&status), "{path}: {status}");
    }
}

#[actix_web::test]
async fn without_an_operator_token_only_operator_tokens_open_the_audit_api() {
    let app = spawn_app_with(lenient(AppOptions::default())).await;
    for path in AUDIT_PATHS {
        let url = format!("{}{path}", app.address);
        let r = app.client.get(&url).bearer_auth(OPERATOR_TOKEN).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}: no bootstrap token is configured");
        let r = app.client.get(&url).bearer_auth(&app.agent.key).send().await.unwrap();
        assert_eq!(r.status(), 403, "{path}");
        let r = app.client.get(&url).bearer_auth(&app.viewer_token).send().await.unwrap();
        assert!(![401, 403].contains(&r.status().as_u16()), "{path}: {}", r.status());
    }
}

#[actix_web::test]
async fn malformed_audit_queries_are_400_json_and_unknown_ids_404() {
    let app = operator_app().await;
    for path in [
        "/audit/receipts?limit=0",
        "/audit/receipts?limit=501",
        "/audit/receipts?limit=many",
        "/audit/receipts?cursor=not-a-cursor",
        "/audit/receipts?from=yesterday",
        "/audit/receipts?paid=maybe",
        "/audit/receipts?agent=typo",
        "/audit/payments?status=lost",
        "/audit/payments?status=signed&older_than_secs=5",
        "/audit/idempotency?key=only-the-key-0123456789",
        "/audit/idempotency?agent_id=nope&key=k",
    ] {
        let (status, body) = audit(&app, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body["error"].as_str().unwrap().len() > 5, "{path}: {body}");
    }
    for path in [
        "/audit/receipts/not-a-uuid".to_owned(),
        format!("/audit/receipts/{}", Uuid::new_v4()),
        format!("/audit/agents/{}/spend", Uuid::new_v4()),
        "/audit/agents/nope/spend".to_owned(),
        format!("/audit/idempotency?agent_id={}&key=never-used-key-0123", app.agent.id),
    ] {
        let (status, body) = audit(&app, &path).await;
        assert_eq!(status, 404, "{path}");
        assert_eq!(body["error"], "not found");
    }
}

#[actix_web::test]
async fn receipts_are_filtered_by_agent_time_payment_and_network() {
    let app = operator_app().await;
    let other = create_agent(&app.db, "other").await;
    let me = app.agent.id;
    let old_unpaid = insert_receipt(&app.db, me, "'2026-01-01T00:00:00Z'", None).await;
    let mid_base = insert_receipt(&app.db, me, "'2026-01-02T00:00:00Z'", Some("eip155:8453")).await;
    let mid_sepolia = insert_receipt(&app.db, other.id, "'2026-01-03T00:00:00Z'", Some("eip155:84532")).await;
    let new_unpaid = insert_receipt(&app.db, other.id, "'2026-01-04T00:00:00Z'", None).await;
    let s = |ids: &[Uuid]| ids.iter().map(Uuid::to_string).collect::<Vec<_>>();

    let cases: Vec<(String, Vec<String>)> = vec![
        (String::new(), s(&[old_unpaid, mid_base, mid_sepolia, new_unpaid])),
        (format!("agent_id={me}"), s(&[old_unpaid, mid_base])),
        (format!("agent_id={}", other.id), s(&[mid_sepolia, new_unpaid])),
        ("paid=true".into(), s(&[mid_base, mid_sepolia])),
        ("paid=false".into(), s(&[old_unpaid, new_unpaid])),
        ("network=base-sepolia".into(), s(&[mid_sepolia])),
        ("network=eip155:8453".into(), s(&[mid_base])),
        ("from=2026-01-02T00:00:00Z&to=2026-01-04T00:00:00Z".into(), s(&[mid_base, mid_sepolia])),
        ("from=2026-01-02T01:00:00%2B01:00&paid=false".into(), s(&[new_unpaid])),
        (format!("agent_id={me}&paid=true&network=base"), s(&[mid_base])),
    ];
    for (query, expected) in cases {
        let (status, body) = audit(&app, &format!("/audit/receipts?{query}")).await;
        assert_eq!(status, 200, "{query}: {body}");
        assert_eq!(ids(&body["receipts"]), expected, "{query}");
        assert_eq!(body["next_cursor"], Value::Null, "{query}");
    }

    // One receipt by id, whichever agent it belongs to.
    let (status, one) = audit(&app, &format!("/audit/receipts/{mid_sepolia}")).await;
    assert_eq!(status, 200);
    assert_eq!(one["agent_id"], other.id.to_string());
    assert_eq!(one["payment"]["network"], "eip155:84532");
}

#[actix_web::test]
async fn receipt_pages_return_every_row_exactly_once_while_rows_are_inserted() {
    let app = operator_app().await;
    let agent = app.agent.id;
    // 60 rows in the past, three per timestamp: ties must be broken by id.
    let mut originals = BTreeSet::new();
    let base = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    for i in 0..60 {
        let at = format!("'{base}'::timestamptz + interval '{} seconds'", i / 3);
        originals.insert(insert_receipt(&app.db, agent, &at, None).await.to_string());
    }
    // Meanwhile, another writer keeps inserting rows, now and back-dated into pages
    // already read (which would shift an OFFSET and repeat rows).
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (db, stop) = (Arc::clone(&app.db), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let at = if n % 2 == 0 { "now()" } else { "now() - interval '1 hour'" };
                insert_receipt(&db, agent, at, None).await;
                n += 1;
                // lets time pass: the pace of this background writer (a steady trickle of rows).
                let_time_pass(Duration::from_millis(3)).await;
            }
            n
        })
    };

    let mut seen: Vec<String> = Vec::new();
    let (mut ahead, mut behind) = (BTreeSet::new(), BTreeSet::new());
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            None => "limit=7".to_owned(),
            Some(c) => format!("limit=7&cursor={c}"),
        };
        let (status, body) = audit(&app, &format!("/audit/receipts?{query}")).await;
        assert_eq!(status, 200, "{body}");
        let page = ids(&body["receipts"]);
        assert!(page.len() <= 7);
        seen.extend(page);
        // Between pages: one row behind the cursor, one ahead of it.
        behind.insert(insert_receipt(&app.db, agent, "now() - interval '2 hours'", None).await);
        ahead.insert(insert_receipt(&app.db, agent, "now()", None).await);
        // Once past the original rows, let the tail stop growing.
        if originals.iter().all(|id| seen.contains(id)) {
            stop.store(true, Ordering::Relaxed);
        }
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(writer.await.unwrap() > 0, "the concurrent writer ran");

    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &seen {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "rows served twice: {repeated:?}");
    for id in &originals {
        assert_eq!(counts.get(id.as_str()), Some(&1), "original row {id}");
    }
    // Rows inserted ahead of the cursor were served (all but the one inserted after the
    // last page); rows inserted behind it never were.
    let missed = ahead.iter().filter(|id| !counts.contains_key(id.to_string().as_str())).count();
    assert!(missed <= 1, "{missed} rows inserted ahead of the cursor were missed");
    assert!(behind.iter().all(|id| !counts.contains_key(id.to_string().as_str())));
}

#[actix_web::test]
async fn payment_pages_cover_the_ledger_once_and_filter_by_status_and_agent() {
    let app = operator_app().await;
    let other = create_agent(&app.db, "other").await;
    let mut all = Vec::new();
    let base = (chrono::Utc::now() - chrono::Duration::minutes(100)).to_rfc3339();
    for (i, status) in x402_router::payments::PaymentStatus::ALL.iter().map(|s| s.as_str()).enumerate() {
        // Two rows per timestamp: ties are broken by id.
        let at = format!("'{base}'::timestamptz + interval '{i} seconds'");
        all.push(insert_payment(&app.db, app.agent.id, status, &at).await.to_string());
        all.push(insert_payment(&app.db, other.id, status, &at).await.to_string());
    }
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let text = audit_text(&app, &format!("/audit/payments?limit=3{cursor}")).await;
        assert!(!text.contains("SECRET"), "a bearer instrument leaked: {text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        seen.extend(ids(&body["payments"]));
        match body["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    let mut sorted_seen = seen.clone();
    sorted_seen.sort();
    sorted_seen.dedup();
    assert_eq!(sorted_seen.len(), seen.len(), "no row twice");
    let mut expected = all.clone();
    expected.sort();
    assert_eq!(sorted_seen, expected, "every row once");

    for status in x402_router::payments::PaymentStatus::ALL.map(|s| s.as_str()) {
        let (code, body) = audit(&app, &format!("/audit/payments?status={status}")).await;
        assert_eq!(code, 200);
        let rows = body["payments"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{status}");
        assert!(rows.iter().all(|p| p["status"] == *status));
        assert_eq!(rows[0]["amount"], "10000");
    }
    let (_, mine) = audit(&app, &format!("/audit/payments?status=signed&agent_id={}", other.id)).await;
    assert_eq!(mine["payments"].as_array().unwrap().len(), 1);
    assert_eq!(mine["payments"][0]["agent_id"], other.id.to_string());
    // Each payment names its agent (the console shows agents by name).
    assert_eq!(mine["payments"][0]["agent_name"], "other");
    // The signed rows are 100 minutes old: stuck by default, not when 2 hours are allowed.
    let (_, stuck) = audit(&app, "/audit/payments?status=stuck").await;
    assert_eq!(stuck["payments"].as_array().unwrap().len(), 2);
    let (_, patient) = audit(&app, "/audit/payments?status=stuck&older_than_secs=7200").await;
    assert_eq!(patient["payments"].as_array().unwrap().len(), 0);
}

#[actix_web::test]
async fn idempotency_audit_shows_an_in_flight_and_then_a_completed_key() {
    let app = Arc::new(operator_app().await);
    let up = TestUpstream::start().await;
    let key = new_key();
    let path = format!("/audit/idempotency?agent_id={}&key={key}", app.agent.id);
    let call = {
        let (app, key, url) = (Arc::clone(&app), key.clone(), up.url("/slow?ms=2500"));
        tokio::spawn(async move { app.route(&key, &json!({ "url": url })).await.status() })
    };
    let (app_ref, path_ref) = (&app, path.as_str());
    let in_flight = wait_for(Duration::from_secs(2), "the in-flight key in the audit API", || async move {
        let (status, body) = audit(app_ref, path_ref).await;
        (status == 200).then_some(body)
    })
    .await
    .unwrap_or(Value::Null);
    assert_eq!(in_flight["status"], "in_flight", "{in_flight}");
    assert_eq!(in_flight["key"], key);
    assert_eq!(in_flight["response_status_code"], Value::Null);
    assert_eq!(in_flight["receipt_id"], Value::Null);
    assert_eq!(in_flight["receipt_url"], Value::Null);
    assert_eq!(in_flight["completed_at"], Value::Null);
    assert_eq!(in_flight["takeovers"], 0);
    assert_eq!(in_flight["payment"], Value::Null);
    assert!(in_flight["heartbeat_age_ms"].as_i64().unwrap() < 5_000);
    assert!(in_flight["age_ms"].as_i64().unwrap() >= 0);
    for field in ["request_hash", "first_seen_at", "created_at", "expires_at"] {
        assert!(in_flight[field].is_string(), "{field}: {in_flight}");
    }

    assert_eq!(call.await.unwrap(), 200);
    let (status, done) = audit(&app, &path).await;
    assert_eq!(status, 200);
    assert_eq!(done["status"], "completed");
    assert_eq!(done["response_status_code"], 200);
    assert_eq!(done["request_hash"], in_flight["request_hash"]);
    let receipt_id = done["receipt_id"].as_str().unwrap();
    assert_eq!(done["receipt_url"], format!("/audit/receipts/{receipt_id}"));
    assert!(done["completed_at"].is_string());
    let (status, receipt) = audit(&app, done["receipt_url"].as_str().unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(receipt["idempotency_key"], key);
    assert_eq!(receipt["outcome"], "completed");
}

#[actix_web::test]
async fn a_settlement_whose_answer_was_lost_is_paid_not_served() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(with_operator(chain.router_extra())).await;
    let served = new_key();
    let lost = new_key();
    let ok = app.route(&served, &json!({"url": chain.url("/v2/weather"), "max_amount": "10000"})).await;
    assert_eq!(ok.status(), 200);
    let dropped = app.route(&lost, &json!({"url": chain.url("/v2/settle-then-drop"), "max_amount": "10000"})).await;
    assert_eq!(dropped.status(), 502);

    let text = audit_text(&app, "/audit/payments?status=paid_not_served").await;
    let body: Value = serde_json::from_str(&text).unwrap();
    let rows = body["payments"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{body}");
    let p = &rows[0];
    assert_eq!(p["idempotency_key"], lost);
    assert_eq!(p["status"], "settled_response_lost");
    assert_eq!(p["amount"], PRICE.to_string());
    assert_eq!(p["receipt_outcome"], "errored");
    assert_eq!(p["idempotency_status"], "errored");
    assert!(p.get("header_value").is_none() && p.get("signed_authorization").is_none());

    // No bearer instrument in any payment view. The payment header is kept only sealed, and
    // only while the payment may still need it (the lost one; the served one's is dropped).
    let header = [opened_intent(&app.db, &lost).await.exact().unwrap().header_value.clone()];
    assert!(payment_row(&app.db, &served).await.sealed.is_none(), "dropped once settled and served");
    let signatures = text_of(&app.db, "signed_authorization->>'signature'").await;
    for path in [
        "/audit/payments".to_owned(),
        "/audit/payments?status=settled".to_owned(),
        format!("/audit/idempotency?agent_id={}&key={lost}", app.agent.id),
        format!("/audit/idempotency?agent_id={}&key={served}", app.agent.id),
    ] {
        let text = audit_text(&app, &path).await;
        for secret in header.iter().chain(&signatures) {
            assert!(!text.contains(secret.as_str()), "{path} leaks a bearer instrument");
        }
    }
    let (_, key) = audit(&app, &format!("/audit/idempotency?agent_id={}&key={lost}", app.agent.id)).await;
    assert_eq!(key["status"], "errored");
    assert_eq!(key["response_status_code"], 502);
    assert_eq!(key["payment"]["status"], "settled_response_lost");
    assert_eq!(key["payment"]["payer"], ROUTER_ADDRESS.to_checksum(None));

    let (_, settled) = audit(&app, "/audit/payments?status=settled").await;
    assert_eq!(settled["payments"][0]["idempotency_key"], served);
    assert_eq!(settled["payments"][0]["receipt_outcome"], "completed");
    let (_, paid) = audit(&app, "/audit/receipts?paid=true&network=base-sepolia").await;
    assert_eq!(paid["receipts"].as_array().unwrap().len(), 2);
    let (status, spend) = audit(&app, &format!("/audit/agents/{}/spend", app.agent.id)).await;
    assert_eq!(status, 200);
    assert_eq!(spend["settled_24h"], (2 * PRICE).to_string());
    assert_eq!(spend["reserved_24h"], "0");
}

/// Every value of `column` (an SQL expression) in `payments`.
async fn text_of(db: &TestDb, column: &str) -> Vec<String> {
    let all = text(db, &format!("SELECT string_agg({column}, ' ') AS t FROM payments")).await;
    let out: Vec<String> = all.split_whitespace().map(str::to_owned).collect();
    assert!(out.len() >= 2 && out.iter().all(|s| s.len() > 20), "{out:?}");
    out
}

#[actix_web::test]
async fn reconcile_settles_used_stuck_intents_expires_unused_ones_and_spares_live_owners() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(with_operator(chain.router_extra())).await;
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 100000 WHERE id = '{}'", app.agent.id)).await;
    let (used, expired, live) = (new_key(), new_key(), new_key());
    crash_after_signing(&app, &chain, &used, &json!({"url": chain.url("/v2/weather"), "max_amount": "10000"}), 200)
        .await;
    crash_after_signing(&app, &chain, &expired, &json!({"url": chain.url("/v2/weather"), "max_amount": "10000"}), -300)
        .await;
    crash_after_signing(&app, &chain, &live, &json!({"url": chain.url("/v2/weather"), "max_amount": "10000"}), -300)
        .await;
    exec(
        &app.db,
        "UPDATE payments SET created_at = now() - interval '5 minutes', updated_at = now() - interval '5 minutes'",
    )
    .await;
    // `live` has an owner whose heartbeat is fresh: nobody but that owner may decide.
    exec(&app.db, &format!("UPDATE idempotency_keys SET created_at = now() WHERE key = '{live}'")).await;
    // `used`: the signed payment reached the upstream, which settled it on-chain; the
    // router never heard back.
    let header_name =
        text(&app.db, &format!("SELECT header_name AS t FROM payments WHERE idempotency_key = '{used}'")).await;
    let header_value = opened_intent(&app.db, &used).await.exact().unwrap().header_value.clone();
    let paid =
        reqwest::Client::new().get(chain.url("/v2/weather")).header(header_name, header_value).send().await.unwrap();
    assert_eq!(paid.status(), 200);
    let used_nonce = text(&app.db, &format!("SELECT nonce AS t FROM payments WHERE idempotency_key = '{used}'")).await;
    assert!(chain.authorization_used(ROUTER_ADDRESS, used_nonce.parse().unwrap()).await);

    let (_, stuck) = audit(&app, "/audit/payments?status=stuck").await;
    assert_eq!(stuck["payments"].as_array().unwrap().len(), 3);
    let spend_path = format!("/audit/agents/{}/spend", app.agent.id);
    let (_, before) = audit(&app, &spend_path).await;
    assert_eq!(before["reserved_24h"], (3 * PRICE).to_string());
    assert_eq!(before["remaining_24h"], (100_000 - 3 * PRICE).to_string());

    // With the chain unreachable nothing is decided, and the run fails.
    let (ok, report) = reconcile(&app.db, &format!("http://127.0.0.1:{}", free_port()));
    assert!(!ok);
    assert_eq!(report["checked"], 2, "{report}");
    assert_eq!(report["errors"], 2, "{report}");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'signed'").await, 3);

    let (ok, report) = reconcile(&app.db, &chain.rpc_url);
    assert!(ok, "{report}");
    assert_eq!(
        report,
        json!({"checked": 2, "settled": 0, "settled_response_lost": 1, "expired": 1, "pending": 0, "errors": 0,
               "recovered": 0, "reaccessed": 0, "recovery_lost": 0, "resends": 0, "recovery_deferred": 0,
               "charges_proven": 0, "channels_checked": 0, "channels_flagged": 0})
    );
    for (key, status) in [(&used, "settled_response_lost"), (&expired, "expired"), (&live, "signed")] {
        let sql = format!("SELECT status AS t FROM payments WHERE idempotency_key = '{key}'");
        assert_eq!(text(&app.db, &sql).await, status);
    }

    // The expired reservation is released; the used one counts as spent.
    let (_, after) = audit(&app, &spend_path).await;
    assert_eq!(after["settled_24h"], PRICE.to_string());
    assert_eq!(after["reserved_24h"], PRICE.to_string());
    assert_eq!(after["remaining_24h"], (100_000 - 2 * PRICE).to_string());
    // The money moved and no call was served: operators see it.
    let (_, lost) = audit(&app, "/audit/payments?status=paid_not_served").await;
    assert_eq!(ids(&lost["payments"]).len(), 1);
    assert_eq!(lost["payments"][0]["idempotency_key"], used);

    // Running it again changes nothing.
    let (ok, again) = reconcile(&app.db, &chain.rpc_url);
    assert!(ok);
    assert_eq!(again["checked"], 0, "{again}");
}

#[actix_web::test]
async fn receipts_verify_accepts_a_served_receipt_and_refuses_one_changed_byte() {
    let app = operator_app().await;
    let up = TestUpstream::start().await;
    let resp = app.route(&new_key(), &json!({"url": up.url("/ok/verify")})).await;
    let receipt_id = resp.headers()["x-receipt-id"].to_str().unwrap().to_owned();
    let served = audit_text(&app, &format!("/audit/receipts/{receipt_id}")).await;
    let dir = std::env::temp_dir().join(format!("x4r-verify-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let verify = |text: &str| {
        let file = dir.join("receipt.json");
        std::fs::write(&file, text).unwrap();
        let out = router_command().args(["receipts", "verify"]).arg(&file).output().unwrap();
        (out.status.code(), String::from_utf8(out.stdout).unwrap())
    };

    let (code, stdout) = verify(&served);
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(stdout.trim(), format!("valid: signed by {}", ROUTER_ADDRESS.to_checksum(None)));

    // One byte of the request hash changed.
    let at = served.find("\"request_hash\":\"").unwrap() + "\"request_hash\":\"".len();
    let mut bytes = served.clone().into_bytes();
    bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
    let (code, stdout) = verify(&String::from_utf8(bytes).unwrap());
    assert_eq!(code, Some(1));
    assert!(stdout.starts_with("invalid: "), "{stdout}");

    // From stdin too, and an unreadable file is not a verdict.
    let mut child = router_command()
        .args(["receipts", "verify", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), served.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap().starts_with("valid: signed by 0x"));
    let missing = router_command().args(["receipts", "verify"]).arg(dir.join("absent.json")).output().unwrap();
    assert_eq!(missing.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[actix_web::test]
async fn the_openapi_document_describes_exactly_the_served_route_table() {
    let doc: Value = serde_json::from_str(x402_router::routes::openapi::json()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "patch", "delete", "head", "options"].contains(&method.as_str()) {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let served: BTreeSet<(String, String)> =
        x402_router::routes::ROUTES.iter().map(|(m, p, _)| (m.as_str().to_owned(), (*p).to_owned())).collect();
    assert_eq!(documented, served);
    for scheme in ["agentKey", "operatorToken"] {
        assert_eq!(doc["components"]["securitySchemes"][scheme]["scheme"], "bearer");
    }

    // Served as is, and every documented endpoint exists on a real server: without
    // credentials each answers something other than the catch-all 404 (or a 405).
    let app = operator_app().await;
    let (status, served_doc) = audit(&app, "/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(served_doc, doc);
    for (method, path) in &documented {
        let url = format!("{}{}", app.address, path.replace("{id}", &Uuid::new_v4().to_string()));
        let resp =
            app.client.request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), &url).send().await.unwrap();
        assert!(![404, 405].contains(&resp.status().as_u16()), "{method} {path}: {}", resp.status());
    }
}

/// docs/openapi.json is the generated document, committed for readers and the clients.
#[test]
fn the_committed_openapi_copy_is_the_generated_document() {
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json")).unwrap();
    assert!(
        committed == x402_router::routes::openapi::json(),
        "docs/openapi.json differs from the generated document: run `cargo run --quiet -- openapi > docs/openapi.json`"
    );
    // The `openapi` subcommand prints the same document.
    let out = router_command().arg("openapi").output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), x402_router::routes::openapi::json());
}

#[test]
fn reconcile_and_receipts_verify_have_help_and_name_a_missing_setting() {
    for sub in [&["reconcile"][..], &["receipts"], &["receipts", "verify"]] {
        let out = router_command().args(sub).arg("--help").output().unwrap();
        assert!(out.status.success(), "{sub:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
    }
    for (env, named) in [
        (&[][..], "DATABASE_URL"),
        (&[("DATABASE_URL", "postgres://x/y")][..], "X402_RPC_URLS"),
        (&[("DATABASE_URL", "postgres://x/y"), ("X402_RPC_URLS", "eip155:84532=ftp://x")][..], "X402_RPC_URLS"),
        (
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("X402_RPC_URLS", "eip155:84532=http://127.0.0.1:1"),
                ("RECONCILE_OLDER_THAN_SECS", "soon"),
            ][..],
            "RECONCILE_OLDER_THAN_SECS",
        ),
    ] {
        let mut cmd = router_command();
        cmd.arg("reconcile");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{named}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(named), "{named} not named in {stderr:?}");
        assert!(out.stdout.is_empty());
    }
}

#[actix_web::test]
async fn reconcile_without_a_terminal_logs_one_progress_line_per_batch_of_intents() {
    let app = operator_app().await;
    for _ in 0..3 {
        insert_payment(&app.db, app.agent.id, "signed", "now() - interval '10 minutes'").await;
    }
    // A fresh one is within the grace period: not counted.
    insert_payment(&app.db, app.agent.id, "signed", "now()").await;
    // The chain does not answer: every intent is checked (an error each), in one batch.
    let out = router_command()
        .arg("reconcile")
        .env("DATABASE_URL", &app.db.url)
        .env("X402_RPC_URLS", format!("eip155:84532=http://127.0.0.1:{}", free_port()))
        .env("X402_RPC_TIMEOUT_MS", "1000")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["checked"].as_u64(), report["errors"].as_u64()), (Some(3), Some(3)), "{report} {stderr}");
    crate::cli::assert_steps(&crate::cli::progress_lines(&stderr, "reconcile"), "intents", &[3]);
}
