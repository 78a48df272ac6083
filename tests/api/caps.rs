//! The caps of issue 42 (item 3): a rolling 7-day budget, a lifetime budget, budgets per
//! upstream host and `payTo` block lists (per agent and wallet-wide), attacked as an agent
//! would: many concurrent calls, two router processes, one ledger; money counted on-chain.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use alloy::primitives::U256;
use futures_util::future::join_all;
use serde_json::{Value, json};
use x402_router::faults::Point;
use x402_router::operators::Role;
use x402_router::startup::Hooks;

use crate::helpers::*;

async fn paid_app(chain: &Devnet) -> TestApp {
    spawn_app_with(AppOptions { acquire_timeout_ms: 10_000, extra: chain.router_extra(), ..Default::default() }).await
}

async fn set(app: &TestApp, assignments: &str) {
    exec(&app.db, &format!("UPDATE agents SET {assignments} WHERE id = '{}'", app.agent.id)).await;
}

fn paid_body(chain: &Devnet) -> Value {
    json!({"url": chain.url("/v2/weather"), "max_amount": "10000"})
}

/// The same upstream under another host name (`localhost` instead of `127.0.0.1`).
fn paid_body_at_localhost(chain: &Devnet) -> Value {
    json!({"url": chain.url("/v2/weather").replace("127.0.0.1", "localhost"), "max_amount": "10000"})
}

async fn moved(chain: &Devnet) -> U256 {
    chain.balance(PAY_TO).await
}

type Answer = (u16, Value);

/// Fires one call per body with fresh keys at once; (status, body) of each.
async fn race(app: &Arc<TestApp>, bodies: Vec<Value>) -> Vec<Answer> {
    join_all(bodies.into_iter().map(|body| {
        let app = Arc::clone(app);
        async move {
            let resp = app.route(&new_key(), &body).await;
            (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
        }
    }))
    .await
}

fn settled(results: &[Answer]) -> usize {
    results.iter().filter(|(s, b)| *s == 200 && b["payment"]["status"] == "settled").count()
}

fn over_budget(results: &[Answer]) -> Vec<&Answer> {
    results.iter().filter(|(s, b)| *s == 402 && b["code"] == "payment_over_budget").collect()
}

/// Moves every payment's signing and validity `ago` into the past (`'3 days'`).
async fn age_payments(db: &TestDb, ago: &str) {
    exec(
        db,
        &format!(
            "UPDATE payments SET signed_at = now() - interval '{ago}', \
                    valid_before = extract(epoch FROM now() - interval '{ago}')::bigint"
        ),
    )
    .await;
}

async fn admin_call(app: &TestApp, token: &str, method: &str, path: &str, body: Option<Value>) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = app.client.request(method, format!("{}{path}", app.address)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn admin(app: &TestApp) -> String {
    create_operator(&app.db, "ada", Role::Admin).await.1
}

async fn me(app: &TestApp, agent: &Agent) -> Value {
    get_json(&app.client, &format!("{}/agents/me", app.address), &agent.key).await
}

#[actix_web::test]
async fn thirty_concurrent_paid_calls_never_exceed_a_weekly_budget_which_counts_seven_days() {
    let chain = Devnet::start().await;
    let app = Arc::new(paid_app(&chain).await);
    set(&app, &format!("week_budget = {}", 2 * PRICE)).await;
    let before = moved(&chain).await;
    let results = race(&app, vec![paid_body(&chain); 30]).await;
    assert_eq!(settled(&results), 2, "{:?}", results.iter().map(|r| r.0).collect::<Vec<_>>());
    assert_eq!(over_budget(&results).len(), 28, "{results:?}");
    assert_eq!(moved(&chain).await - before, U256::from(2 * PRICE));
    let me0 = me(&app, &app.agent).await;
    assert_eq!(
        (&me0["week_budget"], &me0["spent_7d"], &me0["remaining_7d"]),
        (&json!("20000"), &json!("20000"), &json!("0"))
    );
    // Spent three days ago: outside any 24 h window, inside the week: still refused, naming it.
    age_payments(&app.db, "3 days").await;
    let resp = app.route(&new_key(), &paid_body(&chain)).await;
    assert_eq!(resp.status(), 402);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "payment_over_budget", "{body}");
    // Eight days ago: the week is whole again.
    age_payments(&app.db, "8 days").await;
    assert_eq!(app.route(&new_key(), &paid_body(&chain)).await.status(), 200);
    assert_eq!(moved(&chain).await - before, U256::from(3 * PRICE));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 3);
}

