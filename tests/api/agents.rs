//! The agent's self-service surface (`GET /agents/me`, `GET /receipts`), the error-code
//! contract, and `/mcp` authentication. The MCP tools themselves are exercised with the
//! official TypeScript SDK by scripts/agent-clients-test.

use serde_json::{Value, json};
use x402_router::codes::Code;

use crate::helpers::*;

async fn get(app: &TestApp, agent: &Agent, path: &str) -> (u16, Value, reqwest::header::HeaderMap) {
    let resp = app.client.get(format!("{}{path}", app.address)).bearer_auth(&agent.key).send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, resp.json().await.unwrap(), headers)
}

#[actix_web::test]
async fn agents_me_and_payments_show_limits_spend_per_asset_and_a_keys_payment() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    exec(
        &app.db,
        &format!(
            "UPDATE agents SET max_per_call = 50000, daily_budget = 1000000, month_budget = 3000000, \
             allowed_hosts = ARRAY['127.0.0.1'], payments_per_minute = 100 WHERE id = '{}'",
            app.agent.id
        ),
    )
    .await;

    let (status, me, _) = get(&app, &app.agent, "/agents/me").await;
    assert_eq!(status, 200);
    assert_eq!(me["agent_id"], app.agent.id.to_string());
    assert_eq!(me["max_per_call"], "50000");
    assert_eq!(me["daily_budget"], "1000000");
    assert_eq!((me["spent"].as_str(), me["reserved"].as_str()), (Some("0"), Some("0")));
    assert_eq!(me["remaining"], "1000000");
    assert_eq!(me["assets"], json!([]));

    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled");

    let (_, me, _) = get(&app, &app.agent, "/agents/me").await;
    assert_eq!(me["spent"], PRICE.to_string());
    assert_eq!(me["reserved"], "0");
    assert_eq!(me["remaining"], (1_000_000 - PRICE).to_string());
    assert_eq!(me["assets"][0]["network"], "eip155:84532");
    assert_eq!(me["assets"][0]["asset"], env["payment"]["asset"]);
    assert_eq!(me["assets"][0]["spent"], PRICE.to_string());
    // The operator's other limits, as the agent is held to them.
    assert_eq!((me["month_budget"].as_str(), me["spent_month"].as_str()), (Some("3000000"), Some("10000")));
    assert_eq!(me["remaining_month"], (3_000_000 - PRICE).to_string());
    assert_eq!((me["allowed_hosts"].clone(), me["allowed_pay_to"].clone()), (json!(["127.0.0.1"]), Value::Null));
    assert_eq!((me["payments_per_minute"].as_i64(), me["calls_per_minute"].as_i64()), (Some(100), None));
    assert_eq!(me["approval_above"], Value::Null);
    exec(&app.db, &format!("UPDATE agents SET approval_above = 20000 WHERE id = '{}'", app.agent.id)).await;
    let (_, me, _) = get(&app, &app.agent, "/agents/me").await;
    assert_eq!(me["approval_above"], "20000", "the agent sees above which price a call waits for an operator");

    // The ledger's view of the key: final, paid, so a new key is not safe.
    let key = new_key();
    let resp = app.route(&key, &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await;
    assert_eq!(resp.status(), 200);
    let (status, p, _) = get(&app, &app.agent, &format!("/payments?idempotency_key={key}")).await;
    assert_eq!(status, 200, "{p}");
    assert_eq!((p["status"].as_str(), p["new_key_safe"].as_bool()), (Some("settled"), Some(false)));
    assert_eq!(p["amount"], PRICE.to_string());
    assert!(p.get("signed_authorization").is_none() && p.get("header_value").is_none());
    let (status, err, _) = get(&app, &app.agent, "/payments?idempotency_key=never-used-key-0001").await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));
    let other = create_agent(&app.db, "other").await;
    let (status, _, _) = get(&app, &other, &format!("/payments?idempotency_key={key}")).await;
    assert_eq!(status, 404, "another agent's key is not found");
    let (status, _, _) = get(&app, &app.agent, "/payments").await;
    assert_eq!(status, 400);

    // The receipt carries the payment's current ledger state beside the signed document.
    let id = env["receipt_id"].as_str().unwrap();
    let (status, receipt, headers) = get(&app, &app.agent, &format!("/receipts/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(receipt["payment"]["status"], "settled");
    assert_eq!(headers.get("x-payment-status").unwrap(), "settled");
}

#[actix_web::test]
async fn receipts_list_is_the_agents_own_newest_first_and_pages_without_repeats() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let other = create_agent(&app.db, "other").await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let resp = app.route(&new_key(), &json!({"url": up.url(&format!("/ok/{i}"))})).await;
        let env: Value = resp.json().await.unwrap();
        ids.push(env["receipt_id"].as_str().unwrap().to_owned());
    }
    app.route_as(&other, &new_key(), &json!({"url": up.url("/ok/other")})).await;

    let mut seen = Vec::new();
    let mut path = "/receipts?limit=2".to_owned();
    loop {
        let (status, page, _) = get(&app, &app.agent, &path).await;
        assert_eq!(status, 200, "{page}");
        for r in page["receipts"].as_array().unwrap() {
            assert_eq!(r["agent_id"], app.agent.id.to_string());
            seen.push(r["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/receipts?limit=2&cursor={c}"),
            None => break,
        }
    }
    ids.reverse();
    assert_eq!(seen, ids, "newest first, each once");

    let (_, theirs, _) = get(&app, &other, "/receipts").await;
    assert_eq!(theirs["receipts"].as_array().unwrap().len(), 1);
    for bad in ["/receipts?limit=0", "/receipts?cursor=nope", "/receipts?agent_id=x"] {
        let (status, err, _) = get(&app, &app.agent, bad).await;
        assert_eq!((status, err["code"].as_str()), (400, Some("bad_request")), "{bad}");
    }
    let resp = app.client.get(format!("{}/agents/me", app.address)).send().await.unwrap();
    assert_eq!(resp.status(), 401);
}

