//! Secrets at rest (issue 38): what an agent forwards to an upstream (its credentials in
//! headers, secret query parameters, a body) reaches the upstream and nothing else: not
//! Postgres in the clear, not any answer of the API (the `/route` envelope and its replay,
//! MCP `fetch`, receipts, the audit API and its CSV, the operator events), not a log line at
//! any level, while recovery of a lost answer still re-sends the exact request, credentials
//! included, and the upstream accepts it.
//!
//! The upstream of these tests (`/v2/pid`) binds its answer cache to the caller's credentials
//! (`Authorization`, `Cookie`, `X-Api-Key`) besides the URL, body and payment header: a
//! re-send that lost or altered one of them is refused (409), not recovered.

use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use x402_router_testkit::Deadline;

use crate::helpers::tls_services::wait_until;
use crate::helpers::*;

const OPERATOR: &str = "secrets-test-operator-token";

/// What an agent forwards that must go nowhere but to the upstream. Unique per test, so a
/// match can only come from this test's call.
struct Forwarded {
    bearer: String,
    cookie: String,
    x_api_key: String,
    proxy: String,
    /// Values of secret query parameters: `api_key`, `API%5FKEY` (percent-encoded name),
    /// `Token` (another case), `sig` twice (repeated).
    query: [String; 5],
    /// A value in a POST body.
    body: String,
}

impl Forwarded {
    fn new() -> Self {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let s = |what: &str| format!("s3cr3t{what}{tag}");
        Self {
            bearer: s("bearer"),
            cookie: s("cookie"),
            x_api_key: s("xapikey"),
            proxy: s("proxy"),
            query: [s("qapikey"), s("qencoded"), s("qtoken"), s("qsigone"), s("qsigtwo")],
            body: s("body"),
        }
    }

    fn all(&self) -> Vec<&str> {
        let mut all = vec![self.bearer.as_str(), &self.cookie, &self.x_api_key, &self.proxy, &self.body];
        all.extend(self.query.iter().map(String::as_str));
        all
    }

    /// The query string that carries the query secrets (the route's own parameters first).
    fn query_string(&self, own: &str) -> String {
        let q = &self.query;
        format!("?{own}&api_key={}&API%5FKEY={}&n=1&Token={}&sig={}&sig={}", q[0], q[1], q[2], q[3], q[4])
    }

    fn headers(&self) -> Value {
        json!({
            "Authorization": format!("Bearer {}", self.bearer),
            "Cookie": format!("session={}", self.cookie),
            "X-Api-Key": self.x_api_key,
            "Proxy-Authorization": format!("Basic {}", self.proxy),
            "Accept": "application/json",
        })
    }

    /// The `/route` body of a paid call to `path` with every secret.
    fn call(&self, chain: &Devnet, path: &str, own_query: &str) -> Value {
        json!({"url": chain.url(&format!("{path}{}", self.query_string(own_query))), "headers": self.headers(),
               "max_amount": "10000"})
    }

    /// The forms of the secrets that `text` shows, as is or inside base64.
    fn shown_in(&self, text: &str) -> Vec<String> {
        self.all().into_iter().flat_map(forms).filter(|form| text.contains(form.as_str())).collect()
    }

    /// Panics when `text` (what `place` holds) shows any secret, as is, or inside base64.
    fn assert_none_in(&self, place: &str, text: &str) {
        if let Some(form) = self.shown_in(text).first() {
            panic!("{place} shows a forwarded secret ({form:?}):\n{}", excerpt(text, form));
        }
    }
}

/// The text around `needle` in `text`.
fn excerpt(text: &str, needle: &str) -> String {
    let at = text.find(needle).unwrap_or(0);
    let start = text[..at].char_indices().rev().nth(200).map_or(0, |(i, _)| i);
    let end = text[at..].char_indices().nth(300).map_or(text.len(), |(i, _)| at + i);
    text[start..end].to_owned()
}

