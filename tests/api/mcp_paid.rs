//! Paid MCP tools (issue 43, item 3): `POST /route` with `{"mcp": {url, tool, arguments}}` and
//! the router's own MCP tool `call_tool` call a tool of an MCP server that charges with x402
//! over MCP. The server is the official MCP SDK with the official x402 resource server and
//! facilitator (tests/mcp-upstream), settling on a real anvil; money is checked on-chain.

use alloy::primitives::U256;
use serde_json::{Value, json};

use crate::helpers::*;

async fn paid_app(chain: &Devnet) -> TestApp {
    spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await
}

async fn balances(chain: &Devnet) -> (U256, U256) {
    (chain.balance(ROUTER_ADDRESS).await, chain.balance(PAY_TO).await)
}

fn price() -> U256 {
    U256::from(PRICE)
}

fn tool_call(url: &str, tool: &str, arguments: Value, max_amount: Option<&str>) -> Value {
    let mut body = json!({ "mcp": { "url": url, "tool": tool, "arguments": arguments } });
    if let Some(max) = max_amount {
        body["max_amount"] = json!(max);
    }
    body
}

#[actix_web::test]
async fn a_paid_tool_pays_once_replays_without_paying_and_refuses_other_arguments_under_its_key() {
    let chain = Devnet::start().await;
    let mcp = McpUpstream::start(&chain).await;
    let app = paid_app(&chain).await;
    let (router0, pay_to0) = balances(&chain).await;
    let key = new_key();
    let body = tool_call(&mcp.endpoint(), "paid_echo", json!({ "text": "hello" }), Some("50000"));

    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["status"], 200, "{env}");
    assert_eq!(env["body"]["structuredContent"]["echo"], "hello", "{env}");
    let p = &env["payment"];
    assert_eq!(p["status"], "settled", "{env}");
    assert_eq!(p["amount"], PRICE.to_string());
    assert_eq!(p["pay_to"], PAY_TO.to_checksum(None));
    assert_eq!(p["payer"], ROUTER_ADDRESS.to_checksum(None));
    assert!(p["tx_hash"].as_str().unwrap().starts_with("0x"));
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));
    let stats = mcp.stats().await;
    assert_eq!((stats["executions"]["paid_echo"].as_u64(), stats["settlements"].as_u64()), (Some(1), Some(1)));

    // The same key: the recorded answer, nothing executed or paid again.
    let replay = app.route(&key, &body).await;
    assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(replay.json::<Value>().await.unwrap(), env);
    // The same key with other arguments (or another tool): the fingerprint differs.
    for other in [
        tool_call(&mcp.endpoint(), "paid_echo", json!({ "text": "other" }), Some("50000")),
        tool_call(&mcp.endpoint(), "free_echo", json!({ "text": "hello" }), Some("50000")),
    ] {
        let resp = app.route(&key, &other).await;
        assert_eq!(resp.status(), 409);
        assert_eq!(resp.json::<Value>().await.unwrap()["code"], "idempotency_key_reused");
    }
    // Arguments in another order are the same canonical call: a replay.
    let reordered = json!({ "max_amount": "50000", "mcp": { "arguments": { "text": "hello" }, "tool": "paid_echo", "url": mcp.endpoint() } });
    assert_eq!(app.route(&key, &reordered).await.headers().get("x-idempotent-replay").unwrap(), "true");
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));
    assert_eq!(mcp.stats().await["executions"]["paid_echo"], 1);

    // The receipt names the tool call.
    let receipt: Value = app
        .client
        .get(format!("{}/receipts/{}", app.address, env["receipt_id"].as_str().unwrap()))
        .bearer_auth(&app.agent.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(receipt["method"], "MCP", "{receipt}");
    assert_eq!(receipt["payment"]["status"], "settled");
    let settled = count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await;
    assert_eq!(settled, 1);
}

#[actix_web::test]
async fn a_free_tool_answers_unpaid_and_a_paid_one_without_max_amount_is_declined() {
    let chain = Devnet::start().await;
    let mcp = McpUpstream::start(&chain).await;
    let app = paid_app(&chain).await;
    let before = balances(&chain).await;

    let resp = app.route(&new_key(), &tool_call(&mcp.endpoint(), "free_echo", json!({ "text": "hi" }), None)).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"], Value::Null);
    assert_eq!(env["body"]["content"][0]["text"], "free echo: hi", "{env}");

    let resp = app.route(&new_key(), &tool_call(&mcp.endpoint(), "paid_echo", json!({ "text": "hi" }), None)).await;
    assert_eq!(resp.status(), 402);
    let declined: Value = resp.json().await.unwrap();
    assert_eq!(declined["code"], "payment_over_max_amount", "{declined}");
    assert_eq!(declined["accepts"][0]["amount"], PRICE.to_string());

    // An unknown tool is the server's JSON-RPC error, recorded as its answer; nothing paid.
    let resp = app.route(&new_key(), &tool_call(&mcp.endpoint(), "no_such_tool", json!({}), Some("50000"))).await;
    let env: Value = resp.json().await.unwrap();
    assert!(env["status"] == 400 || env["body"]["isError"] == true, "{env}");
    assert_eq!(balances(&chain).await, before);
    assert_eq!(mcp.stats().await["executions"].get("paid_echo"), None);
}