#[actix_web::test]
async fn the_openapi_document_has_one_schema_per_error_code() {
    let doc: Value = serde_json::from_str(x402_router::routes::openapi::json()).unwrap();
    let schemas = &doc["components"]["schemas"];
    let listed: Vec<&str> =
        schemas["ErrorCode"]["enum"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let codes: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(listed, codes);
    for code in codes {
        let s = &schemas[format!("Error_{code}")];
        assert_eq!(s["properties"]["code"]["const"], code, "Error_{code}");
        assert!(s["description"].as_str().is_some_and(|d| d.len() > 20), "Error_{code}");
    }
    assert_eq!(schemas["Error"]["required"], json!(["error", "code"]));
}

#[actix_web::test]
async fn mcp_needs_an_agent_key_and_speaks_json_rpc_with_one() {
    let app = spawn_app().await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let post = |key: Option<&str>| {
        let mut req = app
            .client
            .post(format!("{}/mcp", app.address))
            .header("accept", "application/json, text/event-stream")
            .json(&init);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        req.send()
    };
    let resp = post(None).await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "unauthorized");
    let resp = post(Some("x4r_not-a-key")).await.unwrap();
    assert_eq!(resp.status(), 401);

    let resp = post(Some(&app.agent.key)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("mcp-session-id").is_some());
    let text = resp.text().await.unwrap();
    let line = text.lines().find(|l| l.contains("\"serverInfo\"")).unwrap_or(&text);
    let answer: Value = serde_json::from_str(line.trim_start_matches("data:").trim()).unwrap();
    assert_eq!(answer["result"]["serverInfo"]["name"], "x402-router");
    assert!(answer["result"]["capabilities"]["tools"].is_object());
}