/// `secret` and the parts of its base64 encodings that only it determines, at each of the
/// three byte offsets it may start at inside base64-encoded data (a payment header, an
/// encoded envelope).
fn forms(secret: &str) -> Vec<String> {
    let mut out = vec![secret.to_owned()];
    for offset in 0..3usize {
        let mut data = vec![0u8; offset];
        data.extend_from_slice(secret.as_bytes());
        let encoded = STANDARD.encode(&data);
        let (from, to) = (8 * offset, 8 * (offset + secret.len()));
        let core: String =
            encoded.chars().enumerate().filter(|(i, _)| 6 * i >= from && 6 * i + 6 <= to).map(|(_, c)| c).collect();
        out.push(core);
    }
    out
}

#[derive(diesel::QueryableByName)]
struct Column {
    #[diesel(sql_type = diesel::sql_types::Text)]
    table_name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    column_name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    data_type: String,
}

#[derive(diesel::QueryableByName)]
struct Text {
    #[diesel(sql_type = diesel::sql_types::Text)]
    t: String,
}

/// Every value of every column of every table of the test database, as text (BYTEA as its
/// bytes, non-printable ones escaped), column by column.
async fn whole_database(db: &TestDb) -> Vec<(String, String)> {
    use diesel_async::RunQueryDsl;
    let mut conn = db.conn().await;
    let columns: Vec<Column> = diesel::sql_query(
        "SELECT c.table_name::text AS table_name, c.column_name::text AS column_name, c.data_type::text AS data_type \
           FROM information_schema.columns c JOIN information_schema.tables t \
             ON t.table_schema = c.table_schema AND t.table_name = c.table_name \
          WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE' ORDER BY 1, 2",
    )
    .load(&mut conn)
    .await
    .unwrap();
    assert!(
        columns.iter().any(|c| c.table_name == "payments" && c.column_name == "signed_authorization"),
        "the whole schema is read"
    );
    let mut out = Vec::new();
    for c in columns {
        let value = if c.data_type == "bytea" {
            format!("encode(\"{}\", 'escape')", c.column_name)
        } else {
            format!("\"{}\"::text", c.column_name)
        };
        let sql = format!("SELECT coalesce(string_agg({value}, E'\\n'), '') AS t FROM \"{}\"", c.table_name);
        let text: Text = diesel::sql_query(sql).get_result(&mut conn).await.unwrap();
        out.push((format!("{}.{}", c.table_name, c.column_name), text.t));
    }
    out
}

/// Asserts that no column of the database holds a forwarded secret (naming every one that does).
async fn assert_none_in_postgres(db: &TestDb, forwarded: &Forwarded) {
    let leaks: Vec<String> = whole_database(db)
        .await
        .into_iter()
        .filter_map(|(column, text)| {
            let shown = forwarded.shown_in(&text);
            (!shown.is_empty()).then(|| format!("{column}: {}", shown.join(", ")))
        })
        .collect();
    assert!(leaks.is_empty(), "Postgres holds forwarded secrets:\n{}", leaks.join("\n"));
}

/// A router process whose log (every level: `RUST_LOG=trace`) goes to `log`; its address.
async fn logged_router(
    db_url: &str,
    opts: &AppOptions,
    prefix: &str,
    log: &std::path::Path,
) -> (tokio::process::Child, String) {
    let bind = format!("127.0.0.1:{}", free_port());
    let args = serve_args(opts, db_url, prefix, &bind);
    let file = std::fs::File::create(log).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_x402-router"))
        .args(&args[1..])
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env("RUST_LOG", "trace")
        .kill_on_drop(true)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let health = format!("http://{bind}/healthz");
    wait_until(&format!("the router on {bind}"), Duration::from_secs(10), async || {
        client.get(&health).send().await.is_ok()
    })
    .await;
    (child, format!("http://{bind}"))
}

/// GET `path` of `base` with `bearer`: the body as text (asserted 200).
async fn text_of(client: &reqwest::Client, base: &str, path: &str, bearer: &str) -> String {
    let resp = client.get(format!("{base}{path}")).bearer_auth(bearer).send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "GET {path}: {text}");
    text
}

