//! The router under test: in-process ([`spawn_app`]) or as real processes ([`RouterProcess`]).

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use reqwest::Response;
use serde_json::Value;
use uuid::Uuid;
use x402_router::auth::{agents, generate_api_key, hash_api_key};
use x402_router::commands::{Cli, Command};
use x402_router::config::Config;
use x402_router::operators::Role;
use x402_router::startup::{Application, Hooks};

use super::db::TestDb;

/// anvil's account #1: a well-known dev key, never used for real money.
pub const ROUTER_KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";

pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Knobs of a test router.
#[derive(Clone)]
pub struct AppOptions {
    pub allow_private: bool,
    pub abandon_ms: u64,
    pub heartbeat_ms: u64,
    pub deadline_ms: u64,
    pub upstream_timeout_ms: u64,
    pub max_response_bytes: u64,
    pub request_max_bytes: u64,
    pub acquire_timeout_ms: u64,
    pub redis_url: String,
    pub database_url: Option<String>,
    pub hooks: Hooks,
    pub extra: Vec<(String, String)>,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            allow_private: true,
            abandon_ms: 60_000,
            heartbeat_ms: 10_000,
            deadline_ms: 50_000,
            upstream_timeout_ms: 30_000,
            max_response_bytes: 1_048_576,
            request_max_bytes: 262_144,
            acquire_timeout_ms: 1000,
            redis_url: redis_url(),
            database_url: None,
            hooks: Hooks::default(),
            extra: vec![],
        }
    }
}

/// An agent's credentials.
#[derive(Clone, Debug)]
pub struct Agent {
    pub id: Uuid,
    pub key: String,
}

pub struct TestApp {
    pub address: String,
    /// The `METRICS_ADDR` listener (`http://127.0.0.1:port`), when the options set one.
    pub metrics_address: Option<String>,
    /// A viewer operator token (created for every test app; for /metrics).
    pub viewer_token: String,
    pub db: Arc<TestDb>,
    pub agent: Agent,
    pub redis_prefix: String,
    pub client: reqwest::Client,
    pub options: AppOptions,
    handle: actix_web::dev::ServerHandle,
}

/// The `serve` arguments for a test router.
pub fn serve_args(opts: &AppOptions, db_url: &str, redis_prefix: &str, bind: &str) -> Vec<String> {
    let mut args: Vec<String> = vec!["x402-router".into(), "serve".into()];
    let mut push = |flag: &str, v: String| {
        args.push(format!("--{flag}"));
        args.push(v);
    };
    push("database-url", opts.database_url.clone().unwrap_or_else(|| db_url.to_owned()));
    push("database-acquire-timeout-ms", opts.acquire_timeout_ms.to_string());
    push("redis-url", opts.redis_url.clone());
    push("redis-key-prefix", redis_prefix.to_owned());
    push("bind", bind.to_owned());
    push("router-private-key", ROUTER_KEY.into());
    push("upstream-allow-private", opts.allow_private.to_string());
    push("idempotency-abandon-after-ms", opts.abandon_ms.to_string());
    push("idempotency-heartbeat-ms", opts.heartbeat_ms.to_string());
    push("route-deadline-ms", opts.deadline_ms.to_string());
    push("upstream-timeout-ms", opts.upstream_timeout_ms.to_string());
    push("upstream-max-response-bytes", opts.max_response_bytes.to_string());
    push("request-max-bytes", opts.request_max_bytes.to_string());
    push("workers", "2".into());
    push("no-migrate", "true".into());
    for (k, v) in &opts.extra {
        push(k, v.clone());
    }
    args
}

pub fn config_from(args: &[String]) -> Config {
    let cli = Cli::try_parse_from(args).expect("valid test arguments");
    let Command::Serve(serve) = cli.command else { panic!("not serve") };
    Config::from_args(&serve).expect("valid test config")
}

fn init_logs() {
    if std::env::var_os("TEST_LOG").is_some() {
        x402_router::telemetry::init(false);
    }
}

