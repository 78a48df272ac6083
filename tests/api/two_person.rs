//! The two-person rule (issue 42, item 2): with `REQUIRE_SECOND_ADMIN`, a change that raises
//! spending power is proposed and applied only when a different admin confirms it; lowering
//! and pausing apply at once. Attacked as a lone admin would (confirming their own change,
//! confirming a change that another one overtook, confirming twice at once, after expiry,
//! with a viewer's token), and the money counted on-chain: a proposed raise spends nothing.

use futures_util::future::join_all;
use serde_json::{Value, json};
use x402_router::operators::Role;

use crate::helpers::*;

type Answer = (u16, Value);

fn ruled(extra: Vec<(String, String)>) -> AppOptions {
    let mut extra = extra;
    extra.push(("require-second-admin".into(), "true".into()));
    extra.push(("change-ttl".into(), "2h".into()));
    AppOptions { acquire_timeout_ms: 10_000, extra, ..Default::default() }
}

async fn call(app: &TestApp, token: &str, method: &str, path: &str, body: Option<Value>) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = app.client.request(method, format!("{}{path}", app.address)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn admin(app: &TestApp, name: &str) -> String {
    create_operator(&app.db, name, Role::Admin).await.1
}

async fn agent_json(app: &TestApp, token: &str, id: impl std::fmt::Display) -> Value {
    let (status, a) = call(app, token, "GET", &format!("/admin/agents/{id}"), None).await;
    assert_eq!(status, 200, "{a}");
    a
}

async fn patch(app: &TestApp, token: &str, agent: &Agent, body: Value) -> Answer {
    call(app, token, "PATCH", &format!("/admin/agents/{}", agent.id), Some(body)).await
}

async fn decide(app: &TestApp, token: &str, id: &str, what: &str) -> Answer {
    call(app, token, "POST", &format!("/admin/changes/{id}/{what}"), None).await
}

/// A 202 answer's proposal id.
fn proposed(answer: &Answer) -> String {
    assert_eq!(answer.0, 202, "{}", answer.1);
    assert_eq!(answer.1["state"], "pending", "{}", answer.1);
    answer.1["id"].as_str().unwrap().to_owned()
}

async fn actions(app: &TestApp) -> Vec<(String, String)> {
    let (status, body) = call(app, &app.viewer_token, "GET", "/audit/operator-events?limit=500", None).await;
    assert_eq!(status, 200, "{body}");
    // Oldest first, as listed.
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap().to_owned(), e["operator_name"].as_str().unwrap().to_owned()))
        .collect()
}