/// Every answer of the API about the agent's calls, as text, by path.
async fn every_answer(client: &reqwest::Client, base: &str, agent: &Agent, key: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let receipts = text_of(client, base, "/receipts", &agent.key).await;
    let ids: Vec<String> = serde_json::from_str::<Value>(&receipts).unwrap()["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(!ids.is_empty());
    out.push(("/receipts".to_owned(), receipts));
    let mut paths: Vec<(String, &str)> = vec![
        (format!("/payments?idempotency_key={key}"), agent.key.as_str()),
        ("/agents/me".to_owned(), agent.key.as_str()),
        ("/audit/receipts".to_owned(), OPERATOR),
        ("/audit/payments".to_owned(), OPERATOR),
        ("/audit/payments?status=settled".to_owned(), OPERATOR),
        ("/audit/payments.csv".to_owned(), OPERATOR),
        (format!("/audit/idempotency?agent_id={}&key={key}", agent.id), OPERATOR),
        ("/audit/overview".to_owned(), OPERATOR),
        ("/audit/operator-events".to_owned(), OPERATOR),
        ("/audit/upto".to_owned(), OPERATOR),
    ];
    for id in &ids {
        paths.push((format!("/receipts/{id}"), agent.key.as_str()));
        paths.push((format!("/audit/receipts/{id}"), OPERATOR));
    }
    for (path, bearer) in paths {
        let text = text_of(client, base, &path, bearer).await;
        out.push((path, text));
    }
    out
}

/// An MCP `fetch` of `arguments` over `/mcp` (initialize, initialized, tools/call): the raw
/// text of the tool call's answer.
async fn mcp_fetch(client: &reqwest::Client, base: &str, agent: &Agent, arguments: Value) -> String {
    let post = |body: Value, session: Option<&str>| {
        let mut req = client
            .post(format!("{base}/mcp"))
            .bearer_auth(&agent.key)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(s) = session {
            req = req.header("mcp-session-id", s).header("mcp-protocol-version", "2025-11-25");
        }
        req.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let resp = post(init, None).await.unwrap();
    let session = resp.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    resp.text().await.unwrap();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(initialized, Some(&session)).await.unwrap().text().await.unwrap();
    let call =
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "fetch", "arguments": arguments}});
    let resp = post(call, Some(&session)).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

/// Retries `body` under `key` on `base` until it is no longer 409 in flight.
async fn retry_until_final(
    client: &reqwest::Client,
    base: &str,
    agent: &Agent,
    key: &str,
    body: &Value,
) -> (u16, String) {
    let mut deadline =
        Deadline::after(Duration::from_secs(40), "the key stayed in flight").every(Duration::from_millis(100));
    loop {
        let resp = route_at(client, base, agent, key, body).await;
        let status = resp.status().as_u16();
        if status != 409 {
            return (status, resp.text().await.unwrap());
        }
        deadline.next_poll().await.unwrap();
    }
}