#[actix_web::test]
async fn thirty_concurrent_paid_calls_never_exceed_a_lifetime_budget_however_old_the_spend() {
    let chain = Devnet::start().await;
    let app = Arc::new(paid_app(&chain).await);
    set(&app, &format!("lifetime_budget = {}", 2 * PRICE)).await;
    let before = moved(&chain).await;
    let results = race(&app, vec![paid_body(&chain); 30]).await;
    assert_eq!(settled(&results), 2, "{:?}", results.iter().map(|r| r.0).collect::<Vec<_>>());
    assert_eq!(over_budget(&results).len(), 28, "{results:?}");
    assert_eq!(moved(&chain).await - before, U256::from(2 * PRICE));
    // A year later, the lifetime is still spent (the reservation names the budget).
    age_payments(&app.db, "400 days").await;
    let me0 = me(&app, &app.agent).await;
    assert_eq!((&me0["spent_lifetime"], &me0["remaining_lifetime"]), (&json!("20000"), &json!("0")), "{me0}");
    let resp = app.route(&new_key(), &paid_body(&chain)).await;
    assert_eq!(resp.status(), 402);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "payment_over_budget");
    // The operator raises it by one price: exactly one more call pays.
    set(&app, &format!("lifetime_budget = {}", 3 * PRICE)).await;
    let results = race(&app, vec![paid_body(&chain); 5]).await;
    assert_eq!((settled(&results), over_budget(&results).len()), (1, 4), "{results:?}");
    assert_eq!(moved(&chain).await - before, U256::from(3 * PRICE));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 3);
}

#[actix_web::test]
async fn a_host_budget_caps_what_one_agent_spends_at_one_host_and_not_at_another() {
    let chain = Devnet::start().await;
    let app = Arc::new(paid_app(&chain).await);
    set(&app, &format!("host_budgets = '{{\"127.0.0.1\": \"{}\"}}'", 2 * PRICE)).await;
    let before = moved(&chain).await;
    let bodies: Vec<Value> =
        (0..24).map(|i| if i % 2 == 0 { paid_body(&chain) } else { paid_body_at_localhost(&chain) }).collect();
    let results = race(&app, bodies.clone()).await;
    let at = |host: &str| -> Vec<Answer> {
        results
            .iter()
            .zip(&bodies)
            .filter(|(_, b)| b["url"].as_str().unwrap().contains(host))
            .map(|(r, _)| r.clone())
            .collect()
    };
    let (capped, free) = (at("127.0.0.1"), at("localhost"));
    assert_eq!((settled(&capped), over_budget(&capped).len()), (2, 10), "{capped:?}");
    assert_eq!(settled(&free), 12, "{free:?}");
    assert_eq!(moved(&chain).await - before, U256::from(14 * PRICE));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 14);
    // The ledger keeps each payment's host, as the budget counts it.
    let port = reqwest::Url::parse(&chain.url("/")).unwrap().port().unwrap();
    let hosts = format!("SELECT count(*) AS n FROM payments WHERE upstream_host = '127.0.0.1:{port}'");
    assert_eq!(count(&app.db, &hosts).await, 2);
    assert_eq!(
        count(&app.db, &format!("SELECT count(*) AS n FROM payments WHERE upstream_host = 'localhost:{port}'")).await,
        12
    );
    let me0 = me(&app, &app.agent).await;
    assert_eq!(
        me0["host_budgets"],
        json!([{"host": "127.0.0.1", "budget": "20000", "used_24h": "20000", "remaining_24h": "0"}])
    );
    // Refused at the reservation too, naming the limit (the choice sees the same headroom).
    let resp = app.route(&new_key(), &paid_body(&chain)).await;
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "payment_over_budget", "{body}");
    assert!(body["error"].as_str().unwrap().contains("budget"), "{body}");
}

