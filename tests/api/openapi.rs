//! The OpenAPI document against the real service: every endpoint of the route table is
//! called on a real router (real Postgres, Redis, chain and upstreams), for its success and
//! for each error a test can provoke, and every answer must be declared for its status and
//! fit the declared schema (JSON Schema 2020-12, `$ref`s resolved into `components`). An
//! error body's `code` must also list the answer's status in its `x-http-status`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use x402_router_testkit::Deadline;

use serde_json::{Value, json};
use uuid::Uuid;
use x402_router::operators::Role;
use x402_router::routes::ROUTES;

use crate::helpers::*;

/// The generated document and what the test saw of it.
struct Spec {
    doc: Value,
    seen: Mutex<BTreeSet<(String, String, u16)>>,
}

impl Spec {
    fn new() -> Self {
        Self { doc: x402_router::routes::openapi::document(), seen: Mutex::new(BTreeSet::new()) }
    }

    /// Follows a local `$ref` (`#/components/...`) until an object without one.
    fn resolve<'a>(&'a self, mut v: &'a Value) -> &'a Value {
        while let Some(r) = v.get("$ref").and_then(Value::as_str) {
            let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("non-local $ref {r}"));
            v = self.doc.pointer(pointer).unwrap_or_else(|| panic!("dangling $ref {r}"));
        }
        v
    }

    /// Validates `instance` against `schema`, whose `$ref`s point into this document.
    fn validate(&self, schema: &Value, instance: &Value, what: &str) {
        let mut root = json!({ "$schema": "https://json-schema.org/draft/2020-12/schema",
                               "components": self.doc["components"].clone() });
        match schema {
            Value::Object(m) => {
                for (k, v) in m {
                    root[k] = v.clone();
                }
            }
            other => root["allOf"] = json!([other]),
        }
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("{what}: the schema does not compile: {e}"));
        let errors: Vec<String> =
            validator.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
        assert!(
            errors.is_empty(),
            "{what}: the body does not fit the document:\n{}\nbody: {instance}",
            errors.join("\n")
        );
    }

    /// Checks one real answer of `method template` against the document; its status and body.
    async fn check(&self, method: &str, template: &str, resp: reqwest::Response) -> (u16, Value) {
        let status = resp.status().as_u16();
        let what = format!("{method} {template} → {status}");
        let op = &self.doc["paths"][template][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{what}: no such operation in the document");
        let declared = op["responses"].get(status.to_string()).unwrap_or_else(|| {
            panic!(
                "{what}: status not declared (declared: {:?})",
                op["responses"].as_object().map(|m| m.keys().collect::<Vec<_>>())
            )
        });
        let declared = self.resolve(declared);
        // Declared headers, when present, fit their schema.
        if let Some(headers) = declared.get("headers").and_then(Value::as_object) {
            for (name, h) in headers {
                let h = self.resolve(h);
                if let Some(v) = resp.headers().get(name.as_str()) {
                    let v = v.to_str().unwrap().to_owned();
                    let as_json = if h["schema"]["type"] == "integer" {
                        v.parse::<i64>().map(Value::from).unwrap_or(Value::String(v))
                    } else {
                        Value::String(v)
                    };
                    self.validate(&h["schema"], &as_json, &format!("{what} header {name}"));
                }
            }
        }
        let media = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_owned())
            .unwrap_or_default();
        // An event stream stays open: its media type is checked, not its body.
        if media == "text/event-stream" {
            let content = &declared["content"];
            assert!(content.get(&media).is_some(), "{what}: content type {media:?} not declared");
            self.seen.lock().unwrap().insert((method.to_owned(), template.to_owned(), status));
            return (status, Value::Null);
        }
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        if let Some(content) = declared.get("content").and_then(Value::as_object) {
            let media_type = content.get(&media).unwrap_or_else(|| {
                panic!("{what}: content type {media:?} not declared ({:?}); body: {text}", content.keys())
            });
            if media == "application/json" {
                let body: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
                self.validate(&media_type["schema"], &body, &what);
            } else {
                self.validate(&media_type["schema"], &Value::String(text.clone()), &what);
            }
        }
        // An error body names a code whose table lists this status.
        if let Some(code) = body.get("code").and_then(Value::as_str).filter(|_| status >= 400) {
            let s = &self.doc["components"]["schemas"][format!("Error_{code}")];
            let statuses = s["x-http-status"].as_array().unwrap_or_else(|| panic!("{what}: unknown code {code}"));
            assert!(statuses.contains(&json!(status)), "{what}: code {code} is documented as {statuses:?}");
        }
        self.seen.lock().unwrap().insert((method.to_owned(), template.to_owned(), status));
        (status, body)
    }
}

struct Caller<'a> {
    app: &'a TestApp,
    spec: &'a Spec,
}

impl Caller<'_> {
    /// Calls `method path` (`template` is its pattern in ROUTES) and checks the answer.
    async fn call(
        &self,
        method: &str,
        template: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.app.client.request(m, format!("{}{path}", self.app.address));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.spec.check(method, template, req.send().await.unwrap()).await
    }

    /// POST /route with this key and body as `agent`.
    async fn route(&self, agent: &Agent, key: &str, body: &Value) -> (u16, Value) {
        let resp = self.app.route_as(agent, key, body).await;
        self.spec.check("POST", "/route", resp).await
    }
}

/// `/admin/operators`: an admin creates, lists and revokes; bad input, a viewer, an unknown
/// id and the last live admin (no `OPERATOR_TOKEN` here) are refused.
async fn operator_tokens(c: &Caller<'_>, admin: &str, admin_id: Uuid, viewer: &str, nobody: Uuid) {
    let ops = "/admin/operators";
    let (status, made) = c.call("POST", ops, ops, Some(admin), Some(json!({"name": "olga", "role": "viewer"}))).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(c.call("POST", ops, ops, Some(admin), Some(json!({"name": "x"}))).await.0, 400);
    assert_eq!(c.call("POST", ops, ops, Some(viewer), Some(json!({"name": "x", "role": "admin"}))).await.0, 403);
    assert_eq!(c.call("GET", ops, ops, Some(admin), None).await.0, 200);
    assert_eq!(c.call("GET", ops, ops, Some(viewer), None).await.0, 403);
    let one = "/admin/operators/{id}";
    let olga = format!("/admin/operators/{}", made["operator"]["id"].as_str().unwrap());
    assert_eq!(c.call("DELETE", one, &olga, Some(admin), None).await.0, 200);
    assert_eq!(c.call("DELETE", one, &format!("/admin/operators/{nobody}"), Some(admin), None).await.0, 404);
    assert_eq!(c.call("DELETE", one, &format!("/admin/operators/{admin_id}"), Some(admin), None).await.0, 409);
}