#[actix_web::test]
async fn a_forwarded_secret_reaches_the_upstream_and_no_table_answer_or_log_line() {
    let forwarded = Forwarded::new();
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "secrets").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions {
        abandon_ms: 1500,
        heartbeat_ms: 300,
        deadline_ms: 30_000,
        extra: [chain.router_extra(), vec![("operator-token".into(), OPERATOR.into())]].concat(),
        ..Default::default()
    };
    let logs = std::env::temp_dir().join(format!("x4r-secrets-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&logs).unwrap();
    let (log_a, log_b) = (logs.join("a.log"), logs.join("b.log"));
    // Router A takes the paid call and is killed once the upstream settled it (its answer is
    // lost); router B takes the key over and recovers the answer by re-sending the request.
    let (mut a, a_address) = logged_router(&db.url, &opts, &prefix, &log_a).await;
    let (_b, b_address) = logged_router(&db.url, &opts, &prefix, &log_b).await;
    let client = reqwest::Client::new();
    let key = new_key();
    let body = forwarded.call(&chain, "/v2/pid", "seconds=2");
    let call = spawn_route(&client, &a_address, &agent, &key, &body);
    wait_until("the upstream to settle", Duration::from_secs(20), async || chain.stats().await["/v2/pid"]["paid"] == 1)
        .await;
    a.kill().await.unwrap();
    assert!(call.await.unwrap().is_err(), "the killed router never answered");
    // While the payment may still need them (in flight, then recovery), nothing is in the clear.
    assert_none_in_postgres(&db, &forwarded).await;
    wait_until("the upstream to finish the original request", Duration::from_secs(20), async || {
        chain.stats().await["/v2/pid"]["pid_completed"] == 1
    })
    .await;

    let (status, envelope) = retry_until_final(&client, &b_address, &agent, &key, &body).await;

    assert_eq!(status, 200, "{envelope}");
    let env: Value = serde_json::from_str(&envelope).unwrap();
    assert_eq!(env["payment"]["recovery"], "recovered", "{env}");
    assert_eq!(env["body"]["handled_for_seconds"], 2, "the original answer: {env}");
    // The upstream recognised the re-send: the same URL, credentials, body and payment.
    let stats = chain.stats().await["/v2/pid"].clone();
    assert_eq!((stats["pid_replays"].as_u64(), stats["pid_conflicts"].as_u64()), (Some(1), Some(0)), "{stats}");
    assert_eq!(stats["paid"], 1, "paid once: {stats}");
    forwarded.assert_none_in("the /route envelope", &envelope);
    let replay = route_at(&client, &b_address, &agent, &key, &body).await;
    assert_eq!(replay.headers()["x-idempotent-replay"], "true");
    forwarded.assert_none_in("the replayed envelope", &replay.text().await.unwrap());
    // A second paid call with the same secrets, through MCP.
    let mut arguments = body.clone();
    arguments["url"] = json!(chain.url(&format!("/v2/pid{}", forwarded.query_string("seconds=0"))));
    let fetched = mcp_fetch(&client, &b_address, &agent, arguments).await;
    assert!(fetched.contains("settled"), "{fetched}");
    forwarded.assert_none_in("the MCP fetch answer", &fetched);
    // A paid POST whose body carries a secret.
    let post = json!({"url": chain.url(&format!("/v2/siwx-post{}", forwarded.query_string("x=1"))), "method": "POST",
                      "headers": forwarded.headers(), "body": {"api_key": forwarded.body}, "max_amount": "10000"});
    let posted = route_at(&client, &b_address, &agent, &new_key(), &post).await;
    assert_eq!(posted.status(), 200);
    forwarded.assert_none_in("the POST's envelope", &posted.text().await.unwrap());

    for (path, text) in every_answer(&client, &b_address, &agent, &key).await {
        forwarded.assert_none_in(&format!("GET {path}"), &text);
    }
    assert_none_in_postgres(&db, &forwarded).await;
    // Settled and served: nothing is kept any more, not even sealed.
    assert_eq!(count(&db, "SELECT count(*) AS n FROM payments WHERE sealed IS NOT NULL").await, 0);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await, 3);
    let redacted = "api_key=REDACTED&API%5FKEY=REDACTED&n=1&Token=REDACTED&sig=REDACTED&sig=REDACTED";
    let receipt_url = count(&db, &format!("SELECT count(*) AS n FROM receipts WHERE url LIKE '%{redacted}'")).await;
    assert_eq!(receipt_url, 3, "receipts show (and sign) the URL redacted");
    for log in [&log_a, &log_b] {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(text.contains(" DEBUG "), "the router logs below info: {text}");
        let theirs = text.lines().find(|l| (l.contains(" DEBUG ") || l.contains(" TRACE ")) && l.contains("rmcp::"));
        assert_eq!(theirs, None, "the MCP library's request logs are held at info");
        forwarded.assert_none_in(&format!("the log of {}", log.display()), &text);
    }
    std::fs::remove_dir_all(&logs).unwrap();
}

