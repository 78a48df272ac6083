//! Deployment: TLS to Postgres and Redis against real TLS-only servers (certificates made
//! by the test), Redis Cluster with a master killed mid-run, migrations from replicas
//! started together, the shutdown limit, and the operational metrics.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use x402_router::db::Connector;
use x402_router::idempotency::redis_link::RedisTarget;
use x402_router::startup::{Application, Hooks};

use crate::helpers::tls_services::{RedisCluster, TestPki, TlsPostgres, TlsRedis, wait_until};
use crate::helpers::*;

/// A router running in this process on an arbitrary database URL (e.g. a TLS one).
struct Served {
    address: String,
    handle: actix_web::dev::ServerHandle,
}

impl Served {
    fn start(db_url: &str, options: &AppOptions) -> Self {
        let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
        let config = config_from(&serve_args(options, db_url, &prefix, "127.0.0.1:0"));
        let app = Application::build(config, Hooks::default()).expect("build app");
        let address = format!("http://127.0.0.1:{}", app.port());
        let server = app.into_server();
        let handle = server.handle();
        tokio::spawn(server);
        Self { address, handle }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let h = self.handle.clone();
        drop(tokio::spawn(async move { h.stop(false).await }));
    }
}

/// Creates an agent through the CLI (so `agents create` is exercised on that URL too).
fn cli_agent(db_url: &str) -> Agent {
    let out = router_command()
        .args(["agents", "create", "--name", "tls-agent"])
        .env("DATABASE_URL", db_url)
        .output()
        .unwrap();
    assert!(out.status.success(), "agents create: {}", String::from_utf8_lossy(&out.stderr));
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    Agent { id: line["agent_id"].as_str().unwrap().parse().unwrap(), key: line["api_key"].as_str().unwrap().into() }
}

async fn connect_error(url: &str) -> String {
    match Connector::from_url(url) {
        Err(e) => e.0,
        Ok(c) => match c.connect().await {
            Ok(_) => panic!("{url} connected"),
            Err(e) => e.to_string(),
        },
    }
}

async fn connects(url: &str) {
    let c = Connector::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    if let Err(e) = c.connect().await {
        panic!("{url} did not connect: {e}");
    }
}

fn metric_value(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(name_and_labels)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[actix_web::test]
async fn postgres_over_tls_honours_every_sslmode_and_names_a_wrong_ca() {
    let pki = TestPki::generate(&["127.0.0.1", "db.test"]);
    let pg = TlsPostgres::start(&pki).await;
    let ca = pki.ca.display().to_string();
    let wrong = pki.wrong_ca.display().to_string();

    // The server takes TLS only: a plain connection is refused by the server.
    let err = connect_error(&pg.url("127.0.0.1", "sslmode=disable")).await;
    assert!(err.contains("no encryption") || err.contains("pg_hba.conf"), "{err}");
    // require / prefer: encrypted, certificate not checked.
    connects(&pg.url("127.0.0.1", "sslmode=require")).await;
    connects(&pg.url("127.0.0.1", "")).await;
    // verify-full with the right CA; the host (an IP) is in the certificate.
    connects(&pg.url("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={ca}"))).await;
    // A wrong CA fails with a message that says why.
    for mode in ["verify-full", "verify-ca", "require"] {
        let err = connect_error(&pg.url("127.0.0.1", &format!("sslmode={mode}&sslrootcert={wrong}"))).await;
        assert!(err.contains("invalid peer certificate") && err.contains("UnknownIssuer"), "{mode}: {err}");
    }
    // A name the certificate does not carry: verify-full refuses, verify-ca accepts.
    let other_name = |mode: &str| {
        format!(
            "postgres://postgres@other.test:{}/postgres?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={ca}",
            pg.port
        )
    };
    let err = connect_error(&other_name("verify-full")).await;
    assert!(err.contains("not valid for name \"other.test\""), "{err}");
    connects(&other_name("verify-ca")).await;
    // Config names the setting when the root file is missing.
    let err = connect_error(&pg.url("127.0.0.1", "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")).await;
    assert!(err.contains("sslrootcert /nonexistent/ca.pem"), "{err}");

    // The whole service over verify-full: migrate and agents (CLI), a routed call (pool).
    let url = pg.url("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={ca}"));
    let out = router_command().args(["migrate", "--database-url", &url]).output().unwrap();
    assert!(out.status.success(), "migrate: {}", String::from_utf8_lossy(&out.stderr));
    let agent = cli_agent(&url);
    let app = Served::start(&url, &AppOptions::default());
    let up = TestUpstream::start().await;
    let client = reqwest::Client::new();
    let resp = route_at(&client, &app.address, &agent, &new_key(), &json!({"url": up.url("/ok/tls")})).await;
    assert_eq!(resp.status(), 200);
    let ready: Value = reqwest::get(format!("{}/readyz", app.address)).await.unwrap().json().await.unwrap();
    assert_eq!(ready["postgres"], "ok", "{ready}");

    // The CLI with the wrong CA exits non-zero and says why on one line.
    let bad = pg.url("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={wrong}"));
    let out = router_command().args(["migrate", "--database-url", &bad]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
}