/// Creates an agent directly in the database.
pub async fn create_agent(db: &TestDb, name: &str) -> Agent {
    let mut conn = db.conn().await;
    let id = Uuid::new_v4();
    let key = generate_api_key().unwrap();
    agents::insert(&mut conn, id, name, &hash_api_key(&key), None, None).await.unwrap();
    Agent { id, key }
}

/// Creates an operator directly in the database: its id and token.
pub async fn create_operator(db: &TestDb, name: &str, role: Role) -> (Uuid, String) {
    let mut conn = db.conn().await;
    let id = Uuid::new_v4();
    let token = x402_router::operators::generate_token().unwrap();
    x402_router::operators::store::create(&mut conn, id, name, role, &x402_router::operators::hash_token(&token))
        .await
        .unwrap();
    (id, token)
}

/// A router in this process, on a fresh database, with one agent.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(AppOptions::default()).await
}

pub async fn spawn_app_with(options: AppOptions) -> TestApp {
    init_logs();
    let db = Arc::new(TestDb::new().await);
    spawn_app_on(db, options).await
}

/// Another router on an existing database (several routers, one ledger).
pub async fn spawn_app_on(db: Arc<TestDb>, options: AppOptions) -> TestApp {
    let agent = create_agent(&db, "test-agent").await;
    let redis_prefix = format!("test:{}:", Uuid::new_v4().simple());
    let mut config = config_from(&serve_args(&options, &db.url, &redis_prefix, "127.0.0.1:0"));
    // The same start-up checks as `serve` (chain ids, the assets' decimals).
    x402_router::startup::preflight(&mut config).await.expect("preflight");
    let app = Application::build(config, options.hooks.clone()).expect("build app");
    let address = format!("http://127.0.0.1:{}", app.port());
    let metrics_address = app.metrics_port().map(|p| format!("http://127.0.0.1:{p}"));
    let (_, viewer_token) = create_operator(&db, "test-viewer", Role::Viewer).await;
    let server = app.into_server();
    let handle = server.handle();
    tokio::spawn(server);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    TestApp { address, metrics_address, viewer_token, db, agent, redis_prefix, client, options, handle }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let h = self.handle.clone();
        drop(tokio::spawn(async move { h.stop(false).await }));
    }
}

/// A unique, valid Idempotency-Key.
pub fn new_key() -> String {
    format!("test-{}", Uuid::new_v4().simple())
}

impl TestApp {
    /// POST /route as this app's agent.
    pub async fn route(&self, key: &str, body: &Value) -> Response {
        self.route_as(&self.agent, key, body).await
    }

    pub async fn route_as(&self, agent: &Agent, key: &str, body: &Value) -> Response {
        route_at(&self.client, &self.address, agent, key, body).await
    }

