//! The operator's control plane (`/admin/*`) as an operator and as an attacker use it:
//! roles, validation that changes nothing, the audit trail written with each change, key
//! rotation and disabling within the auth cache's window, the pause, reconcile on demand, and
//! the CLI on the same code path.

use std::time::{Duration, Instant};
use x402_router_testkit::Deadline;

use serde_json::{Value, json};
use x402_router::operators::Role;

use crate::helpers::*;

struct Ops {
    admin: String,
    viewer: String,
}

async fn ops(app: &TestApp) -> Ops {
    let (_, admin) = create_operator(&app.db, "ada", Role::Admin).await;
    let (_, viewer) = create_operator(&app.db, "vic", Role::Viewer).await;
    Ops { admin, viewer }
}

async fn call(app: &TestApp, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = app.client.request(method, format!("{}{path}", app.address)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn events(app: &TestApp) -> Vec<Value> {
    let (status, body) = call(app, "GET", "/audit/operator-events?limit=500", &app.viewer_token, None).await;
    assert_eq!(status, 200, "{body}");
    body["events"].as_array().unwrap().clone()
}

/// Polls `f` until it holds, for at most `limit`; the time it took.
async fn within<F: AsyncFn() -> bool>(limit: Duration, f: F) -> Duration {
    let started = Instant::now();
    let mut deadline = Deadline::after(limit, "the condition").every(Duration::from_millis(50));
    while !f().await {
        if deadline.next_poll().await.is_err() {
            panic!("not within {limit:?}");
        }
    }
    started.elapsed()
}

#[actix_web::test]
async fn an_admin_creates_limits_disables_enables_and_rotates_an_agent_and_each_change_is_audited() {
    let app = spawn_app().await;
    let ops = ops(&app).await;
    let up = TestUpstream::start().await;
    let (status, created) = call(
        &app,
        "POST",
        "/admin/agents",
        &ops.admin,
        Some(json!({"name": "research-bot", "month_budget": "5000000", "allowed_hosts": ["127.0.0.1"]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["agent"]["agent_id"].as_str().unwrap().to_owned();
    let key = created["api_key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("x4r_"));
    assert_eq!(created["agent"]["month_budget"], "5000000");
    assert_eq!(created["agent"]["allowed_hosts"], json!(["127.0.0.1"]));
    let agent = Agent { id: id.parse().unwrap(), key: key.clone() };
    let body = json!({"url": up.url("/ok/admin")});
    let route = |agent: Agent| {
        let (client, address, body) = (app.client.clone(), app.address.clone(), body.clone());
        async move { route_at(&client, &address, &agent, &new_key(), &body).await.status().as_u16() }
    };
    assert_eq!(route(agent.clone()).await, 200);

    // As `curl -d` sends it (a form content type): the body is read as JSON all the same.
    let resp = app
        .client
        .post(format!("{}/admin/agents", app.address))
        .bearer_auth(&ops.admin)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(r#"{"name":"curl-bot","daily_budget":"200000"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);

    // Listed with its spend; shown alone; the key never.
    let (status, list) = call(&app, "GET", "/admin/agents", &ops.viewer, None).await;
    assert_eq!(status, 200);
    let listed = list["agents"].as_array().unwrap().iter().find(|a| a["agent_id"] == id.as_str()).unwrap();
    assert_eq!(listed["settled_24h"], "0");
    assert!(!list.to_string().contains(&key));
    let (status, shown) = call(&app, "GET", &format!("/admin/agents/{id}"), &ops.viewer, None).await;
    assert_eq!((status, shown["name"].as_str()), (200, Some("research-bot")));

    // Limits change; null removes one.
    let (status, updated) = call(
        &app,
        "PATCH",
        &format!("/admin/agents/{id}"),
        &ops.admin,
        Some(json!({"daily_budget": "100000", "allowed_hosts": null, "payments_per_minute": 10})),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!((updated["daily_budget"].as_str(), updated["allowed_hosts"].is_null()), (Some("100000"), true));
    assert_eq!(updated["payments_per_minute"], 10);

    // Disabled: refused by the router within the auth cache's window; enabled again: served.
    let (status, _) = call(&app, "POST", &format!("/admin/agents/{id}/disable"), &ops.admin, None).await;
    assert_eq!(status, 200);
    within(Duration::from_secs(3), async || route(agent.clone()).await == 403).await;
    let (status, _) = call(&app, "POST", &format!("/admin/agents/{id}/enable"), &ops.admin, None).await;
    assert_eq!(status, 200);
    within(Duration::from_secs(3), async || route(agent.clone()).await == 200).await;

    // Rotated: the new key works at once, the old one is refused within the window (1 s).
    let (status, rotated) = call(&app, "POST", &format!("/admin/agents/{id}/rotate-key"), &ops.admin, None).await;
    assert_eq!(status, 200);
    let new_agent = Agent { id: agent.id, key: rotated["api_key"].as_str().unwrap().to_owned() };
    assert_ne!(new_agent.key, key);
    assert_eq!(route(new_agent.clone()).await, 200);
    let took = within(Duration::from_secs(3), async || route(agent.clone()).await == 401).await;
    assert!(took <= Duration::from_millis(1500), "old key still accepted after {took:?}");

    // The trail: who, what, before and after, from where, in order; never a key.
    let trail: Vec<Value> = events(&app).await.into_iter().filter(|e| e["target"] == id.as_str()).collect();
    let actions: Vec<&str> = trail.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["agent.create", "agent.update", "agent.disable", "agent.enable", "agent.rotate_key"]);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM agents WHERE name = 'curl-bot'").await, 1);
    assert!(trail.iter().all(|e| e["operator_name"] == "ada" && e["remote_addr"] == "127.0.0.1"), "{trail:?}");
    assert_eq!(trail[1]["before"]["daily_budget"], Value::Null);
    assert_eq!(trail[1]["after"]["daily_budget"], "100000");
    assert_eq!(
        (trail[2]["before"]["disabled"].as_bool(), trail[2]["after"]["disabled"].as_bool()),
        (Some(false), Some(true))
    );
    let text = serde_json::to_string(&trail).unwrap();
    assert!(!text.contains(&key) && !text.contains(&new_agent.key), "a key leaked into the trail");
}

#[actix_web::test]
async fn bad_input_and_wrong_roles_change_nothing() {
    let app = spawn_app().await;
    let ops = ops(&app).await;
    let id = app.agent.id;
    let before = call(&app, "GET", &format!("/admin/agents/{id}"), &ops.viewer, None).await.1;
    let events_before = events(&app).await.len();
    for body in [
        json!({"month_budget": 5}),
        json!({"month_budget": "-1"}),
        json!({"month_budget": "1e6"}),
        json!({"daily_budget": "99999999999999999999999999999999999999999999999999999999999999999999999999999999"}),
        json!({"allowed_hosts": ["exa mple.com"]}),
        json!({"allowed_hosts": ["*"]}),
        json!({"allowed_pay_to": ["0x12"]}),
        json!({"calls_per_minute": 0}),
        json!({"calls_per_minute": -5}),
        json!({"calls_per_minute": "10"}),
        json!({"name": ""}),
        json!({"name": "x\u{0}y"}),
        json!({"dailyBudget": "10"}),
        json!({}),
        json!([1]),
    ] {
        let (status, err) = call(&app, "PATCH", &format!("/admin/agents/{id}"), &ops.admin, Some(body.clone())).await;
        assert_eq!((status, err["code"].as_str()), (400, Some("bad_request")), "{body}: {err}");
        assert!(err["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    let resp = app
        .client
        .patch(format!("{}/admin/agents/{id}", app.address))
        .bearer_auth(&ops.admin)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let huge = format!("{{\"name\": \"{}\"}}", "x".repeat(1 << 20));
    let resp = app
        .client
        .patch(format!("{}/admin/agents/{id}", app.address))
        .bearer_auth(&ops.admin)
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payload_too_large");
    // Wrong credentials: viewer, agent key, none, revoked-looking.
    let change = Some(json!({"month_budget": "1"}));
    let path = format!("/admin/agents/{id}");
    let (s, e) = call(&app, "PATCH", &path, &ops.viewer, change.clone()).await;
    assert_eq!((s, e["code"].as_str()), (403, Some("operator_only")));
    let (s, e) = call(&app, "PATCH", &path, &app.agent.key, change.clone()).await;
    assert_eq!((s, e["code"].as_str()), (403, Some("operator_only")));
    let (s, e) = call(&app, "PATCH", &path, &format!("x4o_{}", "B".repeat(43)), change.clone()).await;
    assert_eq!((s, e["code"].as_str()), (401, Some("unauthorized")));
    let (s, _) = call(&app, "POST", "/admin/pause", &ops.viewer, None).await;
    assert_eq!(s, 403);
    let (s, _) = call(&app, "POST", "/admin/agents", &ops.viewer, Some(json!({"name": "x"}))).await;
    assert_eq!(s, 403);
    // Unknown agents: 404.
    for path in ["/admin/agents/not-a-uuid", &format!("/admin/agents/{}", uuid::Uuid::new_v4())] {
        let (s, e) = call(&app, "PATCH", path, &ops.admin, change.clone()).await;
        assert_eq!((s, e["code"].as_str()), (404, Some("not_found")), "{path}");
    }
    let after = call(&app, "GET", &format!("/admin/agents/{id}"), &ops.viewer, None).await.1;
    assert_eq!(before, after);
    assert_eq!(events(&app).await.len(), events_before, "a refused change left an event");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM agents").await, 1);
}

#[actix_web::test]
async fn the_pause_and_the_wallet_cap_are_set_over_http_and_refuse_payments() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let ops = ops(&app).await;
    let paid = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    let (s, settings) = call(&app, "POST", "/admin/pause", &ops.admin, Some(json!({"unpaid": false}))).await;
    assert_eq!((s, settings["paused"].as_bool()), (200, Some(true)), "{settings}");
    let resp = app.route(&new_key(), &paid).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers().get("retry-after").unwrap(), "30");
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payments_paused");
    assert_eq!(app.route(&new_key(), &json!({"url": chain.url("/free")})).await.status(), 200);
    let (s, _) = call(&app, "DELETE", "/admin/pause", &ops.admin, None).await;
    assert_eq!(s, 200);
    assert_eq!(app.route(&new_key(), &paid).await.status(), 200);

    let (s, settings) =
        call(&app, "PATCH", "/admin/settings", &ops.admin, Some(json!({"wallet_daily_cap": PRICE.to_string()}))).await;
    assert_eq!(s, 200, "{settings}");
    assert_eq!(settings["wallet_used_24h"], PRICE.to_string());
    let resp = app.route(&new_key(), &paid).await;
    assert_eq!(resp.status(), 402);
    let body: Value = resp.json().await.unwrap();
    assert!(body["code"] == "payment_over_budget" && body["error"].as_str().unwrap().contains("wallet"), "{body}");
    for bad in [json!({"wallet_daily_cap": 5}), json!({"paused": true}), json!({})] {
        let (s, _) = call(&app, "PATCH", "/admin/settings", &ops.admin, Some(bad.clone())).await;
        assert_eq!(s, 400, "{bad}");
    }
    let (s, _) = call(&app, "POST", "/admin/pause", &ops.admin, Some(json!({"unpaid": "yes"}))).await;
    assert_eq!(s, 400);
    let actions: Vec<String> = events(&app).await.iter().map(|e| e["action"].as_str().unwrap().to_owned()).collect();
    assert_eq!(actions, ["payments.pause", "payments.resume", "settings.update"]);
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 1);
}

#[actix_web::test]
async fn reconcile_on_demand_decides_one_payment_from_the_chain() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let ops = ops(&app).await;
    // A lying upstream claims settlement that never happened: `unconfirmed` until the chain says.
    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/lie"), "max_amount": "10000"})).await;
    assert_eq!(resp.json::<Value>().await.unwrap()["payment"]["status"], "unconfirmed");
    let id = {
        use diesel_async::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            id: String,
        }
        let r: Row = diesel::sql_query("SELECT id::text AS id FROM payments")
            .get_result(&mut app.db.conn().await)
            .await
            .unwrap();
        r.id
    };
    let (s, report) = call(&app, "POST", "/admin/reconcile", &ops.admin, Some(json!({"payment_id": id}))).await;
    assert_eq!(s, 200, "{report}");
    assert_eq!(report["checked"], 1, "{report}");
    let (s, _) =
        call(&app, "POST", "/admin/reconcile", &ops.admin, Some(json!({"payment_id": uuid::Uuid::new_v4()}))).await;
    assert_eq!(s, 404);
    let (s, _) = call(&app, "POST", "/admin/reconcile", &ops.admin, Some(json!({"payment_id": "nope"}))).await;
    assert_eq!(s, 400);
    let (s, report) = call(&app, "POST", "/admin/reconcile", &ops.admin, None).await;
    assert_eq!(s, 200, "{report}");
    let actions: Vec<String> = events(&app).await.iter().map(|e| e["action"].as_str().unwrap().to_owned()).collect();
    assert_eq!(actions, ["payments.reconcile", "payments.reconcile"]);
}

#[actix_web::test]
async fn the_cli_takes_the_same_path_as_the_api() {
    let app = spawn_app().await;
    let agents = |args: &[&str]| {
        let out = router_command().arg("agents").args(args).env("DATABASE_URL", &app.db.url).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = agents(&[
        "create",
        "--name",
        "cli-bot",
        "--month-budget",
        "700",
        "--allowed-hosts",
        "a.example.com,*.b.example.com",
    ]);
    assert!(ok, "{out}");
    let created: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let id = created["agent_id"].as_str().unwrap().to_owned();
    assert_eq!(created["agent"]["allowed_hosts"], json!(["a.example.com", "*.b.example.com"]));
    // The API's validation, word for word.
    let (ok, out) = agents(&["update", &id, "--calls-per-minute", "0"]);
    assert!(!ok && out.contains("calls_per_minute must be an integer from 1 to"), "{out}");
    let (ok, out) = agents(&["update", &id, "--month-budget", "none", "--payments-per-minute", "5"]);
    assert!(ok, "{out}");
    let (ok, out) = agents(&["rotate-key", &id]);
    assert!(ok && out.contains("x4r_"), "{out}");
    let (ok, out) = agents(&["disable", &id]);
    assert!(ok, "{out}");
    let (ok, out) = agents(&["list"]);
    assert!(ok && out.contains("\"payments_per_minute\":5") && out.contains("\"month_budget\":null"), "{out}");
    let trail: Vec<Value> = events(&app).await;
    let actions: Vec<&str> = trail.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["agent.create", "agent.update", "agent.rotate_key", "agent.disable"]);
    assert!(trail.iter().all(|e| e["operator_name"] == "cli" && e["operator_id"].is_null()));
}

/// `GET /admin/agents` reads every agent's limits and spend in one statement (issue 42: the
/// console's table of 500 agents; one query per agent took about half a second): with 500
/// agents, budgets of every kind and payments that count and that do not, each listed agent
/// is exactly the agent shown alone (the per-agent read that the budget checks use), and the
/// list is oldest first.
#[actix_web::test]
async fn the_agent_list_of_500_agents_agrees_with_each_agent_shown_alone() {
    let app = spawn_app().await;
    exec(
        &app.db,
        "INSERT INTO agents (id, name, api_key_hash, disabled, max_per_call, daily_budget, month_budget, \
                             allowed_hosts, calls_per_minute, created_at) \
         SELECT gen_random_uuid(), 'bulk-' || lpad(i::text, 3, '0'), md5(i::text), i % 7 = 0, \
                CASE WHEN i % 5 = 0 THEN i * 10 END, CASE WHEN i % 2 = 0 THEN i * 1000 END, \
                CASE WHEN i % 3 = 0 THEN i * 5000 END, CASE WHEN i % 11 = 0 THEN ARRAY['api.example.com'] END, \
                CASE WHEN i % 13 = 0 THEN 60 END, now() + make_interval(secs => i) \
           FROM generate_series(1, 499) i",
    )
    .await;
    let (status, list) = call(&app, "GET", "/admin/agents", &app.viewer_token, None).await;
    assert_eq!(status, 200);
    let agents = list["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 500);
    let spender = |i: usize| agents[i]["agent_id"].as_str().unwrap().parse::<uuid::Uuid>().unwrap();
    // Spent, reserved, released, old and this month's payments for a few agents.
    for (i, status, ago) in
        [(1, "settled", "1 minute"), (1, "signed", "1 minute"), (2, "rejected", "1 minute"), (2, "settled", "30 hours")]
    {
        Seed::new(spender(i), status).ago(ago).amount(1000 * i as u64).insert(&app.db).await;
    }
    Seed::new(spender(300), "settled_response_lost").insert(&app.db).await;
    let (_, list) = call(&app, "GET", "/admin/agents", &app.viewer_token, None).await;
    let agents = list["agents"].as_array().unwrap();
    assert_eq!(agents[0]["name"], "test-agent", "oldest first");
    let names: Vec<&str> = agents[1..].iter().map(|a| a["name"].as_str().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "in creation order");
    assert_ne!(agents[1]["settled_24h"], "0", "a payment counted: {}", agents[1]);
    for listed in agents {
        let id = listed["agent_id"].as_str().unwrap();
        let (status, alone) = call(&app, "GET", &format!("/admin/agents/{id}"), &app.viewer_token, None).await;
        assert_eq!((status, &alone), (200, listed));
    }
}