#[actix_web::test]
async fn redis_over_tls_caches_with_the_right_ca_and_names_a_wrong_one() {
    let pki = TestPki::generate(&["127.0.0.1"]);
    let redis = TlsRedis::start(&pki).await;
    let ca = pki.ca.display().to_string();
    let wrong = pki.wrong_ca.display().to_string();
    let url = |q: &str| format!("rediss://127.0.0.1:{}/?{q}", redis.port);
    let timeout = Duration::from_secs(2);

    for q in [format!("sslrootcert={ca}"), format!("sslmode=verify-ca&sslrootcert={ca}"), "sslmode=require".into()] {
        let target = RedisTarget::parse(&url(&q), false, None).unwrap();
        let mut conn = target.connect(timeout).await.unwrap_or_else(|e| panic!("{q}: {e}"));
        let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        assert_eq!(pong, "PONG");
    }
    let target = RedisTarget::parse(&url(&format!("sslmode=verify-full&sslrootcert={wrong}")), false, None).unwrap();
    let err = target.connect(timeout).await.err().expect("the wrong CA must not connect").to_string();
    assert!(err.contains("invalid peer certificate") && err.contains("UnknownIssuer"), "{err}");
    // A plain connection to the TLS-only server does not work either.
    let plain = RedisTarget::parse(&format!("redis://127.0.0.1:{}", redis.port), false, None).unwrap();
    assert!(plain.connect(timeout).await.is_err());

    // The router caches over TLS: the replay is served from Redis.
    let app = spawn_app_with(AppOptions { redis_url: url(&format!("sslrootcert={ca}")), ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let key = new_key();
    let body = json!({"url": up.url("/ok/tls-redis")});
    wait_until("redis over TLS to be ready", Duration::from_secs(10), async || {
        let r: Value = app.client.get(format!("{}/readyz", app.address)).send().await.unwrap().json().await.unwrap();
        r["redis"] == "ok"
    })
    .await;
    assert_eq!(app.route(&key, &body).await.status(), 200);
    let replay = app.route(&key, &body).await;
    assert_eq!(replay.headers()["x-idempotent-replay"], "true");
    let metrics = app.metrics_text().await;
    let from_redis = metric_value(&metrics, r#"x402_router_idempotency_outcomes_total{outcome="replay-redis"}"#);
    assert!(from_redis.unwrap_or(0.0) >= 1.0, "{metrics}");
    assert_eq!(up.hits.total(), 1);

    // With the wrong CA the router still serves (Postgres path) and says Redis is unreachable.
    let app =
        spawn_app_with(AppOptions { redis_url: url(&format!("sslrootcert={wrong}")), ..Default::default() }).await;
    let key = new_key();
    assert_eq!(app.route(&key, &body).await.status(), 200);
    assert_eq!(app.route(&key, &body).await.headers()["x-idempotent-replay"], "true");
    let r: Value = app.client.get(format!("{}/readyz", app.address)).send().await.unwrap().json().await.unwrap();
    assert_eq!(r["redis"], "unreachable");
}

#[actix_web::test]
async fn redis_cluster_spreads_agents_over_masters_and_a_killed_master_loses_nothing() {
    let mut cluster = RedisCluster::start().await;
    let db = std::sync::Arc::new(TestDb::new().await);
    let options = AppOptions {
        redis_url: cluster.url(),
        extra: vec![("redis-cluster".into(), "true".into())],
        ..Default::default()
    };
    let app = spawn_app_on(std::sync::Arc::clone(&db), options).await;
    let up = TestUpstream::start().await;
    let mut agents = vec![app.agent.clone()];
    for i in 0..7 {
        agents.push(create_agent(&db, &format!("agent-{i}")).await);
    }
    wait_until("the cluster cache to be ready", Duration::from_secs(10), async || {
        let r: Value = app.client.get(format!("{}/readyz", app.address)).send().await.unwrap().json().await.unwrap();
        r["redis"] == "ok"
    })
    .await;

    // Phase 1: every agent completes a call; its replay comes from the cluster.
    let mut calls = Vec::new();
    for (i, agent) in agents.iter().enumerate() {
        let key = new_key();
        let body = json!({"url": up.url(&format!("/ok/agent-{i}"))});
        let first = app.route_as(agent, &key, &body).await;
        assert_eq!(first.status(), 200);
        let first: Value = first.json().await.unwrap();
        calls.push((agent.clone(), key, body, first));
    }
    for (agent, key, body, first) in &calls {
        let replay = app.route_as(agent, key, body).await;
        assert_eq!(replay.headers()["x-idempotent-replay"], "true");
        assert_eq!(&replay.json::<Value>().await.unwrap(), first);
    }
    let metrics = app.metrics_text().await;
    let from_redis = metric_value(&metrics, r#"x402_router_idempotency_outcomes_total{outcome="replay-redis"}"#);
    assert_eq!(from_redis, Some(agents.len() as f64), "every replay came from the cluster");
    // The keys carry the agent as hash tag, and the agents are spread over the masters.
    let mut used = std::collections::BTreeSet::new();
    for i in 0..3 {
        for k in cluster.keys_on(i).await {
            let tagged = agents.iter().any(|a| k.starts_with(&format!("{}idem:{{{}}}:", app.redis_prefix, a.id)));
            assert!(tagged, "{k} is not hash-tagged on an agent id");
            used.insert(i);
        }
    }
    assert!(used.len() >= 2, "keys of 8 agents on {} master(s)", used.len());

    // Phase 2: kill the master holding the first agent's keys while calls run.
    let (victim_agent, ..) = &calls[0];
    let victim = cluster.master_of(&format!("{{{}}}", victim_agent.id)).await;
    let running = {
        let (client, address, agents, up_url) = (app.client.clone(), app.address.clone(), agents.clone(), up.url(""));
        tokio::spawn(async move {
            let mut done = Vec::new();
            for round in 0..5 {
                for (i, agent) in agents.iter().enumerate() {
                    let key = new_key();
                    let body = json!({"url": format!("{up_url}/ok/during-{round}-{i}")});
                    let started = Instant::now();
                    let resp = route_at(&client, &address, agent, &key, &body).await;
                    assert_eq!(resp.status(), 200, "a call during the kill failed");
                    assert!(started.elapsed() < Duration::from_secs(5), "a call hung on Redis");
                    done.push((agent.clone(), key, body));
                }
            }
            done
        })
    };
    let started = calls.len();
    wait_until("calls to be running", Duration::from_secs(10), async || up.hits.total() >= started + 3).await;
    cluster.kill(victim);
    let during = running.await.unwrap();

    // Nothing lost, nothing run twice: every key (old and new) replays without executing.
    let executed = up.hits.total();
    for (agent, key, body, first) in &calls {
        let replay = app.route_as(agent, key, body).await;
        assert_eq!(replay.headers()["x-idempotent-replay"], "true");
        assert_eq!(&replay.json::<Value>().await.unwrap(), first);
    }
    for (agent, key, body) in &during {
        let replay = app.route_as(agent, key, body).await;
        assert_eq!(replay.status(), 200);
        assert_eq!(replay.headers()["x-idempotent-replay"], "true");
    }
    assert_eq!(up.hits.total(), executed, "a replay executed again");
    assert_eq!(executed, calls.len() + during.len());
    let completed = count(&db, "SELECT count(*) AS n FROM idempotency_keys WHERE status = 'completed'").await;
    assert_eq!(completed as usize, calls.len() + during.len());
}

#[actix_web::test]
async fn replicas_started_together_migrate_once_under_the_advisory_lock() {
    let db = TestDb::new().await;
    // An empty database of its own (TestDb comes migrated).
    let name = format!("x4r_test_{}", uuid::Uuid::new_v4().simple());
    exec(&db, &format!("CREATE DATABASE {name}")).await;
    let url = crate::helpers::db::url_for(&name);
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { x402_router::db::run_migrations(&url).await })
        })
        .collect();
    let mut applied = Vec::new();
    for r in runs {
        applied.push(r.await.unwrap().expect("every replica's migration succeeds"));
    }
    assert_eq!(applied.iter().filter(|a| !a.is_empty()).count(), 1, "{applied:?}");
    let all = diesel::migration::MigrationSource::<diesel::pg::Pg>::migrations(&x402_router::db::MIGRATIONS).unwrap();
    assert!(applied.iter().any(|a| a.len() == all.len()));
    exec(&db, &format!("DROP DATABASE {name} WITH (FORCE)")).await;
}

#[actix_web::test]
async fn sigterm_stops_within_the_shutdown_timeout_even_with_a_slow_call() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "shutdown").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let options = AppOptions { extra: vec![("shutdown-timeout-secs".into(), "1".into())], ..Default::default() };
    let mut router = RouterProcess::spawn(&db.url, &options, &prefix).await;
    let up = TestUpstream::start().await;
    let call = {
        let (addr, agent) = (router.address.clone(), agent.clone());
        let body = json!({"url": up.url("/slow/shutdown?ms=20000")});
        tokio::spawn(async move { route_at(&reqwest::Client::new(), &addr, &agent, &new_key(), &body).await })
    };
    wait_until("the slow call to reach the upstream", Duration::from_secs(10), async || up.hits.total() == 1).await;
    let signalled = Instant::now();
    router.signal("TERM");
    let status = router.wait_exit(Duration::from_secs(10)).await.expect("the router exited");
    assert!(status.success(), "{status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(4), "took {:?}", signalled.elapsed());
    call.abort();
}