    /// POST /route with a raw body and optional headers.
    pub async fn route_raw(&self, key: Option<&str>, body: Vec<u8>) -> Response {
        let mut req = self.client.post(format!("{}/route", self.address)).bearer_auth(&self.agent.key).body(body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        req.send().await.unwrap()
    }

    /// GET /metrics (as a viewer operator): the text.
    pub async fn metrics_text(&self) -> String {
        let resp = self.client.get(format!("{}/metrics", self.address)).bearer_auth(&self.viewer_token).send().await;
        let resp = resp.unwrap();
        assert_eq!(resp.status(), 200, "GET /metrics");
        resp.text().await.unwrap()
    }

    /// Removes the key's Redis entry, so that the next call is answered from Postgres.
    pub async fn forget_cached(&self, key: &str) {
        let mut r = redis::Client::open(self.options.redis_url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let k = format!("{}idem:{{{}}}:{}", self.redis_prefix, self.agent.id, key);
        let removed: i64 = redis::cmd("DEL").arg(k).query_async(&mut r).await.unwrap();
        assert_eq!(removed, 1, "the key's Redis entry exists (else the next call would not test Postgres)");
    }

    /// Rows in idempotency_keys (all agents).
    pub async fn idempotency_rows(&self) -> i64 {
        count(&self.db, "SELECT count(*) AS n FROM idempotency_keys").await
    }

    pub async fn receipt_rows(&self) -> i64 {
        count(&self.db, "SELECT count(*) AS n FROM receipts").await
    }
}

pub async fn route_at(client: &reqwest::Client, address: &str, agent: &Agent, key: &str, body: &Value) -> Response {
    client
        .post(format!("{address}/route"))
        .bearer_auth(&agent.key)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap()
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// GET `url` with a bearer token; the JSON body.
pub async fn get_json(client: &reqwest::Client, url: &str, bearer: &str) -> Value {
    client.get(url).bearer_auth(bearer).send().await.unwrap().json().await.unwrap()
}

/// Runs a `SELECT count(*) AS n …` on the test database.
pub async fn count(db: &TestDb, sql: &str) -> i64 {
    use diesel_async::RunQueryDsl;
    let mut conn = db.conn().await;
    let c: Count = diesel::sql_query(sql).get_result(&mut conn).await.unwrap();
    c.n
}

/// The router binary as a command, with none of the settings a developer's shell might
/// carry: every test passes what it needs itself.
pub fn router_command() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_x402-router"));
    for var in [
        "DATABASE_URL",
        "REDIS_URL",
        "ROUTER_PRIVATE_KEY",
        "ROUTER_PRIVATE_KEY_FILE",
        "X402_RPC_URLS",
        "X402_RPC_TIMEOUT_MS",
        "X402_ASSETS",
        "OPERATOR_TOKEN",
        "OPERATOR_AUTH_MAX_FAILURES",
        "OPERATOR_AUTH_WINDOW_MS",
        "OPERATOR_AUTH_MAX_ADDRESSES",
        "METRICS_ADDR",
        "RECONCILE_OLDER_THAN_SECS",
        "IDEMPOTENCY_ABANDON_AFTER_MS",
        "RUST_LOG",
        "REDIS_CLUSTER",
        "REDIS_SENTINEL_MASTER",
        "SHUTDOWN_TIMEOUT_SECS",
        "UPSTREAM_ALLOW_PRIVATE",
        "UPSTREAM_ALLOW_CIDRS",
        "RECOVER_LOST_ANSWERS",
        "RECONCILE_MAX_RECOVERIES",
        "RECONCILE_RECOVERY_SECS",
    ] {
        c.env_remove(var);
    }
    c
}

/// Waits (at most 10 s) until a statement on the test database waits for a lock.
pub async fn wait_for_lock_waiter(db: &TestDb) {
    let waiting = "SELECT count(*) AS n FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    x402_router_testkit::wait_until(
        std::time::Duration::from_secs(10),
        "a statement waiting for a lock",
        || async move { count(db, waiting).await > 0 },
    )
    .await
    .unwrap();
}

/// Runs one SQL statement on the test database.
pub async fn exec(db: &TestDb, sql: &str) -> usize {
    use diesel_async::RunQueryDsl;
    let mut conn = db.conn().await;
    diesel::sql_query(sql).execute(&mut conn).await.unwrap()
}

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    x402_router_testkit::free_port().expect("a free loopback port")
}

/// A router as a real child process (killed when dropped).
pub struct RouterProcess {
    pub address: String,
    child: tokio::process::Child,
}

impl RouterProcess {
    pub async fn spawn(db_url: &str, opts: &AppOptions, redis_prefix: &str) -> Self {
        let port = free_port();
        let bind = format!("127.0.0.1:{port}");
        let args = serve_args(opts, db_url, redis_prefix, &bind);
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_x402-router"));
        cmd.args(&args[1..]).env_remove("DATABASE_URL").env_remove("REDIS_URL").kill_on_drop(true).stdin(Stdio::null());
        if std::env::var_os("TEST_LOG").is_none() {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
        let child = cmd.spawn().expect("spawn x402-router");
        let address = format!("http://{bind}");
        let client = reqwest::Client::new();
        let (client, health) = (&client, format!("{address}/healthz"));
        x402_router_testkit::wait_until(Duration::from_secs(10), &format!("the router process on {bind}"), || {
            let health = health.clone();
            async move { client.get(health).send().await.is_ok() }
        })
        .await
        .unwrap();
        Self { address, child }
    }

    pub fn pid(&self) -> i32 {
        self.child.id().map(|p| p as i32).unwrap_or(0)
    }

    /// Waits for the process to exit by itself, at most `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(limit, self.child.wait()).await.ok().and_then(Result::ok)
    }