#[actix_web::test]
async fn weekly_lifetime_and_host_budgets_hold_across_two_router_processes() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let weekly = create_agent(&db, "weekly").await;
    let lifelong = create_agent(&db, "lifelong").await;
    let hosted = create_agent(&db, "hosted").await;
    exec(&db, &format!("UPDATE agents SET week_budget = {} WHERE id = '{}'", 2 * PRICE, weekly.id)).await;
    exec(&db, &format!("UPDATE agents SET lifetime_budget = {} WHERE id = '{}'", 2 * PRICE, lifelong.id)).await;
    let budgets = format!("{{\"127.0.0.1\": \"{}\"}}", 2 * PRICE);
    exec(&db, &format!("UPDATE agents SET host_budgets = '{budgets}' WHERE id = '{}'", hosted.id)).await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions { acquire_timeout_ms: 10_000, extra: chain.router_extra(), ..Default::default() };
    let routers =
        [RouterProcess::spawn(&db.url, &opts, &prefix).await, RouterProcess::spawn(&db.url, &opts, &prefix).await];
    let client = reqwest::Client::new();
    let before = moved(&chain).await;
    let agents = [weekly.clone(), lifelong.clone(), hosted.clone()];
    let results = join_all((0..36).map(|i| {
        let agent = agents[i % 3].clone();
        // The host-capped agent calls both hosts; the others the capped one.
        let body = if i % 3 == 2 && (i / 3) % 2 == 1 { paid_body_at_localhost(&chain) } else { paid_body(&chain) };
        let (client, addr) = (client.clone(), routers[(i / 3) % 2].address.clone());
        async move {
            let resp = route_at(&client, &addr, &agent, &new_key(), &body).await;
            let status = resp.status().as_u16();
            (agent.id, body, status, resp.json::<Value>().await.unwrap())
        }
    }))
    .await;
    let paid = |id, host: &str| {
        results
            .iter()
            .filter(|(a, b, s, r)| {
                *a == id
                    && b["url"].as_str().unwrap().contains(host)
                    && *s == 200
                    && r["payment"]["status"] == "settled"
            })
            .count()
    };
    let refused = |id| results.iter().filter(|(a, _, _, r)| *a == id && r["code"] == "payment_over_budget").count();
    assert_eq!((paid(weekly.id, ""), refused(weekly.id)), (2, 10), "{results:?}");
    assert_eq!((paid(lifelong.id, ""), refused(lifelong.id)), (2, 10), "{results:?}");
    assert_eq!(
        (paid(hosted.id, "127.0.0.1"), paid(hosted.id, "localhost"), refused(hosted.id)),
        (2, 6, 4),
        "{results:?}"
    );
    assert_eq!(moved(&chain).await - before, U256::from(12 * PRICE));
    assert_eq!(chain.stats().await["/v2/weather"]["paid"], 12);
}

/// `0x…` with every hex digit upper-case: another spelling of the same EVM address.
fn shouted(address: alloy::primitives::Address) -> String {
    format!("0x{}", address.to_string()[2..].to_ascii_uppercase())
}

#[actix_web::test]
async fn a_blocked_pay_to_is_never_signed_for_the_agent_or_for_any_agent_wallet_wide() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let token = admin(&app).await;
    let other = create_agent(&app.db, "other").await;
    let before = moved(&chain).await;
    let path = format!("/admin/agents/{}", app.agent.id);
    // Blocked for the agent, in another letter case; the block wins over the allowlist.
    let change = json!({"blocked_pay_to": [shouted(PAY_TO)], "allowed_pay_to": [PAY_TO.to_string()]});
    let (status, view) = admin_call(&app, &token, "PATCH", &path, Some(change)).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["blocked_pay_to"], json!([PAY_TO.to_string().to_ascii_lowercase()]));
    let resp = app.route(&new_key(), &paid_body(&chain)).await;
    assert_eq!(resp.status(), 402);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "payment_not_allowed", "{body}");
    assert!(body["error"].as_str().unwrap().contains("agent's block list"), "{body}");
    // Another agent is not held to it.
    assert_eq!(app.route_as(&other, &new_key(), &paid_body(&chain)).await.status(), 200);
    // Wallet-wide: every agent is refused.
    let (status, _) = admin_call(&app, &token, "PATCH", &path, Some(json!({"blocked_pay_to": null}))).await;
    assert_eq!(status, 200);
    let wallet = json!({"blocked_pay_to": [PAY_TO.to_checksum(None)]});
    let (status, settings) = admin_call(&app, &token, "PATCH", "/admin/settings", Some(wallet)).await;
    assert_eq!(status, 200, "{settings}");
    assert_eq!(settings["blocked_pay_to"], json!([PAY_TO.to_string().to_ascii_lowercase()]));
    for agent in [&app.agent, &other] {
        let resp = app.route_as(agent, &new_key(), &paid_body(&chain)).await;
        assert_eq!(resp.status(), 402);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["code"], "payment_not_allowed", "{body}");
        assert!(body["error"].as_str().unwrap().contains("wallet-wide block list"), "{body}");
    }
    // Nothing was signed for the refused calls: one payment in the ledger, one on-chain.
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 1);
    assert_eq!(moved(&chain).await - before, U256::from(PRICE));
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 1);
    // Each change is an operator event with what it changed.
    let (_, events) = admin_call(&app, &app.viewer_token, "GET", "/audit/operator-events?limit=50", None).await;
    let events = events["events"].as_array().unwrap();
    let settings_event = events.iter().find(|e| e["action"] == "settings.update").unwrap();
    assert_eq!(settings_event["before"]["blocked_pay_to"], Value::Null);
    assert_eq!(settings_event["after"]["blocked_pay_to"], json!([PAY_TO.to_string().to_ascii_lowercase()]));
    let blocked: Vec<Value> =
        events.iter().filter(|e| e["action"] == "agent.update").map(|e| e["after"]["blocked_pay_to"].clone()).collect();
    assert_eq!(blocked.len(), 2, "{events:?}");
    assert!(blocked.contains(&Value::Null) && blocked.contains(&json!([PAY_TO.to_string().to_ascii_lowercase()])));
    // Lifted: paid once.
    let (status, _) = admin_call(&app, &token, "PATCH", "/admin/settings", Some(json!({"blocked_pay_to": null}))).await;
    assert_eq!(status, 200);
    assert_eq!(app.route(&new_key(), &paid_body(&chain)).await.status(), 200);
    assert_eq!(moved(&chain).await - before, U256::from(2 * PRICE));
}