#[actix_web::test]
async fn a_raise_waits_for_a_second_admin_and_spends_nothing_until_then() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(ruled(chain.router_extra())).await;
    let (ada, bob) = (admin(&app, "ada").await, admin(&app, "bob").await);
    let viewer = app.viewer_token.clone();
    let agent = app.agent.clone();
    // Lowering applies at once: the agent cannot pay the price.
    let lowered = patch(&app, &ada, &agent, json!({"daily_budget": (PRICE - 1).to_string()})).await;
    assert_eq!(lowered.0, 200, "{}", lowered.1);
    assert_eq!(lowered.1["daily_budget"], (PRICE - 1).to_string());

    // Ada raises it: proposed, field by field, and not applied.
    let raise = patch(&app, &ada, &agent, json!({"daily_budget": "1000000", "name": "bot"})).await;
    let id = proposed(&raise);
    let p = &raise.1;
    assert_eq!((p["kind"].as_str(), p["proposed_by"].as_str()), (Some("agent.update"), Some("ada")), "{p}");
    assert_eq!(p["target"], agent.id.to_string());
    let daily = p["fields"].as_array().unwrap().iter().find(|f| f["field"] == "daily_budget").unwrap();
    assert_eq!(
        daily,
        &json!({"field": "daily_budget", "before": (PRICE - 1).to_string(), "after": "1000000", "raises": true})
    );
    let name = p["fields"].as_array().unwrap().iter().find(|f| f["field"] == "name").unwrap();
    assert_eq!(name["raises"], false);
    let a = agent_json(&app, &viewer, agent.id).await;
    assert_eq!(
        (a["daily_budget"].as_str(), a["name"].as_str()),
        (Some("9999"), Some("test-agent")),
        "nothing applied: {a}"
    );

    // While it waits, the agent's payment is refused by the old budget: nothing moves on-chain.
    let before = chain.balance(PAY_TO).await;
    let paid = json!({"url": chain.url("/v2/weather"), "max_amount": "100000"});
    let refused = app.route(&new_key(), &paid).await;
    assert_eq!(refused.status(), 402);
    assert_eq!(chain.balance(PAY_TO).await, before);

    // The list shows it to a viewer; a viewer cannot decide it, nor propose.
    let (status, list) = call(&app, &viewer, "GET", "/admin/changes", None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["require_second_admin"], true);
    assert_eq!(
        list["changes"].as_array().unwrap().iter().map(|c| c["id"].as_str()).collect::<Vec<_>>(),
        [Some(id.as_str())]
    );
    for what in ["confirm", "reject"] {
        let (status, body) = decide(&app, &viewer, &id, what).await;
        assert_eq!((status, body["code"].as_str()), (403, Some("operator_only")), "{body}");
    }
    assert_eq!(patch(&app, &viewer, &agent, json!({"daily_budget": "5"})).await.0, 403);
    // Ada cannot confirm her own change.
    let (status, body) = decide(&app, &ada, &id, "confirm").await;
    assert_eq!((status, body["code"].as_str()), (403, Some("own_change")), "{body}");
    assert_eq!(agent_json(&app, &viewer, agent.id).await["daily_budget"], "9999");

    // Bob confirms: exactly the proposed values apply, once.
    let (status, confirmed) = decide(&app, &bob, &id, "confirm").await;
    assert_eq!(
        (status, confirmed["state"].as_str(), confirmed["decided_by"].as_str()),
        (200, Some("confirmed"), Some("bob")),
        "{confirmed}"
    );
    let a = agent_json(&app, &viewer, agent.id).await;
    assert_eq!((a["daily_budget"].as_str(), a["name"].as_str()), (Some("1000000"), Some("bot")), "{a}");
    let (status, again) = decide(&app, &bob, &id, "confirm").await;
    assert_eq!((status, again["code"].as_str()), (409, Some("change_decided")), "{again}");
    let ok = app.route(&new_key(), &paid).await;
    assert_eq!(ok.status(), 200);
    assert_eq!(chain.balance(PAY_TO).await, before + alloy::primitives::U256::from(PRICE));

    let log = actions(&app).await;
    let tail: Vec<(&str, &str)> = log.iter().rev().take(3).rev().map(|(a, n)| (a.as_str(), n.as_str())).collect();
    assert_eq!(tail, [("change.propose", "ada"), ("agent.update", "bob"), ("change.confirm", "bob")], "{log:?}");
}