/// `x402-router reconcile` with recovery (the routers' key for receipts, `SECRETS_KEY_FILE`
/// `keys`): its JSON line of counts.
fn reconcile(db: &TestDb, chain: &Devnet, keys: &std::path::Path) -> Value {
    let out = router_command()
        .args(["reconcile", "--older-than-secs", "0", "--upstream-allow-private", "true"])
        .env("DATABASE_URL", &db.url)
        .env("X402_RPC_URLS", format!("eip155:84532={}", chain.rpc_url))
        .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
        .env("SECRETS_KEY_FILE", keys)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "reconcile failed: {stdout} {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&stdout).unwrap()
}

const K1: &str = "k1 1111111111111111111111111111111111111111111111111111111111111111\n";
const K2: &str = "k2 2222222222222222222222222222222222222222222222222222222222222222\n";

/// A paid call to `/v2/pid?seconds=3` on `app` (route deadline 1.5 s): the upstream settles,
/// the deadline cuts the call, the key's answer is `settled_response_lost`; the key.
async fn cut_by_the_deadline(app: &TestApp, chain: &Devnet, forwarded: &Forwarded) -> String {
    let key = new_key();
    let resp = app.route(&key, &forwarded.call(chain, "/v2/pid", "seconds=3")).await;
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["code"], "settled_response_lost", "{env}");
    key
}

