//! The command line: agents, configuration errors, migrations.

use serde_json::Value;

use crate::helpers::*;

#[actix_web::test]
async fn agents_create_list_disable_round_trip() {
    let db = TestDb::new().await;
    let out = router_command()
        .args(["agents", "create", "--name", "bot", "--max-per-call", "50000"])
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "exactly one JSON line");
    let created: Value = serde_json::from_str(stdout.trim()).unwrap();
    let key = created["api_key"].as_str().unwrap();
    assert!(key.starts_with("x4r_") && key.len() > 40);
    let id = created["agent_id"].as_str().unwrap();
    let stored = count(
        &db,
        &format!("SELECT count(*) AS n FROM agents WHERE api_key_hash = '{}'", x402_router::auth::hash_api_key(key)),
    )
    .await;
    assert_eq!(stored, 1, "only the hash is stored");
    assert_eq!(count(&db, &format!("SELECT count(*) AS n FROM agents WHERE api_key_hash = '{key}'")).await, 0);

    let out = router_command().args(["agents", "list"]).env("DATABASE_URL", &db.url).output().unwrap();
    let listed = String::from_utf8(out.stdout).unwrap();
    assert!(listed.contains(id) && listed.contains("\"max_per_call\":\"50000\"") && !listed.contains(key));

    let out = router_command().args(["agents", "disable", id]).env("DATABASE_URL", &db.url).output().unwrap();
    assert!(out.status.success());
    assert_eq!(count(&db, "SELECT count(*) AS n FROM agents WHERE disabled").await, 1);

    let out = router_command()
        .args(["agents", "create", "--name", "bad", "--daily-budget", "-1"])
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn a_missing_or_bad_setting_stops_start_up_with_one_line_naming_it() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "DATABASE_URL"),
        (&[("DATABASE_URL", "mysql://x")], "DATABASE_URL"),
        (&[("DATABASE_URL", "postgres://x/y")], "REDIS_URL"),
        (&[("DATABASE_URL", "postgres://x/y"), ("REDIS_URL", "redis://x")], "ROUTER_PRIVATE_KEY"),
        (
            &[("DATABASE_URL", "postgres://x/y"), ("REDIS_URL", "redis://x"), ("ROUTER_PRIVATE_KEY", "0x1234")],
            "ROUTER_PRIVATE_KEY",
        ),
        (
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("REDIS_URL", "redis://x"),
                ("ROUTER_PRIVATE_KEY", ROUTER_KEY),
                ("BIND", "nope"),
            ],
            "BIND",
        ),
        (
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("REDIS_URL", "redis://x"),
                ("ROUTER_PRIVATE_KEY", ROUTER_KEY),
                ("X402_RPC_URLS", "eip155:84532"),
            ],
            "X402_RPC_URLS",
        ),
        (
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("REDIS_URL", "redis://x"),
                ("ROUTER_PRIVATE_KEY", ROUTER_KEY),
                ("X402_ASSETS", "eip155:84532=0x12"),
            ],
            "X402_ASSETS",
        ),
        (
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("REDIS_URL", "redis://x"),
                ("ROUTER_PRIVATE_KEY", ROUTER_KEY),
                ("UPSTREAM_ALLOW_PRIVATE", "maybe"),
            ],
            "UPSTREAM_ALLOW_PRIVATE",
        ),
        (
            &[
                ("DATABASE_URL", "postgres://x/y"),
                ("REDIS_URL", "redis://x"),
                ("ROUTER_PRIVATE_KEY", ROUTER_KEY),
                ("IDEMPOTENCY_HEARTBEAT_MS", "40000"),
            ],
            "IDEMPOTENCY_HEARTBEAT_MS",
        ),
    ];
    for (env, named) in cases {
        let mut cmd = router_command();
        cmd.arg("serve");
        for (k, v) in *env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{named}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(named), "{named} not named in {stderr:?}");
        assert!(!stderr.contains(ROUTER_KEY.trim_start_matches("0x")), "the key must never be printed");
    }
}

#[test]
fn every_subcommand_has_help() {
    for sub in [
        &["serve"][..],
        &["migrate"],
        &["gc"],
        &["agents"],
        &["agents", "create"],
        &["operators"],
        &["operators", "create"],
        &["wallet", "approve-permit2"],
    ] {
        let out = router_command().args(sub).arg("--help").output().unwrap();
        assert!(out.status.success(), "{sub:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
    }
}

#[actix_web::test]
async fn migrations_go_up_down_and_up_again() {
    let db = TestDb::new().await;
    let reverted = x402_router::db::revert_all_migrations(&db.url).await.unwrap();
    assert!(reverted >= 1);
    // `migrate` with its standard error not a terminal: one progress line per migration.
    let out = router_command().arg("migrate").env("DATABASE_URL", &db.url).env("RUST_LOG", "info").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let applied: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(applied["applied"].as_array().unwrap().len(), reverted);
    assert_steps(&progress_lines(&stderr, "migrate"), "migrations", &vec![1; reverted]);
    assert!(x402_router::db::run_migrations(&db.url).await.unwrap().is_empty());
}

/// The progress lines of `task` on a command's standard error (`telemetry::progress`), each
/// as its fields (`step`, `done`, `total`, `unit`, `rate_per_s`, `elapsed_ms`, `eta_s`).
pub fn progress_lines(stderr: &str, task: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let task = format!("task=\"{task}\"");
    stderr
        .lines()
        .filter(|l| l.contains(" progress ") && l.split_whitespace().any(|w| w == task))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
                .collect()
        })
        .collect()
}

/// `lines` are one per step, of `items[i]` more items each, counting `unit`s out of their sum,
/// with a rate, the time elapsed and the time left.
pub fn assert_steps(lines: &[std::collections::BTreeMap<String, String>], unit: &str, items: &[u64]) {
    assert_eq!(lines.len(), items.len(), "one line per step: {lines:?}");
    let total: u64 = items.iter().sum();
    let mut done = 0;
    for (i, (line, n)) in lines.iter().zip(items).enumerate() {
        done += n;
        let num = |k: &str| line.get(k).and_then(|v| v.parse::<u64>().ok());
        assert_eq!(num("step"), Some(i as u64 + 1), "{line:?}");
        assert_eq!(num("done"), Some(done), "{line:?}");
        assert_eq!(num("total"), Some(total), "{line:?}");
        assert_eq!(line.get("unit").map(String::as_str), Some(unit), "{line:?}");
        assert!(num("rate_per_s").is_some_and(|r| r > 0), "{line:?}");
        assert!(num("elapsed_ms").is_some(), "{line:?}");
        let eta = num("eta_s");
        assert!(eta.is_some(), "{line:?}");
        if done == total {
            assert_eq!(eta, Some(0), "{line:?}");
        }
    }
}