#[actix_web::test]
async fn what_raises_is_proposed_what_lowers_or_stops_applies_at_once() {
    let app = spawn_app_with(ruled(vec![])).await;
    let (ada, bob) = (admin(&app, "ada").await, admin(&app, "bob").await);
    let agent = app.agent.clone();
    exec(
        &app.db,
        &format!(
            "UPDATE agents SET max_per_call = 100, daily_budget = 1000, allowed_hosts = '{{a.example.com}}', \
           blocked_pay_to = '{{0x00000000000000000000000000000000000000aa}}', approval_above = 50 WHERE id = '{}'",
            agent.id
        ),
    )
    .await;
    for lowering in [
        json!({"max_per_call": "90"}),
        json!({"daily_budget": "900", "name": "renamed"}),
        json!({"allowed_hosts": []}),
        json!({"blocked_pay_to": ["0x00000000000000000000000000000000000000aa", "0x00000000000000000000000000000000000000bb"]}),
        json!({"approval_above": "10"}),
        json!({"week_budget": "5000", "calls_per_minute": 10}),
    ] {
        let (status, body) = patch(&app, &ada, &agent, lowering.clone()).await;
        assert_eq!(status, 200, "{lowering}: {body}");
    }
    for raising in [
        json!({"max_per_call": "91"}),
        json!({"daily_budget": null}),
        json!({"allowed_hosts": ["b.example.com"]}),
        json!({"allowed_hosts": null}),
        json!({"blocked_pay_to": []}),
        json!({"approval_above": null}),
        json!({"calls_per_minute": 11}),
        // Mixed: one field lowered, one raised: proposed as a whole, nothing applied.
        json!({"daily_budget": "1", "max_per_call": "1000"}),
    ] {
        let answer = patch(&app, &ada, &agent, raising.clone()).await;
        assert_eq!(answer.0, 202, "{raising}: {}", answer.1);
    }
    let a = agent_json(&app, &ada, agent.id).await;
    assert_eq!(
        (a["max_per_call"].as_str(), a["daily_budget"].as_str()),
        (Some("90"), Some("900")),
        "the mixed change's lowering waits too: {a}"
    );

    // Disable at once, enable proposed; pause at once, resume proposed.
    assert_eq!(call(&app, &ada, "POST", &format!("/admin/agents/{}/disable", agent.id), None).await.0, 200);
    let enable = call(&app, &ada, "POST", &format!("/admin/agents/{}/enable", agent.id), None).await;
    let enable_id = proposed(&enable);
    assert_eq!(enable.1["kind"], "agent.enable");
    assert_eq!(agent_json(&app, &ada, agent.id).await["disabled"], true);
    assert_eq!(call(&app, &ada, "PATCH", "/admin/settings", Some(json!({"wallet_daily_cap": "5000"}))).await.0, 200);
    assert_eq!(call(&app, &ada, "POST", "/admin/pause", Some(json!({}))).await.0, 200);
    let resume = call(&app, &ada, "DELETE", "/admin/pause", None).await;
    let resume_id = proposed(&resume);
    assert_eq!(call(&app, &ada, "GET", "/admin/settings", None).await.1["paused"], true);
    // The wallet-wide cap (set at once above) removed: a raise.
    let uncap = call(&app, &ada, "PATCH", "/admin/settings", Some(json!({"wallet_daily_cap": null}))).await;
    let uncap_id = proposed(&uncap);
    // Bob confirms them: applied. The uncap was proposed against the paused settings, which
    // the resume changed: stale, proposed again.
    for id in [&enable_id, &resume_id] {
        let (status, body) = decide(&app, &bob, id, "confirm").await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(decide(&app, &bob, &uncap_id, "confirm").await.1["code"], "change_stale");
    let uncap = call(&app, &ada, "PATCH", "/admin/settings", Some(json!({"wallet_daily_cap": null}))).await;
    assert_eq!(decide(&app, &bob, &proposed(&uncap), "confirm").await.0, 200);
    assert_eq!(agent_json(&app, &ada, agent.id).await["disabled"], false);
    let s = call(&app, &ada, "GET", "/admin/settings", None).await.1;
    assert_eq!((s["paused"].as_bool(), s["wallet_daily_cap"].as_str()), (Some(false), None), "{s}");

    // A new agent is created disabled, with a proposal to enable it; its key is refused until then.
    let (status, made) = call(&app, &ada, "POST", "/admin/agents", Some(json!({"name": "new-bot"}))).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["agent"]["disabled"], true);
    assert_eq!(made["enable_change"]["kind"], "agent.enable");
    let new = Agent {
        id: made["agent"]["agent_id"].as_str().unwrap().parse().unwrap(),
        key: made["api_key"].as_str().unwrap().into(),
    };
    let up = TestUpstream::start().await;
    let refused = app.route_as(&new, &new_key(), &json!({"url": up.url("/ok")})).await;
    assert_eq!(refused.status(), 403);
    let id = made["enable_change"]["id"].as_str().unwrap();
    assert_eq!(decide(&app, &ada, id, "confirm").await.1["code"], "own_change");
    assert_eq!(decide(&app, &bob, id, "confirm").await.0, 200);
    x402_router_testkit::wait_until(std::time::Duration::from_secs(10), "the new agent enabled", || async {
        app.route_as(&new, &new_key(), &json!({"url": up.url("/ok")})).await.status() == 200
    })
    .await
    .unwrap();
}