#[actix_web::test]
async fn a_rotated_key_opens_what_the_old_one_sealed_and_reconcile_re_sends_the_exact_request() {
    let forwarded = Forwarded::new();
    let chain = Devnet::start().await;
    let dir = std::env::temp_dir().join(format!("x4r-keys-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let (old, rotated) = (dir.join("old"), dir.join("rotated"));
    std::fs::write(&old, K1).unwrap();
    std::fs::write(&rotated, format!("# k2 seals from now on; k1 opens until no row names it\n{K2}{K1}")).unwrap();
    let options = |keys: &std::path::Path| AppOptions {
        deadline_ms: 1500,
        extra: [
            chain.router_extra(),
            vec![
                ("secrets-key-file".into(), keys.to_string_lossy().into_owned()),
                ("operator-token".into(), OPERATOR.into()),
            ],
        ]
        .concat(),
        ..Default::default()
    };
    let before = spawn_app_with(options(&old)).await;
    let first = cut_by_the_deadline(&before, &chain, &forwarded).await;
    // The request as sent, sealed under k1: the real URL and credentials (what the upstream
    // got), and the payment header.
    let row = payment_row(&before.db, &first).await;
    assert_eq!(row.sealed_key_id.as_deref(), Some("k1"));
    let wallet: alloy::signers::local::PrivateKeySigner = ROUTER_KEY.parse().unwrap();
    let wallet = wallet.credential().to_bytes();
    let keyring = |text: &str| x402_router::secrets::Keyring::from_file_text(text, &wallet).unwrap();
    for keys in [K1.to_owned(), format!("{K2}{K1}")] {
        let opened = x402_router::secrets::intent::open(&keyring(&keys), &row);
        let sent = opened.request().unwrap();
        assert!(sent.url.contains(&format!("api_key={}", forwarded.query[0])), "the upstream gets the real URL");
        let headers = String::from_utf8(sent.headers.clone()).unwrap();
        assert!(headers.contains(&format!("Bearer {}", forwarded.bearer)) && headers.contains(&forwarded.x_api_key));
        assert!(!headers.contains(&forwarded.proxy), "Proxy-Authorization is never sent upstream");
    }
    let without_k1 = x402_router::secrets::intent::open(&keyring(K2), &row).request().unwrap_err().0;
    assert!(without_k1.contains("cannot be opened") && without_k1.contains("\"k1\""), "{without_k1}");
    // After the rotation new rows are sealed under k2; operators count rows per key.
    let after = spawn_app_on(before.db.clone(), options(&rotated)).await;
    let second = cut_by_the_deadline(&after, &chain, &forwarded).await;
    assert_eq!(payment_row(&after.db, &second).await.sealed_key_id.as_deref(), Some("k2"));
    let per_key = "SELECT count(*) AS n FROM (SELECT sealed_key_id, count(*) FROM payments \
                   WHERE sealed IS NOT NULL GROUP BY sealed_key_id) k";
    assert_eq!(count(&after.db, per_key).await, 2);
    assert_none_in_postgres(&after.db, &forwarded).await;
    wait_until("the upstream to finish both", Duration::from_secs(30), async || {
        chain.stats().await["/v2/pid"]["pid_completed"] == 2
    })
    .await;

    // reconcile opens both (k1 and k2) and re-sends each exactly: the upstream, whose cache
    // is bound to the caller's credentials, answers both.
    let report = reconcile(&after.db, &chain, &rotated);

    assert_eq!((report["recovered"].as_u64(), report["resends"].as_u64()), (Some(2), Some(2)), "{report}");
    let stats = chain.stats().await["/v2/pid"].clone();
    assert_eq!((stats["pid_replays"].as_u64(), stats["pid_conflicts"].as_u64()), (Some(2), Some(0)), "{stats}");
    assert_eq!(count(&after.db, "SELECT count(*) AS n FROM payments WHERE sealed IS NOT NULL").await, 0, "settled");
    assert_eq!(count(&after.db, "SELECT count(*) AS n FROM recovered_answers").await, 2);
    assert_none_in_postgres(&after.db, &forwarded).await;
    for (path, text) in every_answer(&after.client, &after.address, &after.agent, &second).await {
        forwarded.assert_none_in(&format!("GET {path}"), &text);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[actix_web::test]
async fn past_the_retention_bound_gc_drops_the_request_and_recovery_says_it_was_dropped() {
    let forwarded = Forwarded::new();
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { deadline_ms: 1500, extra: chain.router_extra(), ..Default::default() }).await;
    let key = cut_by_the_deadline(&app, &chain, &forwarded).await;
    assert!(payment_row(&app.db, &key).await.sealed.is_some(), "kept (sealed) while recovery may need it");
    let gc = |hours: &str| {
        let out = router_command()
            .args(["gc", "--secrets-retention-hours", hours])
            .env("DATABASE_URL", &app.db.url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    assert_eq!(gc("1")["secrets_dropped"], 0, "within the bound: kept");
    exec(&app.db, "UPDATE payments SET created_at = now() - interval '2 hours'").await;

    assert_eq!(gc("1")["secrets_dropped"], 1);

    assert!(payment_row(&app.db, &key).await.sealed.is_none());
    wait_until("the upstream to finish", Duration::from_secs(30), async || {
        chain.stats().await["/v2/pid"]["pid_completed"] == 1
    })
    .await;
    let keys = std::env::temp_dir().join(format!("x4r-keys-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&keys, K1).unwrap();
    let report = reconcile(&app.db, &chain, &keys);
    std::fs::remove_file(&keys).unwrap();
    assert_eq!((report["recovery_lost"].as_u64(), report["resends"].as_u64()), (Some(1), Some(0)), "{report}");
    let why = count(
        &app.db,
        "SELECT count(*) AS n FROM payments p, jsonb_array_elements(p.recovery->'attempts') a \
          WHERE a->>'action' = 'none' AND a->>'why' LIKE 'the request as sent was dropped%'",
    )
    .await;
    assert_eq!(why, 1, "recovery says plainly why nothing was re-sent");
    assert_eq!(chain.stats().await["/v2/pid"]["payment_attempts"], 1, "nothing re-sent");
}

#[actix_web::test]
async fn rows_an_earlier_version_kept_in_the_clear_are_sealed_at_start_and_still_resume() {
    use x402_router::secrets::sweep::{Sweep, Swept, run};
    let forwarded = Forwarded::new();
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    // A router of the earlier version signed, recorded the request as sent in the clear and
    // died (its authorization still valid); another of its calls settled long ago.
    let (live, settled) = (new_key(), new_key());
    let body = forwarded.call(&chain, "/v2/weather", "w=1");
    crash_after_signing(&app, &chain, &live, &body, 200).await;
    crash_after_signing(&app, &chain, &settled, &body, 200).await;
    for key in [&live, &settled] {
        let exact = opened_intent(&app.db, key).await.exact().unwrap().clone();
        let sent = exact.request.clone().unwrap();
        let hex = |b: &[u8]| alloy::hex::encode(b);
        exec(
            &app.db,
            &format!(
                "UPDATE payments SET sealed = NULL, sealed_key_id = NULL, request_url = '{}', header_value = '{}', \
                        request_headers = '\\x{}', requirement_json = '\\x{}', context_json = '\\x{}', \
                        context = convert_from('\\x{}', 'UTF8')::jsonb \
                  WHERE idempotency_key = '{key}'",
                sent.url,
                exact.header_value,
                hex(&sent.headers),
                hex(&exact.requirement_json),
                hex(&exact.context_json),
                hex(&exact.context_json),
            ),
        )
        .await;
    }
    exec(&app.db, &format!("UPDATE payments SET status = 'settled' WHERE idempotency_key = '{settled}'")).await;
    // And a receipt that shows, and signs, the URL as it was.
    let signer: alloy::signers::local::PrivateKeySigner = ROUTER_KEY.parse().unwrap();
    let receipt = x402_router::receipts::Draft {
        id: uuid::Uuid::new_v4(),
        agent_id: app.agent.id,
        idempotency_key: settled.clone(),
        request_hash: request_hash(&body),
        method: "GET".into(),
        url: body["url"].as_str().unwrap().to_owned(),
        upstream_status: Some(200),
        upstream_body_sha256: "00".repeat(32),
        payment: None,
        outcome: "completed".into(),
        trace_id: None,
    }
    .sign(&signer)
    .unwrap();
    x402_router::receipts::store::insert(&mut app.db.conn().await, &receipt).await.unwrap();
    let clear = "SELECT count(*) AS n FROM payments WHERE request_headers IS NOT NULL";
    assert_eq!(count(&app.db, clear).await, 2, "the secrets are in the clear before the sweep");

    let keyring = test_keyring();
    let redaction = x402_router::secrets::Redaction::default();
    let sweep = Sweep { keyring: &keyring, redaction: &redaction, retention_hours: 48, receipt_signer: &signer };
    let swept = run(&mut app.db.conn().await, &sweep).await.unwrap();

    assert_eq!((swept.sealed, swept.dropped, swept.redacted_receipts), (1, 1, 1), "{swept:?}");
    assert_none_in_postgres(&app.db, &forwarded).await;
    let opened = opened_intent(&app.db, &live).await;
    assert!(opened.request().unwrap().url.contains(&forwarded.query[0]), "sealed as it was sent");
    assert!(payment_row(&app.db, &settled).await.sealed.is_none(), "a settled payment's are dropped");
    let again = run(&mut app.db.conn().await, &sweep).await.unwrap();
    assert_eq!(again, Swept::default(), "a second sweep finds nothing to do");
    let stored = x402_router::receipts::store::find_for_agent(&mut app.db.conn().await, app.agent.id, receipt.id)
        .await
        .unwrap()
        .unwrap();
    assert!(
        stored.url.contains("api_key=REDACTED") && stored.url.contains("sig=REDACTED&sig=REDACTED"),
        "{}",
        stored.url
    );
    assert_eq!(stored.verify().unwrap(), signer.address(), "signed again as it now reads");
    assert_eq!((stored.id, stored.created_at), (receipt.id, receipt.created_at));

    // The sealed intent still resumes: the abandoned key is taken over and its still valid
    // payment re-sent (the exact payment header, opened from the seal).
    let resp = app.route(&live, &body).await;
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
}