/// The choice is made before signing; a `payTo` blocked between the choice and the
/// reservation is refused by the reservation, under the agent's lock: never sent.
#[actix_web::test]
async fn a_pay_to_blocked_after_the_choice_is_refused_by_the_reservation() {
    let chain = Devnet::start().await;
    let (hook, held, armed) = hold_at(Point::BeforeIntent);
    let hooks = Hooks { at: Some(hook), ..Default::default() };
    let app = Arc::new(
        spawn_app_with(AppOptions {
            extra: chain.router_extra(),
            hooks,
            acquire_timeout_ms: 10_000,
            ..Default::default()
        })
        .await,
    );
    let token = admin(&app).await;
    let before = moved(&chain).await;
    armed.store(true, Ordering::SeqCst);
    let call = {
        let (app, body) = (Arc::clone(&app), paid_body(&chain));
        tokio::spawn(async move {
            let resp = app.route(&new_key(), &body).await;
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        })
    };
    held.reached.notified().await;
    let wallet = json!({"blocked_pay_to": [shouted(PAY_TO)]});
    assert_eq!(admin_call(&app, &token, "PATCH", "/admin/settings", Some(wallet)).await.0, 200);
    held.thaw.send(true).unwrap();
    let (status, body) = call.await.unwrap();
    assert_eq!((status, body["code"].as_str()), (402, Some("payment_not_allowed")), "{body}");
    assert!(body["error"].as_str().unwrap().contains("wallet-wide block list"), "{body}");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0);
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 0, "nothing signed left the router");
    assert_eq!(moved(&chain).await, before);
}

/// Signed intents left by crashed owners, their `payTo` blocked since: a takeover neither
/// re-sends the one still valid nor signs again the one that expired unused.
#[actix_web::test]
async fn a_takeover_never_sends_or_signs_again_a_recorded_payment_to_a_pay_to_blocked_since() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let body = paid_body(&chain);
    let (live, dead) = (new_key(), new_key());
    crash_after_signing(&app, &chain, &live, &body, 200).await;
    crash_after_signing(&app, &chain, &dead, &body, -300).await;
    set(&app, &format!("blocked_pay_to = ARRAY['{}']", PAY_TO.to_string().to_ascii_lowercase())).await;
    let before = moved(&chain).await;
    for key in [&live, &dead] {
        let resp = app.route(key, &body).await;
        let status = resp.status().as_u16();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!((status, answer["code"].as_str()), (402, Some("payment_not_allowed")), "{answer}");
        assert!(answer["error"].as_str().unwrap().contains("agent's block list"), "{answer}");
    }
    assert_eq!(chain.stats().await["/v2/weather"]["payment_attempts"], 0, "nothing recorded was sent");
    assert_eq!(
        count(&app.db, "SELECT count(*) AS n FROM payments WHERE attempts > 1").await,
        0,
        "nothing signed again"
    );
    assert_eq!(moved(&chain).await, before);
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 0);
}