    /// SIGKILL, and wait for the process to be gone.
    pub async fn kill9(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// Sends a signal (e.g. "STOP", "CONT", "TERM") to the process.
    pub fn signal(&self, sig: &str) {
        let status =
            std::process::Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status().unwrap();
        assert!(status.success(), "kill -{sig} failed");
    }
}

/// The request fingerprint the router computes for this `/route` body.
pub fn request_hash(body: &Value) -> String {
    x402_router::relay::request::RouteCall::parse(body.to_string().as_bytes(), "/route", "").unwrap().request_hash
}

/// Leaves the row a router leaves when it claimed `key` for `body` `age_secs` ago and then
/// died (no heartbeat since).
pub async fn insert_in_flight(db: &TestDb, agent_id: Uuid, key: &str, body: &Value, age_secs: u32) {
    exec(
        db,
        &format!(
            "INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease, created_at) \
             VALUES ('{agent_id}', '{key}', '{}', 'in_flight', gen_random_uuid(), now() - interval '{age_secs} seconds')",
            request_hash(body)
        ),
    )
    .await;
}

/// Starts POST /route in the background; the result is the raw transport outcome, so a
/// test can see a router that was killed before answering.
pub fn spawn_route(
    client: &reqwest::Client,
    address: &str,
    agent: &Agent,
    key: &str,
    body: &Value,
) -> tokio::task::JoinHandle<reqwest::Result<Response>> {
    let request =
        client.post(format!("{address}/route")).bearer_auth(&agent.key).header("Idempotency-Key", key).json(body);
    tokio::spawn(request.send())
}

/// The keys that seal what the test routers keep: none is configured (no `SECRETS_KEY_FILE`),
/// so the one derived from [`ROUTER_KEY`].
pub fn test_keyring() -> x402_router::secrets::Keyring {
    let signer: alloy::signers::local::PrivateKeySigner = ROUTER_KEY.parse().unwrap();
    x402_router::secrets::Keyring::derived(&signer.credential().to_bytes()).unwrap()
}

/// The ledger row of the intent of `key` (any agent).
pub async fn payment_row(db: &TestDb, key: &str) -> x402_router::payments::store::PaymentRow {
    use diesel::prelude::*;
    use diesel_async::RunQueryDsl;
    use x402_router::db::schema::payments;
    use x402_router::payments::store::PaymentRow;
    let mut conn = db.conn().await;
    payments::table
        .filter(payments::idempotency_key.eq(key))
        .select(PaymentRow::as_select())
        .first(&mut conn)
        .await
        .unwrap()
}

/// The sealed parts of the intent of `key`, opened as the routers open them.
pub async fn opened_intent(db: &TestDb, key: &str) -> x402_router::payments::sealed::Opened {
    x402_router::secrets::intent::open(&test_keyring(), &payment_row(db, key).await)
}

/// Ends the server side of a crashed owner's open transaction, as the kernel closing its
/// socket does for a real kill -9 (the owner is frozen inside it; nobody else is running).
pub async fn end_crashed_transaction(db: &TestDb) {
    let open = "SELECT count(*) AS n FROM pg_stat_activity \
                WHERE datname = current_database() AND state = 'idle in transaction'";
    let mut deadline =
        x402_router_testkit::Deadline::after(Duration::from_secs(10), "the owner's recording transaction never showed")
            .every(Duration::from_millis(20));
    while count(db, open).await == 0 {
        deadline.next_poll().await.unwrap();
    }
    exec(
        db,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND state = 'idle in transaction'",
    )
    .await;
}