#[actix_web::test]
async fn metrics_expose_request_durations_process_metrics_and_the_wallet_balance() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let scrape = || async { app.metrics_text().await };
    app.client.get(format!("{}/healthz", app.address)).send().await.unwrap();
    let text = scrape().await;
    assert!(
        text.contains(r#"x402_router_http_request_duration_seconds_bucket{route="/healthz",status="200",le="0.005"}"#),
        "{text}"
    );
    assert!(
        metric_value(&text, r#"x402_router_http_request_duration_seconds_count{route="/healthz",status="200"}"#)
            >= Some(1.0)
    );
    assert!(metric_value(&text, "process_resident_memory_bytes").is_some_and(|v| v > 0.0), "{text}");
    assert!(metric_value(&text, "process_cpu_seconds_total").is_some(), "{text}");
    let asset = format!(r#"asset="{}""#, chain.token);
    let gauge = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("x402_router_wallet_balance{") && l.contains(&asset) && l.contains("eip155:84532"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let mut seen = None;
    wait_until("the wallet balance gauge", Duration::from_secs(10), async || {
        seen = gauge(&scrape().await);
        seen.is_some()
    })
    .await;
    let expected: f64 = chain.balance(ROUTER_ADDRESS).await.to_string().parse().unwrap();
    assert_eq!(seen, Some(expected));
}

/// A payment intent row of `agent` with `status`, last written `age` ago.
async fn insert_payment(db: &TestDb, agent: uuid::Uuid, status: &str, age: &str) {
    Seed::new(agent, status).signed("{}", "x").ago(age).insert(db).await;
}

#[actix_web::test]
async fn ledger_gauges_count_paid_not_served_stuck_intents_and_budget_use() {
    let db = TestDb::new().await;
    let agent = create_agent(&db, "budgeted").await;
    let unlimited = create_agent(&db, "unlimited").await;
    let budgets = "daily_budget = 100000, month_budget = 40000, week_budget = 60000, lifetime_budget = 300000";
    exec(&db, &format!("UPDATE agents SET {budgets} WHERE id = '{}'", agent.id)).await;
    exec(&db, "UPDATE router_settings SET wallet_daily_cap = 80000").await;
    insert_payment(&db, agent.id, "settled", "1 minute").await; // paid, never served
    insert_payment(&db, agent.id, "signed", "1 hour").await; // stuck
    insert_payment(&db, agent.id, "signed", "1 second").await; // in progress
    insert_payment(&db, agent.id, "expired", "2 hours").await; // released
    insert_payment(&db, unlimited.id, "settled", "3 days").await; // older than the 24 h window

    let metrics = x402_router::metrics::Metrics::new().unwrap();
    let mut conn = db.conn().await;
    x402_router::audit::gauges::refresh(&mut conn, &metrics).await.unwrap();
    let text = metrics.render();
    assert_eq!(metric_value(&text, "x402_router_payments_paid_not_served "), Some(1.0), "{text}");
    assert_eq!(metric_value(&text, "x402_router_payments_stuck "), Some(1.0), "{text}");
    let ratio =
        |budget: &str| format!(r#"x402_router_agent_budget_used_ratio{{agent_id="{}",budget="{budget}"}}"#, agent.id);
    assert_eq!(metric_value(&text, &ratio("24h")), Some(0.3), "{text}");
    // This month (by signing time, which these rows take from their insertion): the same
    // three, out of 40000.
    assert_eq!(metric_value(&text, &ratio("month")), Some(0.75), "{text}");
    // The week and the lifetime count the same three (the expired one released its reservation).
    assert_eq!(metric_value(&text, &ratio("7d")), Some(0.5), "{text}");
    assert_eq!(metric_value(&text, &ratio("lifetime")), Some(0.1), "{text}");
    // The wallet: every agent's payments in the window (signed now), out of 80000.
    assert_eq!(metric_value(&text, r#"x402_router_agent_budget_used_ratio{agent_id="",budget="wallet"}"#), Some(0.5));
    assert!(!text.contains(&unlimited.id.to_string()), "agents without a budget have no gauge");
}

#[actix_web::test]
async fn redis_sentinel_failover_keeps_serving_and_the_cache_follows_the_new_master() {
    use crate::helpers::tls_services::{RedisSentinel, SENTINEL_MASTER};
    let mut sentinel = RedisSentinel::start().await;
    let options = AppOptions {
        redis_url: format!("redis://127.0.0.1:{}", sentinel.sentinel_port),
        extra: vec![("redis-sentinel-master".into(), SENTINEL_MASTER.into())],
        ..Default::default()
    };
    let app = spawn_app_with(options).await;
    let up = TestUpstream::start().await;
    let redis_ready = async || {
        let r: Value = app.client.get(format!("{}/readyz", app.address)).send().await.unwrap().json().await.unwrap();
        r["redis"] == "ok"
    };
    let from_redis = async || {
        let text = app.metrics_text().await;
        metric_value(&text, r#"x402_router_idempotency_outcomes_total{outcome="replay-redis"}"#).unwrap_or(0.0)
    };
    wait_until("the cache to reach the master through Sentinel", Duration::from_secs(10), redis_ready).await;

    let before = {
        let (key, body) = (new_key(), json!({"url": up.url("/ok/before-failover")}));
        assert_eq!(app.route(&key, &body).await.status(), 200);
        assert_eq!(app.route(&key, &body).await.headers()["x-idempotent-replay"], "true");
        (key, body)
    };
    assert_eq!(from_redis().await, 1.0, "the replay came from the master");

    // The master dies: calls keep being served (Postgres) while Sentinel fails over.
    sentinel.kill_master();
    let mut during = Vec::new();
    let replica = sentinel.replica_port;
    let deadline = Instant::now() + Duration::from_secs(30);
    while sentinel.current_master_port().await != Some(replica) {
        assert!(Instant::now() < deadline, "Sentinel did not fail over");
        let (key, body) = (new_key(), json!({"url": up.url(&format!("/ok/during-{}", during.len()))}));
        let started = Instant::now();
        assert_eq!(app.route(&key, &body).await.status(), 200);
        assert!(started.elapsed() < Duration::from_secs(5), "a call hung on Redis");
        during.push((key, body));
    }
    assert!(!during.is_empty() && sentinel.master_port != replica);

    // After the failover the cache reconnects to the new master by itself.
    wait_until("the cache to follow the new master", Duration::from_secs(15), redis_ready).await;
    let (key, body) = (new_key(), json!({"url": up.url("/ok/after-failover")}));
    assert_eq!(app.route(&key, &body).await.status(), 200);
    let hits_before = from_redis().await;
    assert_eq!(app.route(&key, &body).await.headers()["x-idempotent-replay"], "true");
    assert_eq!(from_redis().await, hits_before + 1.0, "the replay came from the new master");

    // Nothing ran twice.
    let executed = up.hits.total();
    for (key, body) in std::iter::once(&before).chain(&during) {
        assert_eq!(app.route(key, body).await.headers()["x-idempotent-replay"], "true");
    }
    assert_eq!(up.hits.total(), executed);
    assert_eq!(executed, 2 + during.len());
}