/// `/admin/changes` and the 202 answers of raising changes, on a router with the two-person
/// rule: a proposal, its list, a confirmation by its proposer (403), by another admin (200),
/// twice (409), a stale one (409), a rejection, unknown ids (404).
async fn two_person(spec: &Spec, app: &TestApp, ada: &str, nobody: Uuid) {
    let extra = vec![("require-second-admin".to_owned(), "true".to_owned())];
    let ruled = spawn_app_on(app.db.clone(), AppOptions { extra, ..Default::default() }).await;
    let c = Caller { app: &ruled, spec };
    let (_, bob) = create_operator(&app.db, "bob", Role::Admin).await;
    let agent = format!("/admin/agents/{}", ruled.agent.id);
    let one = "/admin/agents/{id}";
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 10 WHERE id = '{}'", ruled.agent.id)).await;
    let (status, p) = c.call("PATCH", one, &agent, Some(ada), Some(json!({"daily_budget": "20"}))).await;
    assert_eq!(status, 202, "{p}");
    let changes = "/admin/changes";
    assert_eq!(c.call("GET", changes, changes, Some(&ruled.viewer_token), None).await.0, 200);
    assert_eq!(c.call("GET", changes, "/admin/changes?state=maybe", Some(&ruled.viewer_token), None).await.0, 400);
    let (confirm, reject) = ("/admin/changes/{id}/confirm", "/admin/changes/{id}/reject");
    let id = p["id"].as_str().unwrap();
    assert_eq!(c.call("POST", confirm, &format!("/admin/changes/{id}/confirm"), Some(ada), None).await.0, 403);
    assert_eq!(c.call("POST", confirm, &format!("/admin/changes/{id}/confirm"), Some(&bob), None).await.0, 200);
    assert_eq!(c.call("POST", confirm, &format!("/admin/changes/{id}/confirm"), Some(&bob), None).await.0, 409);
    assert_eq!(c.call("POST", reject, &format!("/admin/changes/{id}/reject"), Some(&bob), None).await.0, 409);
    assert_eq!(c.call("POST", confirm, &format!("/admin/changes/{nobody}/confirm"), Some(&bob), None).await.0, 404);
    assert_eq!(c.call("POST", reject, &format!("/admin/changes/{nobody}/reject"), Some(&bob), None).await.0, 404);
    let (_, stale) = c.call("PATCH", one, &agent, Some(ada), Some(json!({"daily_budget": "30"}))).await;
    assert_eq!(c.call("PATCH", one, &agent, Some(&bob), Some(json!({"month_budget": "5"}))).await.0, 200);
    let stale = format!("/admin/changes/{}/confirm", stale["id"].as_str().unwrap());
    assert_eq!(c.call("POST", confirm, &stale, Some(&bob), None).await.1["code"], "change_stale");
    let enable = format!("{agent}/enable");
    exec(&app.db, &format!("UPDATE agents SET disabled = true WHERE id = '{}'", ruled.agent.id)).await;
    let (status, p) = c.call("POST", "/admin/agents/{id}/enable", &enable, Some(ada), None).await;
    assert_eq!(status, 202, "{p}");
    let id = p["id"].as_str().unwrap();
    assert_eq!(c.call("POST", reject, &format!("/admin/changes/{id}/reject"), Some(ada), None).await.0, 200);
    let ops = "/admin/operators";
    let (status, p) = c.call("POST", ops, ops, Some(ada), Some(json!({"name": "carol", "role": "admin"}))).await;
    assert_eq!(status, 202, "{p}");
    let id = p["id"].as_str().unwrap();
    let (status, confirmed) = c.call("POST", confirm, &format!("/admin/changes/{id}/confirm"), Some(&bob), None).await;
    assert!(status == 200 && confirmed["token"].is_string(), "{confirmed}");
    let settings = "/admin/settings";
    assert_eq!(c.call("PATCH", settings, settings, Some(ada), Some(json!({"wallet_daily_cap": "1"}))).await.0, 200);
    assert_eq!(c.call("PATCH", settings, settings, Some(ada), Some(json!({"wallet_daily_cap": null}))).await.0, 202);
    assert_eq!(c.call("POST", "/admin/pause", "/admin/pause", Some(ada), Some(json!({}))).await.0, 200);
    assert_eq!(c.call("DELETE", "/admin/pause", "/admin/pause", Some(ada), None).await.0, 202);
    // Back as the main test found it: not paused, no cap.
    exec(&app.db, "UPDATE router_settings SET paused = false, pause_unpaid = false, wallet_daily_cap = NULL").await;
}

/// A request for the endpoint `method template` of ROUTES with a well-formed body and query,
/// `{id}` standing for `id`.
fn request(app: &TestApp, m: &str, template: &str, token: Option<&str>, id: Uuid) -> reqwest::RequestBuilder {
    let mut path = template.replace("{id}", &id.to_string());
    match template {
        "/payments" => path.push_str("?idempotency_key=test-0123456789abcdef"),
        "/audit/idempotency" => path.push_str(&format!("?agent_id={id}&key=test-0123456789abcdef")),
        _ => {}
    }
    let mut req =
        app.client.request(reqwest::Method::from_bytes(m.as_bytes()).unwrap(), format!("{}{path}", app.address));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    match (m, template) {
        ("POST", "/route") => req.header("Idempotency-Key", new_key()).json(&json!({"url": "http://127.0.0.1:9/x"})),
        ("POST", "/mcp") => req.header("accept", "application/json, text/event-stream").json(&json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})),
        ("POST", "/admin/agents") | ("PATCH", "/admin/agents/{id}") => req.json(&json!({"name": "x"})),
        ("PATCH", "/admin/settings") => req.json(&json!({"wallet_daily_cap": null})),
        ("POST", _) => req.json(&json!({})),
        _ => req,
    }
}