#[actix_web::test]
async fn a_confirmation_never_overwrites_a_change_that_landed_in_between() {
    let app = spawn_app_with(ruled(vec![])).await;
    let (ada, bob, cy) = (admin(&app, "ada").await, admin(&app, "bob").await, admin(&app, "cy").await);
    let agent = app.agent.clone();
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 1000, month_budget = 10000 WHERE id = '{}'", agent.id))
        .await;
    // Ada proposes a raise; Bob then lowers the month budget at once (an incident).
    let raise = proposed(&patch(&app, &ada, &agent, json!({"daily_budget": "5000"})).await);
    assert_eq!(patch(&app, &bob, &agent, json!({"month_budget": "100"})).await.0, 200);
    let (status, body) = decide(&app, &cy, &raise, "confirm").await;
    assert_eq!((status, body["code"].as_str()), (409, Some("change_stale")), "{body}");
    let a = agent_json(&app, &cy, agent.id).await;
    assert_eq!(
        (a["daily_budget"].as_str(), a["month_budget"].as_str()),
        (Some("1000"), Some("100")),
        "nothing written: {a}"
    );
    // Still pending (stale): it can be rejected, then never confirmed.
    assert_eq!(decide(&app, &ada, &raise, "reject").await.1["state"], "rejected");
    assert_eq!(decide(&app, &cy, &raise, "confirm").await.1["code"], "change_decided");

    // Two raises proposed against the same values: the first confirmed, the second is stale.
    let one = proposed(&patch(&app, &ada, &agent, json!({"daily_budget": "2000"})).await);
    let two = proposed(&patch(&app, &ada, &agent, json!({"daily_budget": "3000", "month_budget": "50000"})).await);
    assert_eq!(decide(&app, &bob, &one, "confirm").await.0, 200);
    assert_eq!(decide(&app, &bob, &two, "confirm").await.1["code"], "change_stale");
    let a = agent_json(&app, &cy, agent.id).await;
    assert_eq!((a["daily_budget"].as_str(), a["month_budget"].as_str()), (Some("2000"), Some("100")), "{a}");

    // Expired: past its CHANGE_TTL (2 h here: expires_at set back in the database).
    let late = proposed(&patch(&app, &ada, &agent, json!({"daily_budget": "9000"})).await);
    let ttl = {
        let (_, list) = call(&app, &ada, "GET", "/admin/changes", None).await;
        let p = list["changes"].as_array().unwrap().iter().find(|c| c["id"] == late.as_str()).unwrap().clone();
        let at = |k: &str| chrono::DateTime::parse_from_rfc3339(p[k].as_str().unwrap()).unwrap();
        at("expires_at") - at("created_at")
    };
    assert_eq!(ttl.num_seconds(), 7200);
    exec(&app.db, &format!("UPDATE proposed_changes SET expires_at = now() - interval '1 second' WHERE id = '{late}'"))
        .await;
    assert_eq!(decide(&app, &bob, &late, "confirm").await.1["code"], "change_decided");
    let (_, expired) = call(&app, &ada, "GET", "/admin/changes?state=expired", None).await;
    assert_eq!(expired["changes"][0]["id"], late.as_str(), "{expired}");
    assert_eq!(call(&app, &ada, "GET", "/admin/changes?state=maybe", None).await.0, 400);
    assert_eq!(agent_json(&app, &cy, agent.id).await["daily_budget"], "2000");
}

#[actix_web::test]
async fn admins_confirming_at_once_apply_each_change_once() {
    let app = spawn_app_with(ruled(vec![])).await;
    let ada = admin(&app, "ada").await;
    let mut others = vec![];
    for n in 0..4 {
        others.push(admin(&app, &format!("admin-{n}")).await);
    }
    let agent = app.agent.clone();
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 1 WHERE id = '{}'", agent.id)).await;
    let rounds = 8;
    for round in 0..rounds {
        let id = proposed(&patch(&app, &ada, &agent, json!({"daily_budget": (round + 2).to_string()})).await);
        let answers: Vec<Answer> = join_all(others.iter().map(|t| decide(&app, t, &id, "confirm"))).await;
        let won = answers.iter().filter(|a| a.0 == 200).count();
        assert_eq!(won, 1, "round {round}: {answers:?}");
        for (status, body) in answers.iter().filter(|a| a.0 != 200) {
            assert_eq!((*status, body["code"].as_str()), (409, Some("change_decided")), "{body}");
        }
        assert_eq!(agent_json(&app, &ada, agent.id).await["daily_budget"], (round + 2).to_string());
    }
    let log = actions(&app).await;
    let count = |what: &str| log.iter().filter(|(a, _)| a == what).count();
    assert_eq!(
        (count("change.propose"), count("change.confirm"), count("agent.update")),
        (rounds, rounds, rounds),
        "{log:?}"
    );
}