#[actix_web::test]
async fn bad_caps_are_refused_with_nothing_changed_and_each_change_is_audited() {
    let app = spawn_app().await;
    let token = admin(&app).await;
    let path = format!("/admin/agents/{}", app.agent.id);
    let events = "SELECT count(*) AS n FROM operator_events";
    let (_, agent0) = admin_call(&app, &token, "GET", &path, None).await;
    let (_, settings0) = admin_call(&app, &token, "GET", "/admin/settings", None).await;
    let many: serde_json::Map<String, Value> = (0..101).map(|i| (format!("h{i}.example.com"), json!("1"))).collect();
    for bad in [
        json!({"week_budget": "-1"}),
        json!({"week_budget": 70000}),
        json!({"lifetime_budget": "1.5"}),
        json!({"host_budgets": ["api.example.com"]}),
        json!({"host_budgets": {"exa mple.com": "5"}}),
        json!({"host_budgets": {"api.example.com": 5}}),
        json!({"host_budgets": {"api.example.com": "5", "API.example.com": "6"}}),
        json!({"host_budgets": Value::Object(many)}),
        json!({"blocked_pay_to": ["0x12"]}),
        json!({"blocked_pay_to": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"}),
        json!({"weekly_budget": "5"}),
        // A good field beside a bad one changes nothing either.
        json!({"week_budget": "5", "host_budgets": {"*": "5"}}),
    ] {
        let (status, err) = admin_call(&app, &token, "PATCH", &path, Some(bad.clone())).await;
        assert_eq!((status, err["code"].as_str()), (400, Some("bad_request")), "{bad}: {err}");
    }
    for bad in [json!({"blocked_pay_to": ["nope"]}), json!({"blocked_pay_to": "x"}), json!({}), json!({"paused": true})]
    {
        let (status, err) = admin_call(&app, &token, "PATCH", "/admin/settings", Some(bad.clone())).await;
        assert_eq!(status, 400, "{bad}: {err}");
    }
    assert_eq!(admin_call(&app, &token, "GET", &path, None).await.1, agent0);
    assert_eq!(admin_call(&app, &token, "GET", "/admin/settings", None).await.1, settings0);
    assert_eq!(count(&app.db, events).await, 0, "no event for a change that did not happen");

    let good = json!({
        "week_budget": "70000", "lifetime_budget": "1000000",
        "host_budgets": {"API.example.com": "50000", "*.example.org": "1000"},
        "blocked_pay_to": ["0x00000000000000000000000000000000000000AA"]
    });
    let (status, view) = admin_call(&app, &token, "PATCH", &path, Some(good)).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["host_budgets"], json!({"*.example.org": "1000", "api.example.com": "50000"}));
    assert_eq!(
        view["host_budget_use"][1],
        json!({"host": "api.example.com", "budget": "50000", "used_24h": "0", "remaining_24h": "50000"})
    );
    assert_eq!((&view["week_budget"], &view["remaining_7d"]), (&json!("70000"), &json!("70000")));
    assert_eq!((&view["lifetime_budget"], &view["settled_lifetime"]), (&json!("1000000"), &json!("0")));
    assert_eq!(count(&app.db, events).await, 1);
    let (_, listed) =
        admin_call(&app, &app.viewer_token, "GET", "/audit/operator-events?action=agent.update", None).await;
    let event = &listed["events"][0];
    assert_eq!((&event["before"]["week_budget"], &event["after"]["week_budget"]), (&Value::Null, &json!("70000")));
    assert_eq!(event["after"]["blocked_pay_to"], json!(["0x00000000000000000000000000000000000000aa"]));
    // The agent sees every limit it is held to.
    let me0 = me(&app, &app.agent).await;
    assert_eq!((&me0["week_budget"], &me0["lifetime_budget"]), (&json!("70000"), &json!("1000000")));
    assert_eq!(me0["host_budgets"][0]["host"], "*.example.org");
    assert_eq!(me0["blocked_pay_to"], json!(["0x00000000000000000000000000000000000000aa"]));
    // The command line takes the same limits through the same validation.
    let id = app.agent.id.to_string();
    let out = router_command()
        .args([
            "agents",
            "update",
            &id,
            "--host-budgets",
            "api.example.com=7, *.example.org=9",
            "--lifetime-budget",
            "none",
        ])
        .env("DATABASE_URL", &app.db.url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let updated: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(updated["host_budgets"], json!({"*.example.org": "9", "api.example.com": "7"}));
    assert_eq!(updated["lifetime_budget"], Value::Null);
    let out = router_command()
        .args(["agents", "update", &id, "--host-budgets", "api.example.com"])
        .env("DATABASE_URL", &app.db.url)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(count(&app.db, events).await, 2);
}