/// Whether `template` is an agent endpoint (agent key), else an operator one.
fn agent_side(template: &str) -> bool {
    ["/route", "/receipts", "/agents/me", "/payments", "/mcp", "/discovery"]
        .iter()
        .any(|p| template == *p || template.starts_with(&format!("{p}/")))
}

const ANYONE: [&str; 4] = ["/healthz", "/readyz", "/.well-known/x402-router", "/openapi.json"];

#[actix_web::test]
async fn every_endpoint_answers_as_the_document_says() {
    let chain = Devnet::start().await;
    let up = TestUpstream::start().await;
    // Every credential is also tried wrong on every endpoint below: more failures from one
    // address than the operator-auth throttle allows by default.
    let mut extra = chain.router_extra();
    extra.push(("operator-auth-max-failures".into(), "1000".into()));
    let app = spawn_app_with(AppOptions { extra, ..Default::default() }).await;
    let spec = Spec::new();
    let c = Caller { app: &app, spec: &spec };
    let (admin_id, admin) = create_operator(&app.db, "ada", Role::Admin).await;
    let viewer = app.viewer_token.clone();
    let agent = app.agent.clone();
    let key = agent.key.clone();
    let nobody = Uuid::new_v4();

    // Anyone.
    for path in ["/healthz", "/readyz", "/.well-known/x402-router", "/openapi.json"] {
        assert_eq!(c.call("GET", path, path, None, None).await.0, 200, "{path}");
    }

    // POST /route: free and paid successes, then each refusal and outcome the test chain's
    // upstreams produce.
    let free = json!({"url": up.url("/ok")});
    assert_eq!(c.route(&agent, &new_key(), &free).await.0, 200);
    let paid_key = new_key();
    let paid = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    let (status, env) = c.route(&agent, &paid_key, &paid).await;
    assert_eq!(status, 200, "{env}");
    let receipt_id = env["receipt_id"].as_str().map(str::to_owned).unwrap_or_else(|| panic!("receipt_id: {env}"));
    assert_eq!(c.route(&agent, &paid_key, &paid).await.0, 200, "a replay");
    let (status, env) = c.route(&agent, &paid_key, &free).await;
    assert_eq!((status, env["code"].as_str()), (409, Some("idempotency_key_reused")));
    let in_flight = new_key();
    insert_in_flight(&app.db, agent.id, &in_flight, &free, 0).await;
    let (status, env) = c.route(&agent, &in_flight, &free).await;
    assert_eq!((status, env["code"].as_str()), (409, Some("idempotency_key_in_flight")));
    let (status, env) = c.route(&agent, &new_key(), &json!({"url": 7})).await;
    assert_eq!((status, env["code"].as_str()), (400, Some("bad_request")));
    let resp = app.route_raw(None, serde_json::to_vec(&free).unwrap()).await;
    let (status, env) = spec.check("POST", "/route", resp).await;
    assert_eq!((status, env["code"].as_str()), (400, Some("idempotency_key_required")));
    let resp = app.route_raw(Some(&new_key()), vec![b' '; 300_000]).await;
    let (status, env) = spec.check("POST", "/route", resp).await;
    assert_eq!((status, env["code"].as_str()), (413, Some("payload_too_large")));
    let stranger = Agent { id: Uuid::new_v4(), key: "x4r_not-a-key".into() };
    assert_eq!(c.route(&stranger, &new_key(), &free).await.0, 401);
    for (url, max, expected) in [
        (chain.url("/v2/weather"), "1", (402, "payment_over_max_amount")),
        (chain.url("/v2/reject"), "10000", (502, "payment_rejected")),
        (chain.url("/v2/settle-then-drop"), "10000", (502, "settled_response_lost")),
        (chain.url("/v2/error500"), "10000", (502, "upstream_failed")),
    ] {
        let (status, env) = c.route(&agent, &new_key(), &json!({"url": url, "max_amount": max})).await;
        assert_eq!((status, env["code"].as_str()), (expected.0, Some(expected.1)), "{url}: {env}");
    }

    // The agent's own reads.
    let receipt = format!("/receipts/{receipt_id}");
    assert_eq!(c.call("GET", "/receipts/{id}", &receipt, Some(&key), None).await.0, 200);
    assert_eq!(c.call("GET", "/receipts/{id}", &format!("/receipts/{nobody}"), Some(&key), None).await.0, 404);
    assert_eq!(c.call("GET", "/receipts/{id}", &receipt, None, None).await.0, 401);
    assert_eq!(c.call("GET", "/receipts", "/receipts?limit=2", Some(&key), None).await.0, 200);
    assert_eq!(c.call("GET", "/receipts", "/receipts?cursor=nope", Some(&key), None).await.0, 400);
    assert_eq!(c.call("GET", "/receipts", "/receipts", None, None).await.0, 401);
    assert_eq!(c.call("GET", "/agents/me", "/agents/me", Some(&key), None).await.0, 200);
    assert_eq!(c.call("GET", "/agents/me", "/agents/me", None, None).await.0, 401);
    let payment = format!("/payments?idempotency_key={paid_key}");
    assert_eq!(c.call("GET", "/payments", &payment, Some(&key), None).await.0, 200);
    assert_eq!(
        c.call("GET", "/payments", &format!("/payments?idempotency_key={}", new_key()), Some(&key), None).await.0,
        404
    );
    assert_eq!(c.call("GET", "/payments", "/payments", Some(&key), None).await.0, 400);
    assert_eq!(c.call("GET", "/payments", &payment, None, None).await.0, 401);
    // Discovery: a 402 that declares bazaar, seen, then listed with its schema and judged options.
    let probe = json!({"url": chain.url("/v2/weather?bazaar=1"), "max_amount": "1"});
    assert_eq!(c.route(&agent, &new_key(), &probe).await.0, 402);
    let (status, page) =
        c.call("GET", "/discovery", "/discovery?q=weather&max_price=50000&limit=5", Some(&key), None).await;
    assert_eq!((status, page["resources"].as_array().map(Vec::len)), (200, Some(1)), "{page}");
    assert_eq!(c.call("GET", "/discovery", "/discovery?limit=0", Some(&key), None).await.0, 400);
    assert_eq!(c.call("GET", "/discovery", "/discovery", None, None).await.0, 401);

    // MCP.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let session: Mutex<Option<String>> = Mutex::new(None);
    let mcp = |token: Option<&str>, method: reqwest::Method, body: Option<&Value>| {
        let mut req = app
            .client
            .request(method, format!("{}/mcp", app.address))
            .header("accept", "application/json, text/event-stream");
        if let Some(t) = token {
            req = req.bearer_auth(t.to_owned());
        }
        if let Some(id) = session.lock().unwrap().clone() {
            req = req.header("mcp-session-id", id).header("mcp-protocol-version", "2025-11-25");
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        req.send()
    };
    let resp = mcp(Some(&key), reqwest::Method::POST, Some(&init)).await.unwrap();
    let id = resp.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(spec.check("POST", "/mcp", resp).await.0, 200);
    *session.lock().unwrap() = id;
    assert_eq!(spec.check("POST", "/mcp", mcp(None, reqwest::Method::POST, Some(&init)).await.unwrap()).await.0, 401);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let resp = mcp(Some(&key), reqwest::Method::POST, Some(&initialized)).await.unwrap();
    assert_eq!(spec.check("POST", "/mcp", resp).await.0, 202, "a notification is accepted");
    let (status, _) = spec.check("GET", "/mcp", mcp(Some(&key), reqwest::Method::GET, None).await.unwrap()).await;
    assert_eq!(status, 200, "the session's event stream");
    assert_eq!(spec.check("GET", "/mcp", mcp(None, reqwest::Method::GET, None).await.unwrap()).await.0, 401);
    assert_eq!(spec.check("DELETE", "/mcp", mcp(None, reqwest::Method::DELETE, None).await.unwrap()).await.0, 401);
    let (status, _) = spec.check("DELETE", "/mcp", mcp(Some(&key), reqwest::Method::DELETE, None).await.unwrap()).await;
    assert!((200..300).contains(&status), "the session ends: {status}");
    *session.lock().unwrap() = None;

    // The audit API: a viewer reads; no token, an agent key and bad queries are refused.
    let agent_id = agent.id;
    let audits: [(&str, String); 10] = [
        ("/audit/receipts", "/audit/receipts?limit=5".into()),
        ("/audit/receipts/{id}", format!("/audit/receipts/{receipt_id}")),
        ("/audit/idempotency", format!("/audit/idempotency?agent_id={agent_id}&key={paid_key}")),
        ("/audit/payments", "/audit/payments?limit=5".into()),
        ("/audit/payments.csv", "/audit/payments.csv".into()),
        ("/audit/operator-events", "/audit/operator-events".into()),
        ("/audit/agents/{id}/spend", format!("/audit/agents/{agent_id}/spend")),
        ("/audit/upto", "/audit/upto".into()),
        ("/audit/overview", "/audit/overview".into()),
        ("/audit/whoami", "/audit/whoami".into()),
    ];
    for (template, path) in &audits {
        assert_eq!(c.call("GET", template, path, Some(&viewer), None).await.0, 200, "{path}");
        assert_eq!(c.call("GET", template, path, None, None).await.0, 401, "{path}");
        assert_eq!(c.call("GET", template, path, Some(&key), None).await.0, 403, "{path}");
    }
    for (template, path) in [
        ("/audit/receipts", "/audit/receipts?cursor=nope".to_owned()),
        ("/audit/idempotency", "/audit/idempotency?key=x".into()),
        ("/audit/payments", "/audit/payments?limit=nope".into()),
        ("/audit/payments.csv", "/audit/payments.csv?limit=nope".into()),
        ("/audit/operator-events", "/audit/operator-events?from=nope".into()),
    ] {
        assert_eq!(c.call("GET", template, &path, Some(&viewer), None).await.0, 400, "{path}");
    }
    for (template, path) in [
        ("/audit/receipts/{id}", format!("/audit/receipts/{nobody}")),
        ("/audit/idempotency", format!("/audit/idempotency?agent_id={agent_id}&key={}", new_key())),
        ("/audit/agents/{id}/spend", format!("/audit/agents/{nobody}/spend")),
    ] {
        assert_eq!(c.call("GET", template, &path, Some(&viewer), None).await.0, 404, "{path}");
    }
    assert_eq!(c.call("GET", "/metrics", "/metrics", Some(&viewer), None).await.0, 200);
    assert_eq!(c.call("GET", "/metrics", "/metrics", None, None).await.0, 401);
    assert_eq!(c.call("GET", "/metrics", "/metrics", Some(&key), None).await.0, 403);

    // The control plane: an admin changes, a viewer is refused, bad input and unknown ids too.
    let (status, created) =
        c.call("POST", "/admin/agents", "/admin/agents", Some(&admin), Some(json!({"name": "bob"}))).await;
    assert_eq!(status, 201, "{created}");
    let bob_id = created["agent"]["agent_id"].as_str().unwrap().to_owned();
    let bob_key = created["api_key"].as_str().map(str::to_owned);
    assert_eq!(c.call("POST", "/admin/agents", "/admin/agents", Some(&admin), Some(json!({"nme": "x"}))).await.0, 400);
    assert_eq!(
        c.call("POST", "/admin/agents", "/admin/agents", Some(&viewer), Some(json!({"name": "x"}))).await.0,
        403
    );
    assert_eq!(c.call("POST", "/admin/agents", "/admin/agents", None, Some(json!({"name": "x"}))).await.0, 401);
    assert_eq!(c.call("GET", "/admin/agents", "/admin/agents", Some(&viewer), None).await.0, 200);
    assert_eq!(c.call("GET", "/admin/agents", "/admin/agents", None, None).await.0, 401);
    operator_tokens(&c, &admin, admin_id, &viewer, nobody).await;
    let bob = format!("/admin/agents/{bob_id}");
    let ghost = format!("/admin/agents/{nobody}");
    assert_eq!(c.call("GET", "/admin/agents/{id}", &bob, Some(&viewer), None).await.0, 200);
    assert_eq!(c.call("GET", "/admin/agents/{id}", &ghost, Some(&viewer), None).await.0, 404);
    let limits = json!({"calls_per_minute": 1});
    assert_eq!(c.call("PATCH", "/admin/agents/{id}", &bob, Some(&admin), Some(limits.clone())).await.0, 200);
    assert_eq!(
        c.call("PATCH", "/admin/agents/{id}", &bob, Some(&admin), Some(json!({"max_per_call": "x"}))).await.0,
        400
    );
    assert_eq!(c.call("PATCH", "/admin/agents/{id}", &ghost, Some(&admin), Some(limits.clone())).await.0, 404);
    assert_eq!(c.call("PATCH", "/admin/agents/{id}", &bob, Some(&viewer), Some(limits)).await.0, 403);
    if let Some(bob_key) = &bob_key {
        // One call a minute: the second is 429 rate_limited.
        let bob_agent = Agent { id: bob_id.parse().unwrap(), key: bob_key.clone() };
        assert_eq!(c.route(&bob_agent, &new_key(), &free).await.0, 200);
        let (status, env) = c.route(&bob_agent, &new_key(), &free).await;
        assert_eq!((status, env["code"].as_str()), (429, Some("rate_limited")), "{env}");
    }
    // An agent with allowlists: another host, another payee.
    let (status, dave) =
        c.call("POST", "/admin/agents", "/admin/agents", Some(&admin), Some(json!({"name": "dave"}))).await;
    assert_eq!(status, 201);
    let dave_agent = Agent {
        id: dave["agent"]["agent_id"].as_str().unwrap().parse().unwrap(),
        key: dave["api_key"].as_str().unwrap().to_owned(),
    };
    let dave_path = format!("/admin/agents/{}", dave_agent.id);
    let lists = json!({"allowed_hosts": ["127.0.0.1"], "allowed_pay_to": [format!("0x{}", "ab".repeat(20))]});
    assert_eq!(c.call("PATCH", "/admin/agents/{id}", &dave_path, Some(&admin), Some(lists)).await.0, 200);
    let elsewhere = json!({"url": "http://localhost:9/x"});
    let (status, env) = c.route(&dave_agent, &new_key(), &elsewhere).await;
    assert_eq!((status, env["code"].as_str()), (403, Some("upstream_not_allowed")), "{env}");
    let (status, env) = c.route(&dave_agent, &new_key(), &paid).await;
    assert_eq!((status, env["code"].as_str()), (402, Some("payment_not_allowed")), "{env}");
    // An upstream whose 402 cannot be read.
    let q: String = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("amount", "1e30")
        .append_pair("asset", &chain.token.to_string())
        .finish();
    let unreadable = json!({"url": up.url(&format!("/v1-402-price?{q}")), "max_amount": "10000"});
    let (status, env) = c.route(&agent, &new_key(), &unreadable).await;
    assert_eq!((status, env["code"].as_str()), (502, Some("upstream_invalid_402")), "{env}");

    for action in ["disable", "enable", "rotate-key"] {
        let template = format!("/admin/agents/{{id}}/{action}");
        assert_eq!(c.call("POST", &template, &format!("{bob}/{action}"), Some(&admin), None).await.0, 200);
        assert_eq!(c.call("POST", &template, &format!("{ghost}/{action}"), Some(&admin), None).await.0, 404);
        assert_eq!(c.call("POST", &template, &format!("{bob}/{action}"), Some(&viewer), None).await.0, 403);
    }
    // A disabled agent is refused on its own endpoints.
    let (status, disabled) =
        c.call("POST", "/admin/agents", "/admin/agents", Some(&admin), Some(json!({"name": "carol"}))).await;
    assert_eq!(status, 201);
    let carol_id = disabled["agent"]["agent_id"].as_str().unwrap().to_owned();
    if let Some(carol_key) = disabled["api_key"].as_str() {
        let carol = format!("/admin/agents/{carol_id}/disable");
        assert_eq!(c.call("POST", "/admin/agents/{id}/disable", &carol, Some(&admin), None).await.0, 200);
        let carol_agent = Agent { id: carol_id.parse().unwrap(), key: carol_key.to_owned() };
        // The auth cache may hold the key as enabled for a moment: poll with a deadline.
        let mut deadline = Deadline::after(std::time::Duration::from_secs(30), "the disabled agent is still served")
            .every(std::time::Duration::from_millis(100));
        loop {
            let resp =
                app.client.get(format!("{}/agents/me", app.address)).bearer_auth(carol_key).send().await.unwrap();
            if resp.status() == 403 {
                spec.check("GET", "/agents/me", resp).await;
                break;
            }
            deadline.next_poll().await.unwrap();
        }
        let (status, env) = c.route(&carol_agent, &new_key(), &free).await;
        assert_eq!((status, env["code"].as_str()), (403, Some("agent_disabled")));
        assert_eq!(c.call("GET", "/receipts", "/receipts", Some(carol_key), None).await.0, 403);
        assert_eq!(c.call("GET", "/receipts/{id}", &receipt, Some(carol_key), None).await.0, 403);
        assert_eq!(c.call("GET", "/payments", &payment, Some(carol_key), None).await.0, 403);
        let resp = mcp(Some(carol_key), reqwest::Method::POST, Some(&init)).await.unwrap();
        assert_eq!(spec.check("POST", "/mcp", resp).await.0, 403);
    }
    assert_eq!(c.call("GET", "/admin/settings", "/admin/settings", Some(&viewer), None).await.0, 200);
    let cap = json!({"wallet_daily_cap": "1000000"});
    assert_eq!(c.call("PATCH", "/admin/settings", "/admin/settings", Some(&admin), Some(cap.clone())).await.0, 200);
    assert_eq!(
        c.call("PATCH", "/admin/settings", "/admin/settings", Some(&admin), Some(json!({"cap": 1}))).await.0,
        400
    );
    assert_eq!(c.call("PATCH", "/admin/settings", "/admin/settings", Some(&viewer), Some(cap)).await.0, 403);
    let budget = json!({"wallet_daily_cap": "1"});
    assert_eq!(c.call("PATCH", "/admin/settings", "/admin/settings", Some(&admin), Some(budget)).await.0, 200);
    let (status, env) = c.route(&agent, &new_key(), &paid).await;
    assert_eq!((status, env["code"].as_str()), (402, Some("payment_over_budget")), "{env}");
    let uncapped = json!({"wallet_daily_cap": null});
    assert_eq!(c.call("PATCH", "/admin/settings", "/admin/settings", Some(&admin), Some(uncapped)).await.0, 200);
    assert_eq!(c.call("POST", "/admin/reconcile", "/admin/reconcile", Some(&admin), Some(json!({}))).await.0, 200);
    let one = json!({"payment_id": nobody});
    assert_eq!(c.call("POST", "/admin/reconcile", "/admin/reconcile", Some(&admin), Some(one)).await.0, 404);
    let bad = json!({"payment_id": "x"});
    assert_eq!(c.call("POST", "/admin/reconcile", "/admin/reconcile", Some(&admin), Some(bad)).await.0, 400);
    assert_eq!(c.call("POST", "/admin/reconcile", "/admin/reconcile", Some(&viewer), Some(json!({}))).await.0, 403);
    assert_eq!(c.call("POST", "/admin/pause", "/admin/pause", Some(&admin), Some(json!({"unpaid": 1}))).await.0, 400);
    assert_eq!(c.call("POST", "/admin/pause", "/admin/pause", Some(&viewer), Some(json!({}))).await.0, 403);
    assert_eq!(c.call("POST", "/admin/pause", "/admin/pause", Some(&admin), Some(json!({}))).await.0, 200);
    let (status, env) = c.route(&agent, &new_key(), &paid).await;
    assert_eq!((status, env["code"].as_str()), (503, Some("payments_paused")), "{env}");
    assert_eq!(c.call("DELETE", "/admin/pause", "/admin/pause", Some(&viewer), None).await.0, 403);
    assert_eq!(c.call("DELETE", "/admin/pause", "/admin/pause", Some(&admin), None).await.0, 200);

    // Approvals: payments held (202), the queue, a decision each way, a late one (409), the
    // denied call's retry (403).
    exec(&app.db, &format!("UPDATE agents SET approval_above = 0 WHERE id = '{}'", agent.id)).await;
    let (approved_key, denied_key) = (new_key(), new_key());
    let mut held = vec![];
    for key in [&approved_key, &denied_key] {
        let (status, env) = c.route(&agent, key, &paid).await;
        assert_eq!((status, env["code"].as_str()), (202, Some("approval_pending")), "{env}");
        held.push(format!("/admin/approvals/{}", env["approval"]["id"].as_str().unwrap()));
    }
    let list = "/admin/approvals";
    assert_eq!(c.call("GET", list, "/admin/approvals?state=pending", Some(&viewer), None).await.0, 200);
    assert_eq!(c.call("GET", list, "/admin/approvals?state=maybe", Some(&viewer), None).await.0, 400);
    let (approve, deny) = ("/admin/approvals/{id}/approve", "/admin/approvals/{id}/deny");
    assert_eq!(c.call("POST", approve, &format!("{}/approve", held[0]), Some(&admin), None).await.0, 200);
    assert_eq!(c.call("POST", deny, &format!("{}/deny", held[1]), Some(&admin), None).await.0, 200);
    assert_eq!(c.call("POST", approve, &format!("{}/approve", held[1]), Some(&admin), None).await.0, 409);
    assert_eq!(c.call("POST", deny, &format!("{}/deny", held[0]), Some(&admin), None).await.0, 409);
    assert_eq!(c.call("POST", approve, &format!("/admin/approvals/{nobody}/approve"), Some(&admin), None).await.0, 404);
    assert_eq!(c.call("POST", deny, &format!("/admin/approvals/{nobody}/deny"), Some(&admin), None).await.0, 404);
    let (status, env) = c.route(&agent, &denied_key, &paid).await;
    assert_eq!((status, env["code"].as_str()), (403, Some("approval_denied")), "{env}");
    exec(&app.db, &format!("UPDATE agents SET approval_above = NULL WHERE id = '{}'", agent.id)).await;

    // Batch-settlement channels: the list, and a closed one closed again (nothing to do on-chain).
    assert_eq!(c.call("GET", "/admin/channels", "/admin/channels", Some(&viewer), None).await.0, 200);
    let lane = Uuid::new_v4();
    exec(
        &app.db,
        &format!(
            "INSERT INTO batch_lanes (id, wallet, pay_to, network, asset, receiver_authorizer, withdraw_delay, salt, \
                                      channel_id, state) \
             VALUES ('{lane}', '0x01', '0x02', 'eip155:84532', '0x03', '0x04', 900, '0x05', '0x{lane}', 'closed')"
        ),
    )
    .await;
    let close = "/admin/channels/{id}/close";
    assert_eq!(c.call("POST", close, &format!("/admin/channels/{lane}/close"), Some(&admin), None).await.0, 200);
    assert_eq!(c.call("POST", close, &format!("/admin/channels/{nobody}/close"), Some(&admin), None).await.0, 404);
    // The two-person rule, on a second router of the same database with REQUIRE_SECOND_ADMIN.
    two_person(&spec, &app, &admin, nobody).await;

    // Credentials, endpoint by endpoint: none (401), an agent key on the operator API (403),
    // a viewer's token on what changes (403).
    for (method, template, _) in ROUTES {
        let m = method.as_str();
        if ANYONE.contains(template) {
            continue;
        }
        let (status, body) =
            spec.check(m, template, request(&app, m, template, None, nobody).send().await.unwrap()).await;
        assert_eq!(status, 401, "{m} {template}: {body}");
        if !agent_side(template) {
            let resp = request(&app, m, template, Some(&key), nobody).send().await.unwrap();
            let (status, body) = spec.check(m, template, resp).await;
            assert_eq!((status, body["code"].as_str()), (403, Some("operator_only")), "{m} {template}: {body}");
        }
        if template.starts_with("/admin/") && m != "GET" {
            let resp = request(&app, m, template, Some(&viewer), nobody).send().await.unwrap();
            assert_eq!(spec.check(m, template, resp).await.0, 403, "{m} {template}");
        }
    }

    // Every endpoint was called, each answered at least one success, and what the document
    // declares but no call produced is listed (not every failure can be provoked here).
    let seen = spec.seen.lock().unwrap().clone();
    let mut unseen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (method, path, _) in ROUTES {
        let m = method.as_str();
        assert!(
            seen.iter().any(|(sm, sp, s)| sm == m && sp == path && (200..300).contains(s)),
            "{m} {path}: no successful call checked"
        );
        let op = &spec.doc["paths"][*path][m.to_ascii_lowercase()]["responses"];
        for status in op.as_object().unwrap().keys() {
            let s: u16 = status.parse().unwrap();
            if !seen.contains(&(m.to_owned(), (*path).to_owned(), s)) {
                unseen.entry(format!("{m} {path}")).or_default().push(status.clone());
            }
        }
    }
    eprintln!("declared, not provoked by this test: {unseen:#?}");
}

/// With Postgres unreachable, every endpoint that needs it answers a declared 503 that fits
/// the document (and the others still answer as declared).
#[actix_web::test]
async fn with_postgres_down_every_endpoint_answers_a_declared_503() {
    let db = TestDb::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432".into()).await.unwrap();
    let proxied_url = {
        let tail = db.url.rsplit_once('/').unwrap().1;
        format!("postgres://postgres@127.0.0.1:{}/{tail}", proxy.port)
    };
    let app = spawn_app_on(
        std::sync::Arc::new(db),
        AppOptions { database_url: Some(proxied_url), acquire_timeout_ms: 300, ..Default::default() },
    )
    .await;
    let (_, admin) = create_operator(&app.db, "ada", Role::Admin).await;
    let spec = Spec::new();
    proxy.cut();

    let id = Uuid::new_v4();
    for (method, template, _) in ROUTES {
        let m = method.as_str();
        let token = if agent_side(template) { &app.agent.key } else { &admin };
        let req = request(&app, m, template, Some(token), id);
        let (status, body) = spec.check(m, template, req.send().await.unwrap()).await;
        if ANYONE.contains(template) && *template != "/readyz" {
            assert_eq!(status, 200, "{m} {template}: {body}");
        } else {
            assert_eq!(status, 503, "{m} {template}: {body}");
        }
    }
}

/// The `/route` answers the main test cannot reach with one router: an asset the router does
/// not pay with (402 `payment_unsupported`), a chain it cannot read before signing (502
/// `payment_not_made`), an upstream slower than its timeout (504 `upstream_timeout`). Each must
/// be declared and fit the document.
#[actix_web::test]
async fn the_rarer_route_answers_fit_the_document_too() {
    let chain = Devnet::start().await;
    let spec = Spec::new();
    let paid = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    let other_asset = spawn_app_with(AppOptions {
        extra: vec![
            ("x402-rpc-urls".into(), format!("eip155:84532={}", chain.rpc_url)),
            ("x402-assets".into(), "eip155:84532=0x036CbD53842c5426634e7929541eC2318f3dCF7e".into()),
        ],
        ..Default::default()
    })
    .await;
    let (status, env) = spec.check("POST", "/route", other_asset.route(&new_key(), &paid).await).await;
    assert_eq!((status, env["code"].as_str()), (402, Some("payment_unsupported")), "{env}");
    let rpc_down = spawn_app_with(AppOptions {
        extra: vec![
            ("x402-rpc-urls".into(), format!("eip155:84532=http://127.0.0.1:{}", free_port())),
            ("x402-assets".into(), format!("eip155:84532={}@6", chain.token)),
            ("x402-rpc-timeout-ms".into(), "1000".into()),
        ],
        ..Default::default()
    })
    .await;
    let (status, env) = spec.check("POST", "/route", rpc_down.route(&new_key(), &paid).await).await;
    assert_eq!((status, env["code"].as_str()), (502, Some("payment_not_made")), "{env}");
    // A paid request cut off by the route deadline while the upstream holds the authorization.
    let cut = spawn_app_with(AppOptions { deadline_ms: 1500, extra: chain.router_extra(), ..Default::default() }).await;
    let stalled = json!({"url": chain.url("/v2/stall?seconds=3"), "max_amount": "10000"});
    let (status, env) = spec.check("POST", "/route", cut.route(&new_key(), &stalled).await).await;
    assert_eq!(
        (status, env["code"].as_str(), env["payment"]["status"].as_str()),
        (504, Some("payment_unknown"), Some("unknown"))
    );
    let slow = spawn_app_with(AppOptions { upstream_timeout_ms: 300, ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let (status, env) =
        spec.check("POST", "/route", slow.route(&new_key(), &json!({"url": up.url("/slow/t?ms=2000")})).await).await;
    assert_eq!((status, env["code"].as_str()), (504, Some("upstream_timeout")), "{env}");
}

/// Two more `/route` answers, each needing its own chain state: the same request re-sent
/// under its key after GC removed it, its payment settled (409 `already_paid`), and an
/// upstream whose facilitator wants a Permit2 approval the wallet lacks (502
/// `permit2_allowance_required`).
#[actix_web::test]
async fn already_paid_and_permit2_allowance_required_fit_the_document() {
    let chain = Devnet::start().await;
    let spec = Spec::new();
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let key = new_key();
    let paid = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    assert_eq!(spec.check("POST", "/route", app.route(&key, &paid).await).await.0, 200);
    // What GC leaves of the key: no idempotency row, no Redis entry.
    exec(&app.db, &format!("DELETE FROM idempotency_keys WHERE key = '{key}'")).await;
    let redis = redis::Client::open(redis_url()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{}idem:{{{}}}:{key}", app.redis_prefix, app.agent.id))
        .query_async(&mut conn)
        .await
        .unwrap();
    let (status, env) = spec.check("POST", "/route", app.route(&key, &paid).await).await;
    assert_eq!((status, env["code"].as_str()), (409, Some("already_paid")), "{env}");

    let revoked = router_command()
        .args(["wallet", "approve-permit2", "--network", "eip155:84532", "--asset", &chain.token.to_string()])
        .args(["--amount", "0"])
        .env("ROUTER_PRIVATE_KEY", ROUTER_KEY)
        .env("X402_RPC_URLS", format!("eip155:{}={}", chain.chain_id, chain.rpc_url))
        .env("X402_ASSETS", format!("eip155:{}={}@6", chain.chain_id, chain.token))
        .output()
        .unwrap();
    assert!(revoked.status.success(), "{}", String::from_utf8_lossy(&revoked.stderr));
    let gated = json!({"url": chain.url("/v2/permit2-gate"), "max_amount": "50000"});
    let (status, env) = spec.check("POST", "/route", app.route(&new_key(), &gated).await).await;
    assert_eq!((status, env["code"].as_str()), (502, Some("permit2_allowance_required")), "{env}");
}

/// `superseded` (409): an owner paused just before its paid request leaves loses its lease to
/// a takeover; its own answer must fit the document (the same fault point as the stall test).
#[actix_web::test]
async fn superseded_fits_the_document() {
    use crate::stalls::{pause_at, steal_lease};
    use x402_router::faults::Point;
    use x402_router::startup::Hooks;

    let chain = Devnet::start().await;
    let (hook, pause) = pause_at(Point::BeforePaidSend);
    let hooks = Hooks { at: Some(hook), ..Default::default() };
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), hooks, ..Default::default() }).await;
    let spec = Spec::new();
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    let call = spawn_route(&app.client, &app.address, &app.agent, &key, &body);
    tokio::time::timeout(std::time::Duration::from_secs(20), pause.reached.notified())
        .await
        .expect("the owner reaches the send");
    steal_lease(&app, &key).await;
    pause.release.notify_one();
    let (status, body) = spec.check("POST", "/route", call.await.unwrap().unwrap()).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("superseded")), "{body}");
}