#[actix_web::test]
async fn errors_are_plain_json_by_default_and_problem_json_on_request() {
    let app = spawn_app().await;
    let url = format!("{}/receipts/{}", app.address, uuid::Uuid::new_v4());
    let plain = app.client.get(&url).bearer_auth(&app.agent.key).send().await.unwrap();
    assert_eq!(plain.status(), 404);
    assert!(plain.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    assert_eq!(plain.json::<Value>().await.unwrap(), json!({"error": "not found", "code": "not_found"}));

    let problem = app
        .client
        .get(&url)
        .bearer_auth(&app.agent.key)
        .header("accept", "application/problem+json, application/json;q=0.5")
        .send()
        .await
        .unwrap();
    assert_eq!(problem.status(), 404);
    assert_eq!(problem.headers()["content-type"], "application/problem+json");
    let doc: Value = problem.json().await.unwrap();
    assert_eq!(doc["type"], "urn:x402-router:error:not_found");
    assert_eq!((doc["title"].as_str(), doc["status"].as_u64()), (Some("not found"), Some(404)));
    assert_eq!(doc["code"], "not_found");
}

#[actix_web::test]
async fn an_unused_payment_becomes_new_key_safe_once_reconcile_expires_it() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let key = new_key();
    // A router signed and died; the authorization lapsed unused 5 minutes ago.
    crash_after_signing(&app, &chain, &key, &json!({"url": chain.url("/v2/weather"), "max_amount": "10000"}), -300)
        .await;
    exec(
        &app.db,
        "UPDATE payments SET created_at = now() - interval '5 minutes', updated_at = now() - interval '5 minutes'",
    )
    .await;
    let path = format!("/payments?idempotency_key={key}");
    let (_, p, _) = get(&app, &app.agent, &path).await;
    assert_eq!((p["status"].as_str(), p["new_key_safe"].as_bool()), (Some("signed"), Some(false)));
    let (_, me, _) = get(&app, &app.agent, "/agents/me").await;
    assert_eq!(me["reserved"], PRICE.to_string());

    let out = router_command()
        .arg("reconcile")
        .env("DATABASE_URL", &app.db.url)
        .env("X402_RPC_URLS", format!("eip155:84532={}", chain.rpc_url))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let (_, p, _) = get(&app, &app.agent, &path).await;
    assert_eq!((p["status"].as_str(), p["new_key_safe"].as_bool()), (Some("expired"), Some(true)));
    let (_, me, _) = get(&app, &app.agent, "/agents/me").await;
    assert_eq!(me["reserved"], "0");
}

/// An MCP session belongs to the agent that opened it: another agent naming its id (POST,
/// GET, DELETE) is told 404, as for an unknown session, and the session lives on for its
/// owner.
#[actix_web::test]
async fn an_mcp_session_is_its_agents_alone() {
    let app = spawn_app().await;
    let other = crate::helpers::create_agent(&app.db, "other").await;
    let send = |method: reqwest::Method, key: &str, session: Option<&str>, message: Option<Value>| {
        let mut req = app
            .client
            .request(method, format!("{}/mcp", app.address))
            .bearer_auth(key)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18");
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        if let Some(m) = message {
            req = req.json(&m);
        }
        req.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let resp = send(reqwest::Method::POST, &app.agent.key, None, Some(init)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let session = resp.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let resp = send(reqwest::Method::POST, &app.agent.key, Some(&session), Some(initialized)).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});

    for method in [reqwest::Method::POST, reqwest::Method::GET, reqwest::Method::DELETE] {
        let body = (method == reqwest::Method::POST).then(|| list.clone());
        let resp = send(method.clone(), &other.key, Some(&session), body).await.unwrap();
        assert_eq!(resp.status(), 404, "another agent's {method} with the session");
        assert_eq!(resp.json::<Value>().await.unwrap()["code"], "not_found");
    }

    // The owner's session is untouched: it still lists the tools, and its owner may end it.
    let resp = send(reqwest::Method::POST, &app.agent.key, Some(&session), Some(list)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("call_tool"));
    let resp = send(reqwest::Method::DELETE, &app.agent.key, Some(&session), None).await.unwrap();
    assert!(resp.status().is_success(), "the owner ends its session: {}", resp.status());
}