#[actix_web::test]
async fn with_the_rule_off_every_change_applies_at_once() {
    let app = spawn_app().await;
    let ada = admin(&app, "ada").await;
    let agent = app.agent.clone();
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 1, disabled = true WHERE id = '{}'", agent.id)).await;
    assert_eq!(patch(&app, &ada, &agent, json!({"daily_budget": null})).await.0, 200);
    assert_eq!(call(&app, &ada, "POST", &format!("/admin/agents/{}/enable", agent.id), None).await.0, 200);
    assert_eq!(call(&app, &ada, "POST", "/admin/pause", Some(json!({}))).await.0, 200);
    assert_eq!(call(&app, &ada, "DELETE", "/admin/pause", None).await.0, 200);
    let (status, made) = call(&app, &ada, "POST", "/admin/agents", Some(json!({"name": "x"}))).await;
    assert_eq!((status, made["agent"]["disabled"].as_bool()), (201, Some(false)), "{made}");
    assert!(made.get("enable_change").is_none());
    let (status, list) = call(&app, &ada, "GET", "/admin/changes", None).await;
    assert_eq!((status, list["require_second_admin"].as_bool()), (200, Some(false)));
    assert_eq!(list["changes"], json!([]));
    let a = agent_json(&app, &ada, agent.id).await;
    assert_eq!((a["daily_budget"].as_str(), a["disabled"].as_bool()), (None, Some(false)), "{a}");
}

#[actix_web::test]
async fn a_lone_admin_cannot_mint_a_second_admin_to_confirm_their_own_raise() {
    let app = spawn_app_with(ruled(vec![])).await;
    let (ada, bob) = (admin(&app, "ada").await, admin(&app, "bob").await);
    let agent = app.agent.clone();
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 10 WHERE id = '{}'", agent.id)).await;
    let raise = proposed(&patch(&app, &ada, &agent, json!({"daily_budget": "1000000"})).await);
    // Ada asks for a second admin token: proposed, no token, nothing created.
    let sock =
        call(&app, &ada, "POST", "/admin/operators", Some(json!({"name": "sock-puppet", "role": "admin"}))).await;
    let sock_id = proposed(&sock);
    assert_eq!(sock.1["kind"], "operator.create");
    assert!(sock.1.get("token").is_none(), "{}", sock.1);
    let (_, listed) = call(&app, &ada, "GET", "/admin/operators", None).await;
    assert!(!listed.to_string().contains("sock-puppet"), "created before a second admin agreed: {listed}");
    assert_eq!(decide(&app, &ada, &sock_id, "confirm").await.1["code"], "own_change");
    assert_eq!(agent_json(&app, &ada, agent.id).await["daily_budget"], "10", "the raise still waits");
    // A viewer is not a vote: created at once.
    let viewer = call(&app, &ada, "POST", "/admin/operators", Some(json!({"name": "watcher", "role": "viewer"}))).await;
    assert_eq!(viewer.0, 201, "{}", viewer.1);
    // Bob agrees to a new admin: he receives its token, which then counts as another admin.
    let (status, confirmed) = decide(&app, &bob, &sock_id, "confirm").await;
    assert_eq!((status, confirmed["state"].as_str()), (200, Some("confirmed")), "{confirmed}");
    let carol = confirmed["token"].as_str().unwrap().to_owned();
    assert_eq!(decide(&app, &carol, &raise, "confirm").await.0, 200);
    assert_eq!(agent_json(&app, &ada, agent.id).await["daily_budget"], "1000000");
}

#[actix_web::test]
async fn the_bootstrap_token_is_one_admin_too() {
    const BOOTSTRAP: &str = "bootstrap-token-for-two-person-tests-0123";
    let app = spawn_app_with(ruled(vec![("operator-token".into(), BOOTSTRAP.into())])).await;
    let ada = admin(&app, "ada").await;
    let agent = app.agent.clone();
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 10 WHERE id = '{}'", agent.id)).await;
    let mine = proposed(&patch(&app, BOOTSTRAP, &agent, json!({"daily_budget": "20"})).await);
    assert_eq!(decide(&app, BOOTSTRAP, &mine, "confirm").await.1["code"], "own_change");
    assert_eq!(decide(&app, &ada, &mine, "confirm").await.0, 200);
    // The bootstrap token names nobody: it may be ada's own, so it cannot be her second person.
    let hers = proposed(&patch(&app, &ada, &agent, json!({"daily_budget": "30"})).await);
    let (status, refused) = decide(&app, BOOTSTRAP, &hers, "confirm").await;
    assert_eq!((status, refused["code"].as_str()), (403, Some("own_change")), "{refused}");
    assert_eq!(agent_json(&app, &ada, agent.id).await["daily_budget"], "20");
    let bob = admin(&app, "bob").await;
    assert_eq!(decide(&app, &bob, &hers, "confirm").await.0, 200);
    assert_eq!(agent_json(&app, &ada, agent.id).await["daily_budget"], "30");
}