/// `payment_network_unavailable` (503): a takeover finds a recorded authorization with too
/// little validity left to resend that may still settle, so nothing is signed (as in
/// `pending::a_takeover_never_re_signs_while_the_earlier_authorization_may_still_settle`).
#[actix_web::test]
async fn payment_network_unavailable_fits_the_document() {
    let chain = Devnet::start().await;
    let app =
        spawn_app_with(AppOptions { extra: chain.router_extra(), deadline_ms: 50_000, ..Default::default() }).await;
    let spec = Spec::new();
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    crash_after_signing(&app, &chain, &key, &body, 8).await;
    let (status, body) = spec.check("POST", "/route", app.route(&key, &body).await).await;
    assert_eq!((status, body["code"].as_str()), (503, Some("payment_network_unavailable")), "{body}");
}

/// `internal_error` (502): an answer the database refuses to store
/// ([`crate::stalls::refuse_poisoned_answers`]).
#[actix_web::test]
async fn internal_error_fits_the_document() {
    let up = TestUpstream::start().await;
    let app = spawn_app_with(AppOptions { abandon_ms: 1000, heartbeat_ms: 300, ..Default::default() }).await;
    crate::stalls::refuse_poisoned_answers(&app).await;
    let spec = Spec::new();
    let (status, body) =
        spec.check("POST", "/route", app.route(&new_key(), &json!({"url": up.url("/ok/poison")})).await).await;
    assert_eq!((status, body["code"].as_str()), (502, Some("internal_error")), "{body}");
}