#[actix_web::test]
async fn hostile_mcp_servers_lose_no_money_and_no_record() {
    let chain = Devnet::start().await;
    let mcp = McpUpstream::start(&chain).await;
    let app = paid_app(&chain).await;
    let (router0, pay_to0) = balances(&chain).await;

    // Each takes the payment for real, then answers too much, garbage or to another request:
    // the chain shows the payment landed, so the call is recorded as paid and not served,
    // exactly once, and its key replays that.
    for (i, mode) in ["huge", "garbage", "wrong-id"].into_iter().enumerate() {
        let key = new_key();
        let body = tool_call(&mcp.hostile(mode), "paid_echo", json!({ "text": mode }), Some("50000"));
        let resp = app.route(&key, &body).await;
        assert_eq!(resp.status(), 502, "{mode}");
        let env: Value = resp.json().await.unwrap();
        assert_eq!(env["code"], "settled_response_lost", "{mode}: {env}");
        assert_eq!(env["payment"]["status"], "settled_response_lost", "{mode}: {env}");
        let moved = U256::from(i as u64 + 1) * price();
        assert_eq!(balances(&chain).await, (router0 - moved, pay_to0 + moved), "{mode}");
        let replay = app.route(&key, &body).await;
        assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true");
        assert_eq!(replay.json::<Value>().await.unwrap(), env);
    }
    assert_eq!(mcp.stats().await["settlements"], 3);

    // A server that claims a settlement it never made: the chain says nothing moved, and the
    // payment is not recorded as settled.
    let before = balances(&chain).await;
    let resp = app
        .route(&new_key(), &tool_call(&mcp.hostile("lie"), "paid_echo", json!({ "text": "x" }), Some("50000")))
        .await;
    let env: Value = resp.json().await.unwrap();
    assert_ne!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(balances(&chain).await, before);
    let settled = count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await;
    assert_eq!(settled, 0);
}

#[actix_web::test]
async fn the_mcp_form_is_validated_and_its_url_guarded_before_anything_is_written() {
    let app = spawn_app_with(AppOptions { allow_private: false, ..Default::default() }).await;
    let refused = |body: Value| {
        let app = &app;
        async move {
            let resp = app.route(&new_key(), &body).await;
            assert_eq!(resp.status(), 400, "{body}");
            resp.json::<Value>().await.unwrap()["error"].as_str().unwrap_or_default().to_owned()
        }
    };
    let url = "https://mcp.example.com/mcp";
    assert!(refused(json!({ "mcp": { "url": url, "tool": "t" }, "url": url })).await.contains("either"));
    assert!(refused(json!({ "mcp": { "url": url, "tool": "t" }, "method": "POST" })).await.contains("not allowed"));
    assert!(refused(json!({ "mcp": { "url": url, "tool": "t", "arguments": [1] } })).await.contains("arguments"));
    assert!(refused(json!({ "mcp": { "url": url, "tool": "" } })).await.contains("tool"));
    assert!(refused(json!({ "mcp": { "url": url, "tool": "a b" } })).await.contains("tool"));
    assert!(refused(json!({ "mcp": { "url": url, "tool": "t", "x": 1 } })).await.contains("unknown field"));
    assert!(refused(json!({ "mcp": { "url": "ftp://x/", "tool": "t" } })).await.contains("mcp.url"));
    assert!(refused(json!({ "mcp": { "tool": "t" } })).await.contains("mcp.url"));
    // The SSRF rules of HTTP upstreams.
    for private in ["http://127.0.0.1:9/mcp", "http://169.254.169.254/mcp", "http://[::1]:9/mcp"] {
        refused(json!({ "mcp": { "url": private, "tool": "t" } })).await;
    }
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM idempotency_keys").await, 0);
}

/// One JSON-RPC request to the router's `/mcp` (session `session`): the response object.
async fn router_mcp(app: &TestApp, session: Option<&str>, message: Value) -> (Option<String>, Value) {
    let mut req = app
        .client
        .post(format!("{}/mcp", app.address))
        .bearer_auth(&app.agent.key)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .json(&message);
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    let resp = req.send().await.unwrap();
    let session = resp.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
    let text = resp.text().await.unwrap();
    let answer = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").is_some())
        .unwrap_or(Value::Null);
    (session, answer)
}

#[actix_web::test]
async fn the_router_mcp_tool_call_tool_pays_a_paid_tool_once() {
    let chain = Devnet::start().await;
    let mcp = McpUpstream::start(&chain).await;
    let app = paid_app(&chain).await;
    let (router0, pay_to0) = balances(&chain).await;

    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let (session, _) = router_mcp(&app, None, init).await;
    let session = session.expect("a session");
    router_mcp(&app, Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let (_, listed) =
        router_mcp(&app, Some(&session), json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    let names: Vec<&str> =
        listed["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"call_tool"), "{listed}");

    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "call_tool", "arguments": {
        "url": mcp.endpoint(), "tool": "paid_echo", "arguments": {"text": "via mcp"}, "max_amount": "50000"}}});
    let (_, answer) = router_mcp(&app, Some(&session), call.clone()).await;
    let result = &answer["result"]["structuredContent"];
    assert_eq!(result["http_status"], 200, "{answer}");
    assert_eq!(result["payment"]["status"], "settled", "{answer}");
    assert_eq!(result["response"]["body"]["structuredContent"]["echo"], "via mcp", "{answer}");
    let key = result["idempotency_key"].as_str().unwrap().to_owned();
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));

    // The same JSON-RPC request again (a client's re-send): the same key, a replay.
    let (_, again) = router_mcp(&app, Some(&session), call).await;
    assert_eq!(again["result"]["structuredContent"]["idempotency_key"], key.as_str());
    assert_eq!(again["result"]["structuredContent"]["replayed"], true, "{again}");
    assert_eq!(balances(&chain).await, (router0 - price(), pay_to0 + price()));
    assert_eq!(mcp.stats().await["executions"]["paid_echo"], 1);
}