/// Paying on Solana: the paid answer, a refusal after paying, the receipt and
/// `/.well-known/x402-router` (base58 addresses, a Solana transaction id) fit the document.
#[actix_web::test]
async fn solana_answers_fit_the_document() {
    let rig = SolanaRig::start(&[]).await;
    let app = spawn_app_with(AppOptions { extra: rig.router_extra(), ..Default::default() }).await;
    let spec = Spec::new();
    let body = json!({"url": rig.url("/svm/v2/paid"), "max_amount": SVM_PRICE.to_string()});
    let (status, paid) = spec.check("POST", "/route", app.route(&new_key(), &body).await).await;
    assert_eq!((status, &paid["payment"]["status"]), (200, &json!("settled")), "{paid}");
    let lied = json!({"url": rig.url("/svm/v1/lie-failed"), "max_amount": SVM_PRICE.to_string()});
    let (status, lost) = spec.check("POST", "/route", app.route(&new_key(), &lied).await).await;
    assert_eq!((status, lost["code"].as_str()), (502, Some("settled_response_lost")), "{lost}");
    let receipt = app
        .client
        .get(format!("{}/receipts/{}", app.address, paid["receipt_id"].as_str().unwrap()))
        .bearer_auth(&app.agent.key)
        .send()
        .await
        .unwrap();
    spec.check("GET", "/receipts/{id}", receipt).await;
    let described = reqwest::get(format!("{}/.well-known/x402-router", app.address)).await.unwrap();
    let (_, described) = spec.check("GET", "/.well-known/x402-router", described).await;
    assert_eq!(described["solana_payer"], rig.chain.field("payer"), "{described}");
    let network =
        &described["networks"].as_array().unwrap().iter().find(|n| n["network"] == rig.chain.field("network"));
    let network = network.unwrap_or_else(|| panic!("{described}"));
    assert_eq!(network["v1_name"], "solana-devnet");
    assert_eq!(
        network["assets"],
        json!([{"asset": rig.chain.field("mint"), "decimals": 6, "symbol": null, "asset_transfer_methods": ["spl"],
                "schemes": ["exact"], "x402_versions": [1, 2]}])
    );
}
