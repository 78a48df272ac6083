//! The chaos harness behind `scripts/chaos` (RELIABILITY.md): 3 router processes, a private
//! Postgres and Redis, anvil with the project's token and the project's x402 test upstream,
//! every connection of the routers going through a fault-injecting proxy. Client tasks drive
//! a few hundred logical operations to a final answer against random routers while a
//! seeded injector kills, freezes, flushes, restarts, garbage-collects, drops and stalls.
//! At the end the money invariants are checked from the chain's logs and the ledger.
//! Some of the load pays the official x402 batch-settlement server (interop/) with vouchers
//! over payment channels; it claims and settles at the end, and the channels are checked too
//! (`batch`).
//!
//! Bounded: it stops by itself (`--max-seconds`) and stops every process it started.

#![allow(clippy::print_stdout)]

mod batch;
mod procs;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use procs::{Chain, Postgres, Redis, Router};
use x402_router_testkit::Proxy;
use x402_router_testkit::invariants;
use x402_router_testkit::wait::{Deadline, let_time_pass, wait_for_every, wait_until};

#[derive(Parser, Debug)]
#[command(about = "Chaos run: faults injected into 3 routers under load; invariants checked on-chain")]
struct Args {
    /// ≥ 50 injections, about 1–2 minutes.
    #[arg(long)]
    quick: bool,
    /// The seed of every random choice (printed; pass it again to replay a run's choices).
    #[arg(long)]
    seed: Option<u64>,
    /// Injections to make (default: 60 quick, 1000 full).
    #[arg(long)]
    injections: Option<u64>,
    /// Pause between injections, in ms (default: 900 quick, 800 full).
    #[arg(long)]
    interval_ms: Option<u64>,
    /// Hard limit of the whole run, in seconds (default: 150 quick, 1200 full).
    #[arg(long)]
    max_seconds: Option<u64>,
    /// Concurrent client tasks.
    #[arg(long, default_value_t = 10)]
    clients: usize,
    /// Recovery of lost paid answers (`RECOVER_LOST_ANSWERS` of the routers, and whether
    /// `reconcile` is given the key it needs to recover): `--recovery false` measures the
    /// paid-not-served share without it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    recovery: bool,
    #[arg(long)]
    router_bin: PathBuf,
    #[arg(long)]
    upstream_bin: PathBuf,
    #[arg(long)]
    anvil: String,
    /// Directory of the Postgres server binaries (initdb, pg_ctl).
    #[arg(long)]
    pg_bin: PathBuf,
    #[arg(long, default_value = "redis-server")]
    redis_server: String,
    /// interop/ with its node_modules (the official batch-settlement server and facilitator).
    #[arg(long)]
    interop_dir: PathBuf,
    /// Where to write the JSON results.
    #[arg(long)]
    out: PathBuf,
    /// Scratch directory (data, logs); created, and removed after a clean run.
    #[arg(long)]
    run_dir: PathBuf,
}

/// splitmix64: small, seeded, reproducible.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// What an operation asks of the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    PaidGet,
    PaidPost,
    FreeGet,
    FreePost,
    /// Settles, then takes a second to answer.
    SlowSettle,
    /// Settles, then fails with 500.
    SettleThen500,
    /// Settles, then drops the connection.
    SettleThenDrop,
    /// Keeps the authorization, answers "payment failed", settles later (`/_settle_kept`).
    RejectThenSettle,
    /// Advertises payment-identifier and keeps answers by id (recovery-capable); settles,
    /// then handles for a second, so that faults land while the handler runs.
    PidGet,
    /// The official batch-settlement server's GET /v2/batch: a voucher on a payment channel.
    Batch,
}

impl Kind {
    fn pick(rng: &mut Rng) -> Self {
        match rng.below(100) {
            0..17 => Self::PaidGet,
            17..29 => Self::Batch,
            29..37 => Self::PaidPost,
            37..52 => Self::FreeGet,
            52..64 => Self::FreePost,
            64..79 => Self::PidGet,
            79..86 => Self::SlowSettle,
            86..91 => Self::SettleThen500,
            91..96 => Self::SettleThenDrop,
            _ => Self::RejectThenSettle,
        }
    }
    fn is_free(self) -> bool {
        matches!(self, Self::FreeGet | Self::FreePost)
    }
    /// The route class of the paid-not-served figures: can the router get a lost answer back?
    fn class(self) -> &'static str {
        match self {
            Self::PidGet => "payment_identifier",
            Self::Batch => "batch_settlement",
            _ => "plain",
        }
    }
}

struct Op {
    id: u64,
    kind: Kind,
    agent: usize,
    key: String,
    body: Value,
    /// After its answer, the key is garbage-collected (expiry forced into the past) and the
    /// same request sent again under it.
    reuse_after_gc: bool,
}

impl Op {
    fn generate(seed: u64, id: u64, (upstream, batch_server): (&str, &str), agents: usize) -> Self {
        let mut rng = Rng::new(seed ^ id.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let kind = Kind::pick(&mut rng);
        let url = |path: &str| format!("{upstream}{path}");
        let body = match kind {
            Kind::PaidGet => json!({"url": url("/v2/weather"), "max_amount": "10000"}),
            Kind::PaidPost => json!({
                "method": "POST", "url": url("/v2/echo"), "max_amount": "20000",
                "body": {"op": id, "text": "chaos", "n": rng.below(1000)}
            }),
            Kind::FreeGet => json!({"url": url(&format!("/free?op={id}"))}),
            Kind::FreePost => json!({
                "method": "POST", "url": url(&format!("/free?op={id}")), "body": {"op": id, "n": rng.below(1000)}
            }),
            Kind::SlowSettle => json!({"url": url("/v2/slow-settle?seconds=1"), "max_amount": "10000"}),
            Kind::SettleThen500 => json!({"url": url("/v2/settle-then-500"), "max_amount": "10000"}),
            Kind::SettleThenDrop => json!({"url": url("/v2/settle-then-drop"), "max_amount": "10000"}),
            Kind::RejectThenSettle => json!({"url": url("/v2/keep-reject"), "max_amount": "10000"}),
            Kind::PidGet => json!({"url": url(&format!("/v2/pid?seconds=1&op={id}")), "max_amount": "10000"}),
            Kind::Batch => json!({"url": format!("{batch_server}/v2/batch"), "max_amount": batch::PRICE}),
        };
        let agent = usize::try_from(rng.below(agents as u64)).unwrap_or(0);
        let reuse_after_gc = rng.percent(6);
        Self { id, kind, agent, key: format!("chaos-{seed:x}-{id}"), body, reuse_after_gc }
    }
}

#[derive(Default, Serialize)]
struct OpResult {
    id: u64,
    agent: usize,
    kind: Option<Kind>,
    lifetimes: u64,
    /// Takeovers recorded on the key's rows that garbage collection removed.
    gc_takeovers: u64,
    finals: Vec<u16>,
    codes: Vec<Option<String>>,
    /// `payment.recovery` of each final answer (`recovered`, `lost`, …), if any.
    recoveries: Vec<Option<String>>,
    requests: u64,
    duplicates: u64,
    finished: bool,
    violations: Vec<String>,
}

/// One answer of a router.
enum Answer {
    Final(u16, Vec<u8>),
    Retry(Duration),
}

struct Ctx {
    routers: Vec<String>,
    agents: Vec<(String, String)>,
    client: reqwest::Client,
    direct_db: String,
    /// The private Redis, not through its proxy.
    redis_url: String,
    router_bin: PathBuf,
    stop_new: AtomicBool,
    requests: AtomicU64,
    /// Keys whose operations are over (no request will be sent again): garbage collection
    /// may take them.
    finished_keys: Mutex<Vec<String>>,
    /// Takeovers of rows garbage collection removed, by key.
    gc_takeovers: Mutex<BTreeMap<String, u64>>,
    gc_violations: Mutex<Vec<String>>,
    op_deadline: Duration,
}

impl Ctx {
    async fn send(&self, router: &str, op: &Op) -> Answer {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let (_, api_key) = &self.agents[op.agent];
        let sent = self
            .client
            .post(format!("{router}/route"))
            .bearer_auth(api_key)
            .header("Idempotency-Key", &op.key)
            .json(&op.body)
            .send()
            .await;
        let Ok(resp) = sent else { return Answer::Retry(Duration::from_millis(200)) };
        let status = resp.status().as_u16();
        let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let Ok(bytes) = resp.bytes().await else { return Answer::Retry(Duration::from_millis(200)) };
        let code = code_of(&bytes);
        let in_flight = matches!(code.as_deref(), Some("idempotency_key_in_flight" | "superseded"));
        // 408: the HTTP server timed out reading the request (a router frozen mid-read);
        // nothing was claimed or executed.
        if status == 503 || status == 408 || (status == 409 && in_flight) {
            // Honour Retry-After (bounded: the router's own values are a few seconds).
            return Answer::Retry(Duration::from_secs(retry_after.unwrap_or(1).min(5)));
        }
        Answer::Final(status, bytes.to_vec())
    }

    /// Retries until a final answer, against random routers, sometimes with concurrent
    /// duplicates.
    async fn to_final(&self, op: &Op, rng: &mut Rng, res: &mut OpResult) -> Option<(u16, Vec<u8>)> {
        let deadline = Instant::now() + self.op_deadline;
        while Instant::now() < deadline {
            let copies = if rng.percent(12) { 2 + rng.below(2) } else { 1 };
            if copies > 1 {
                res.duplicates += 1;
            }
            let sends = (0..copies).map(|_| {
                let router = &self.routers[usize::try_from(rng.below(self.routers.len() as u64)).unwrap_or(0)];
                self.send(router, op)
            });
            let answers = futures_util::future::join_all(sends).await;
            res.requests += copies;
            let mut finals = answers.iter().filter_map(|a| match a {
                Answer::Final(s, b) => Some((*s, b.clone())),
                Answer::Retry(_) => None,
            });
            if let Some(first) = finals.next() {
                for other in finals {
                    if other != first {
                        res.violations.push(format!(
                            "op {} ({:?}): concurrent duplicates got different final answers: {} {} vs {} {}",
                            op.id,
                            op.kind,
                            first.0,
                            excerpt(&first.1),
                            other.0,
                            excerpt(&other.1)
                        ));
                    }
                }
                return Some(first);
            }
            let wait = answers
                .iter()
                .map(|a| match a {
                    Answer::Retry(d) => *d,
                    Answer::Final(..) => Duration::ZERO,
                })
                .max()
                .unwrap_or_default();
            // lets time pass: the routers' Retry-After before the operation is sent again.
            let_time_pass(wait).await;
        }
        None
    }

    /// One lifetime of a key: the final answer, then a replay from a random router that must
    /// be the same bytes.
    async fn lifetime(&self, op: &Op, rng: &mut Rng, res: &mut OpResult) -> bool {
        let Some((status, body)) = self.to_final(op, rng, res).await else { return false };
        if status == 409 && code_of(&body).as_deref() == Some("idempotency_key_reused") {
            res.violations.push(format!("op {}: the same request was refused as a different one", op.id));
        }
        res.finals.push(status);
        res.codes.push(code_of(&body));
        res.recoveries.push(recovery_of(&body));
        let Some(again) = self.to_final(op, rng, res).await else { return false };
        if again != (status, body.clone()) {
            res.violations.push(format!(
                "op {} ({:?}): a replay differs from the key's final answer: {status} {} vs {} {}",
                op.id,
                op.kind,
                excerpt(&body),
                again.0,
                excerpt(&again.1)
            ));
        }
        true
    }

    async fn run(&self, op: &Op, seed: u64) -> OpResult {
        let mut rng = Rng::new(seed ^ op.id.wrapping_mul(0x9E37_79B9) ^ 0xC4A0);
        let mut res = OpResult { id: op.id, agent: op.agent, kind: Some(op.kind), lifetimes: 1, ..Default::default() };
        if !self.lifetime(op, &mut rng, &mut res).await {
            return res;
        }
        if op.reuse_after_gc {
            match self.collect_key(op).await {
                Ok(takeovers) => {
                    res.gc_takeovers += takeovers;
                    res.lifetimes += 1;
                    if !self.lifetime(op, &mut rng, &mut res).await {
                        return res;
                    }
                }
                Err(e) => res.violations.push(format!("op {}: could not garbage-collect its key: {e:#}", op.id)),
            }
        }
        res.finished = true;
        self.finished_keys.lock().await.push(op.key.clone());
        res
    }

    /// Forces this key's expiry into the past and runs the real `gc` until its row is gone;
    /// returns the takeovers its row had recorded. Then the key's cache entry expires too,
    /// as it does in real time (the router writes it to expire with its row, and never
    /// caches an expired row): the harness compresses 24 h into a moment, so it waits out
    /// any late cache write of the old answer (a router frozen between its commit and its
    /// Redis write, a stalled Redis connection) and deletes the entry.
    async fn collect_key(&self, op: &Op) -> anyhow::Result<u64> {
        let key = op.key.as_str();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut takeovers = 0;
        let mut collecting = Deadline::after(Duration::from_secs(60), key).every(Duration::from_millis(300));
        loop {
            let attempt = async {
                let db = connect(&self.direct_db).await?;
                let rows = db
                    .query(
                        "UPDATE idempotency_keys SET expires_at = now() - interval '1 day' \
                         WHERE key = $1 AND status <> 'in_flight' RETURNING takeovers",
                        &[&key],
                    )
                    .await?;
                for r in &rows {
                    takeovers = takeovers.max(u64::try_from(r.get::<_, i32>(0)).unwrap_or(0));
                }
                run_gc(&self.router_bin, &self.direct_db).await?;
                let left: i64 =
                    db.query_one("SELECT count(*) FROM idempotency_keys WHERE key = $1", &[&key]).await?.get(0);
                Ok::<_, anyhow::Error>(left == 0)
            };
            if matches!(attempt.await, Ok(true)) {
                break;
            }
            anyhow::ensure!(collecting.next_poll().await.is_ok(), "the row of {key} was never collected");
        }
        // lets time pass: a router frozen between its commit and its Redis write, or behind a
        // stalled connection, may still write the old answer; nothing signals that it won't.
        let_time_pass(LATE_CACHE_WRITES).await;
        let rkey = format!("chaos:idem:{{{}}}:{key}", self.agents[op.agent].0);
        // Redis may be restarting (an injected fault): try until the deadline.
        let limit = (deadline + LATE_CACHE_WRITES).saturating_duration_since(Instant::now());
        let mut deleting = Deadline::after(limit, &rkey).every(Duration::from_millis(300));
        loop {
            let deleted = async {
                let client = redis::Client::open(self.redis_url.as_str())?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("DEL").arg(&rkey).query_async::<()>(&mut conn).await
            };
            match deleted.await {
                Ok(()) => return Ok(takeovers),
                Err(e) if deleting.next_poll().await.is_err() => return Err(e.into()),
                Err(_) => {}
            }
        }
    }
}

/// Longest a router can still write an answer to Redis after its commit, in this run: frozen
/// (abandonment + 2.5 s) and then behind a stalled connection (3 s).
const LATE_CACHE_WRITES: Duration = Duration::from_secs(10);

fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(400)]).into_owned()
}

fn recovery_of(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v["payment"]["recovery"].as_str().map(str::to_owned)
}

fn code_of(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(body).ok().and_then(|v| v["code"].as_str().map(str::to_owned))
}

async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) =
        tokio::time::timeout(Duration::from_secs(5), tokio_postgres::connect(url, tokio_postgres::NoTls)).await??;
    tokio::spawn(conn);
    Ok(client)
}

async fn run_gc(router_bin: &std::path::Path, db: &str) -> anyhow::Result<()> {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(router_bin).arg("gc").env_clear().env("DATABASE_URL", db).output(),
    )
    .await??;
    anyhow::ensure!(out.status.success(), "gc: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

async fn cli_json(
    router_bin: &std::path::Path,
    db: &str,
    args: &[&str],
    env: &[(&str, String)],
) -> anyhow::Result<Value> {
    let mut cmd = tokio::process::Command::new(router_bin);
    cmd.args(args).env_clear().env("DATABASE_URL", db);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await??;
    let line = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "{args:?}: {}{line}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_str(line.lines().last().unwrap_or_default())?)
}

/// The kinds of injected faults.
const FAULTS: &[(&str, u64)] = &[
    ("kill9_router", 14),
    ("sigstop_router", 9),
    ("redis_flushall", 7),
    ("redis_restart", 5),
    ("postgres_restart_fast", 4),
    ("postgres_restart_immediate", 4),
    ("gc_expiry_in_past", 8),
    ("drop_postgres", 6),
    ("drop_redis", 5),
    ("drop_rpc", 6),
    ("drop_upstream", 6),
    ("stall_postgres", 5),
    ("stall_redis", 4),
    ("stall_rpc", 5),
    ("stall_upstream", 5),
    ("upstream_settles_kept", 4),
];

struct World {
    pg: Postgres,
    redis: Mutex<Redis>,
    routers: Vec<Mutex<Router>>,
    pg_proxy: Proxy,
    redis_proxy: Proxy,
    rpc_proxy: Proxy,
    upstream_proxy: Proxy,
    /// In front of the official batch-settlement server: upstream faults hit it too.
    batch_proxy: Proxy,
    upstream_direct: String,
    pg_busy: AtomicBool,
    abandon: Duration,
}

impl World {
    async fn inject(self: &Arc<Self>, kind: &str, rng: &mut Rng, ctx: &Arc<Ctx>) -> anyhow::Result<()> {
        let pick = |rng: &mut Rng| usize::try_from(rng.below(self.routers.len() as u64)).unwrap_or(0);
        match kind {
            "kill9_router" => {
                let i = pick(rng);
                let world = Arc::clone(self);
                tokio::spawn(async move {
                    let mut r = world.routers[i].lock().await;
                    if let Err(e) = r.kill_and_restart().await {
                        eprintln!("chaos: router {i} did not restart: {e:#}");
                    }
                });
            }
            "sigstop_router" => {
                let i = pick(rng);
                // Past the abandonment window: others take its keys over while it sleeps.
                let frozen = self.abandon + Duration::from_millis(500 + rng.below(2000));
                let world = Arc::clone(self);
                tokio::spawn(async move {
                    world.routers[i].lock().await.signal("STOP");
                    // lets time pass: the fault is a router frozen for this long.
                    let_time_pass(frozen).await;
                    world.routers[i].lock().await.signal("CONT");
                });
            }
            "redis_flushall" => {
                let _ = self.redis.lock().await.flushall().await;
            }
            "redis_restart" => self.redis.lock().await.restart().await?,
            "postgres_restart_fast" | "postgres_restart_immediate" => {
                if self.pg_busy.swap(true, Ordering::SeqCst) {
                    return Ok(());
                }
                let mode = if kind.ends_with("fast") { "fast" } else { "immediate" };
                let world = Arc::clone(self);
                tokio::spawn(async move {
                    if let Err(e) = world.pg.restart(mode).await {
                        eprintln!("chaos: postgres restart: {e:#}");
                    }
                    world.pg_busy.store(false, Ordering::SeqCst);
                });
            }
            "gc_expiry_in_past" => {
                let ctx = Arc::clone(ctx);
                let keys: Vec<String> = ctx.finished_keys.lock().await.drain(..).collect();
                let probe = format!("chaos-gc-probe-{}", rng.next());
                tokio::spawn(async move {
                    if let Err(e) = gc_round(&ctx, &keys, &probe).await {
                        eprintln!("chaos: gc: {e:#}");
                        // Not collected now: a later GC may still take them.
                        ctx.finished_keys.lock().await.extend(keys);
                    }
                });
            }
            "drop_postgres" => self.pg_proxy.drop_all(),
            "drop_redis" => self.redis_proxy.drop_all(),
            "drop_rpc" => self.rpc_proxy.drop_all(),
            "drop_upstream" => {
                self.upstream_proxy.drop_all();
                self.batch_proxy.drop_all();
            }
            "stall_postgres" | "stall_redis" | "stall_rpc" | "stall_upstream" => {
                let d = Duration::from_millis(500 + rng.below(2500));
                match kind {
                    "stall_postgres" => self.pg_proxy.stall(d),
                    "stall_redis" => self.redis_proxy.stall(d),
                    "stall_rpc" => self.rpc_proxy.stall(d),
                    _ => {
                        self.upstream_proxy.stall(d);
                        self.batch_proxy.stall(d);
                    }
                }
            }
            "upstream_settles_kept" => settle_kept(&ctx.client, &self.upstream_direct).await?,
            other => anyhow::bail!("unknown fault {other}"),
        }
        Ok(())
    }

    /// Everything back to normal: routers running, no stall.
    async fn heal(&self) {
        for r in &self.routers {
            let mut r = r.lock().await;
            if r.stopped {
                r.signal("CONT");
            }
        }
        for p in [&self.pg_proxy, &self.redis_proxy, &self.rpc_proxy, &self.upstream_proxy, &self.batch_proxy] {
            p.clear();
        }
    }
}

/// One GC injection: the expiry of finished operations' keys forced into the past, plus an
/// in-flight probe row (of no operation) whose expiry is past too; the real `gc` runs
/// (concurrently with the load) and must delete the former and keep the probe.
async fn gc_round(ctx: &Ctx, keys: &[String], probe: &str) -> anyhow::Result<()> {
    let db = connect(&ctx.direct_db).await?;
    let agent = ctx.agents[0].0.as_str();
    db.execute(
        "INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease, created_at, expires_at) \
         VALUES (($1::text)::uuid, $2, 'gc-probe', 'in_flight', gen_random_uuid(), now(), now() - interval '1 day')",
        &[&agent, &probe],
    )
    .await?;
    let rows = db
        .query(
            "UPDATE idempotency_keys SET expires_at = now() - interval '1 day' \
             WHERE key = ANY($1) AND status <> 'in_flight' RETURNING key, takeovers",
            &[&keys],
        )
        .await?;
    {
        let mut gone = ctx.gc_takeovers.lock().await;
        for r in &rows {
            let t = u64::try_from(r.get::<_, i32>(1)).unwrap_or(0);
            let e = gone.entry(r.get::<_, String>(0)).or_default();
            *e = (*e).max(t);
        }
    }
    let ran = run_gc(&ctx.router_bin, &ctx.direct_db).await;
    let kept: i64 = db.query_one("SELECT count(*) FROM idempotency_keys WHERE key = $1", &[&probe]).await?.get(0);
    db.execute("DELETE FROM idempotency_keys WHERE key = $1", &[&probe]).await?;
    if kept != 1 {
        ctx.gc_violations.lock().await.push(format!("GC deleted an in-flight row ({probe})"));
    }
    ran
}

async fn settle_kept(client: &reqwest::Client, upstream: &str) -> anyhow::Result<()> {
    client.post(format!("{upstream}/_settle_kept")).send().await?.error_for_status()?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id())
    });
    let mode = if args.quick { "quick" } else { "full" };
    let target = args.injections.unwrap_or(if args.quick { 60 } else { 1000 });
    let interval = Duration::from_millis(args.interval_ms.unwrap_or(if args.quick { 900 } else { 800 }));
    let limit = Duration::from_secs(args.max_seconds.unwrap_or(if args.quick { 150 } else { 1200 }));
    println!("chaos: mode {mode}, seed {seed} (replay the choices with --seed {seed}), {target} injections");
    std::fs::create_dir_all(&args.run_dir)?;
    let run_dir = std::fs::canonicalize(&args.run_dir)?;
    let started = Instant::now();
    let run = tokio::time::timeout(limit, chaos(&args, seed, target, interval, &run_dir, started, mode));
    let outcome = match run.await {
        Ok(r) => r,
        Err(_) => Err(anyhow::anyhow!("the run did not finish within {limit:?}")),
    };
    match outcome {
        Ok(0) => {
            let _ = std::fs::remove_dir_all(&run_dir);
            Ok(std::process::ExitCode::SUCCESS)
        }
        // Returning (not `process::exit`) lets the runtime drop every task, and with them
        // the processes this run started (Postgres is stopped by its `Drop`).
        Ok(violations) => {
            eprintln!("chaos: {violations} violations; logs kept in {}", run_dir.display());
            Ok(std::process::ExitCode::from(1))
        }
        Err(e) => {
            eprintln!("chaos: {e:#}; logs kept in {}", run_dir.display());
            Ok(std::process::ExitCode::from(2))
        }
    }
}

/// The run; returns the number of violations. Every process is owned by a value dropped
/// (killed) on return.
async fn chaos(
    args: &Args,
    seed: u64,
    target: u64,
    interval: Duration,
    run_dir: &std::path::Path,
    started: Instant,
    mode: &str,
) -> anyhow::Result<usize> {
    let pg = Postgres::start(&args.pg_bin, run_dir).await.context("postgres")?;
    let redis = Redis::start(&args.redis_server).await.context("redis")?;
    let chain = Chain::start(&args.anvil, &args.upstream_bin, &run_dir.join("upstream.log")).await.context("chain")?;
    let direct_db = pg.url("postgres");
    let pg_proxy = Proxy::start(format!("127.0.0.1:{}", pg.port)).await?;
    let redis_proxy = Proxy::start(format!("127.0.0.1:{}", redis.port)).await?;
    let rpc_proxy = Proxy::start(format!("127.0.0.1:{}", chain.rpc_port)).await?;
    let upstream_proxy = Proxy::start(format!("127.0.0.1:{}", chain.upstream_port)).await?;
    let official = batch::Official::start(&args.interop_dir, &chain.rpc_url(), &chain.token, run_dir)
        .await
        .context("the official batch-settlement server")?;
    let batch_proxy = Proxy::start(format!("127.0.0.1:{}", official.port)).await?;

    cli_json(&args.router_bin, &direct_db, &["migrate"], &[]).await?;
    // Two agents: one with room, one whose budget runs out during the run.
    let mut agents = Vec::new();
    for (name, budget) in [("chaos-rich", "1000000000000"), ("chaos-capped", "1500000")] {
        let a = cli_json(
            &args.router_bin,
            &direct_db,
            &["agents", "create", "--name", name, "--max-per-call", "20000", "--daily-budget", budget],
            &[],
        )
        .await?;
        let id = a["agent_id"].as_str().context("agent_id")?.to_owned();
        let key = a["api_key"].as_str().context("api_key")?.to_owned();
        agents.push((id, key));
    }

    let abandon = Duration::from_millis(2000);
    let router_args = || -> Vec<String> {
        [
            ("database-url", format!("postgres://postgres@127.0.0.1:{}/postgres", pg_proxy.port)),
            ("database-acquire-timeout-ms", "1000".into()),
            ("db-lock-timeout-ms", "2000".into()),
            ("redis-url", format!("redis://127.0.0.1:{}", redis_proxy.port)),
            ("redis-key-prefix", "chaos:".into()),
            ("router-private-key", procs::ROUTER_KEY.into()),
            ("upstream-allow-private", "true".into()),
            ("idempotency-abandon-after-ms", abandon.as_millis().to_string()),
            ("idempotency-heartbeat-ms", "400".into()),
            ("route-deadline-ms", "8000".into()),
            ("upstream-timeout-ms", "5000".into()),
            ("x402-rpc-urls", format!("eip155:{}=http://127.0.0.1:{}", procs::CHAIN_ID, rpc_proxy.port)),
            ("x402-rpc-timeout-ms", "2000".into()),
            ("x402-assets", format!("eip155:{}={}@6", procs::CHAIN_ID, chain.token)),
            ("workers", "2".into()),
            ("recover-lost-answers", args.recovery.to_string()),
            ("x402-schemes", "batch-settlement".into()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [format!("--{k}"), v])
        .collect()
    };
    let mut routers = Vec::new();
    for i in 0..3 {
        let log = run_dir.join(format!("router{i}.log"));
        routers.push(Mutex::new(Router::start(&args.router_bin, router_args(), log).await?));
    }
    let mut addresses = Vec::new();
    for r in &routers {
        addresses.push(r.lock().await.address());
    }
    let upstream_via_proxy = format!("http://127.0.0.1:{}", upstream_proxy.port);
    let upstream_direct = format!("http://127.0.0.1:{}", chain.upstream_port);
    let world = Arc::new(World {
        pg,
        redis: Mutex::new(redis),
        routers,
        pg_proxy,
        redis_proxy,
        rpc_proxy,
        upstream_proxy,
        batch_proxy,
        upstream_direct: upstream_direct.clone(),
        pg_busy: AtomicBool::new(false),
        abandon,
    });
    let ctx = Arc::new(Ctx {
        routers: addresses,
        agents: agents.clone(),
        client: reqwest::Client::builder().timeout(Duration::from_secs(15)).build()?,
        direct_db: direct_db.clone(),
        redis_url: world.redis.lock().await.url(),
        router_bin: args.router_bin.clone(),
        stop_new: AtomicBool::new(false),
        requests: AtomicU64::new(0),
        finished_keys: Mutex::default(),
        gc_takeovers: Mutex::default(),
        gc_violations: Mutex::default(),
        op_deadline: Duration::from_secs(90),
    });
    println!("chaos: set up in {:.1} s; load and faults start", started.elapsed().as_secs_f64());

    // Clients: operations one after another until the injector has made its injections.
    let next_op = Arc::new(AtomicU64::new(0));
    let results: Arc<Mutex<Vec<OpResult>>> = Arc::default();
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        let (ctx, next_op, results, upstream) =
            (Arc::clone(&ctx), Arc::clone(&next_op), Arc::clone(&results), upstream_via_proxy.clone());
        let batch_server = format!("http://127.0.0.1:{}", world.batch_proxy.port);
        let n_agents = agents.len();
        clients.push(tokio::spawn(async move {
            while !ctx.stop_new.load(Ordering::SeqCst) {
                let id = next_op.fetch_add(1, Ordering::SeqCst);
                let op = Op::generate(seed, id, (&upstream, &batch_server), n_agents);
                let r = ctx.run(&op, seed).await;
                results.lock().await.push(r);
            }
        }));
    }

    // The injector.
    let mut injected: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failed_injections = 0u64;
    let mut rng = Rng::new(seed);
    let total_weight: u64 = FAULTS.iter().map(|(_, w)| w).sum();
    let mut made = 0;
    while made < target {
        // lets time pass: the injector's pace (`--interval-ms`) between two faults.
        let_time_pass(interval).await;
        let mut roll = rng.below(total_weight);
        let kind = FAULTS
            .iter()
            .find(|(_, w)| {
                if roll < *w {
                    true
                } else {
                    roll -= w;
                    false
                }
            })
            .map_or("kill9_router", |(k, _)| *k);
        match world.inject(kind, &mut rng, &ctx).await {
            Ok(()) => *injected.entry(kind).or_default() += 1,
            Err(e) => {
                failed_injections += 1;
                eprintln!("chaos: injection {kind} failed: {e:#}");
            }
        }
        made = injected.values().sum();
    }
    ctx.stop_new.store(true, Ordering::SeqCst);
    let fault_seconds = started.elapsed().as_secs_f64();
    println!("chaos: {made} injections made; letting every operation finish");
    // Faults still running (a frozen router, a Postgres restart) end by themselves; then the
    // system is healed and every operation driven to its end.
    let pg_busy = &world.pg_busy;
    wait_until(
        Duration::from_secs(120),
        "the Postgres restart to end",
        || async move { !pg_busy.load(Ordering::SeqCst) },
    )
    .await?;
    world.heal().await;
    for c in clients {
        let _ = c.await;
    }
    world.heal().await;

    // A third party settles what the hostile route kept; then reconcile, as operators'
    // CronJob does, settles the ledger's open questions from the chain.
    let (client, upstream) = (&ctx.client, upstream_direct.as_str());
    let settled_kept =
        wait_for_every(Duration::from_secs(10), Duration::from_millis(500), "kept payments settled", || async move {
            settle_kept(client, upstream).await.ok()
        })
        .await
        .is_ok();
    let rpc_direct = chain.rpc_url();
    let mut reconciled = Value::Null;
    for _ in 0..5 {
        let mut env = vec![
            ("X402_RPC_URLS", format!("eip155:{}={rpc_direct}", procs::CHAIN_ID)),
            ("RECONCILE_OLDER_THAN_SECS", "0".into()),
            ("IDEMPOTENCY_ABANDON_AFTER_MS", abandon.as_millis().to_string()),
        ];
        if args.recovery {
            // The key signs only the receipts of recovered answers.
            env.push(("ROUTER_PRIVATE_KEY", procs::ROUTER_KEY.into()));
            env.push(("UPSTREAM_ALLOW_PRIVATE", "true".into()));
            env.push(("RECONCILE_RECOVERY_SECS", "40".into()));
        }
        match cli_json(&args.router_bin, &direct_db, &["reconcile"], &env).await {
            Ok(v) => {
                reconciled = v;
                break;
            }
            Err(e) => eprintln!("chaos: reconcile: {e:#}"),
        }
    }

    // The invariants.
    let token = chain.token.parse()?;
    let payer = procs::ROUTER_ADDRESS.parse()?;
    let report =
        invariants::check(&invariants::Target { database_url: &direct_db, rpc_url: &rpc_direct, token, payer }).await?;
    let results = std::mem::take(&mut *results.lock().await);
    let mut violations = report.violations.clone();
    // The batch-settlement server claims and settles; its channels are checked.
    let (batch_summary, batch_violations) =
        official.settle_and_check(&ctx.client, (&direct_db, &rpc_direct, &chain.token)).await?;
    violations.extend(batch_violations);
    violations.extend(ctx.gc_violations.lock().await.iter().cloned());
    if !settled_kept {
        violations.push("the upstream's kept authorizations could not be settled".into());
    }
    let stats: Value = ctx.client.get(format!("{upstream_direct}/_stats")).send().await?.json().await?;
    let db = connect(&direct_db).await?;
    let mut takeovers_now: BTreeMap<String, u64> = BTreeMap::new();
    for r in db.query("SELECT key, takeovers FROM idempotency_keys", &[]).await? {
        takeovers_now.insert(r.get(0), u64::try_from(r.get::<_, i32>(1)).unwrap_or(0));
    }
    let gone = ctx.gc_takeovers.lock().await.clone();
    let ops_of = |pred: &dyn Fn(&OpResult) -> bool| results.iter().filter(|r| pred(r)).count();
    for r in &results {
        violations.extend(r.violations.iter().cloned());
        if !r.finished {
            violations.push(format!("op {} never got a final answer", r.id));
        }
        if r.kind.is_some_and(Kind::is_free) {
            let key = format!("chaos-{seed:x}-{}", r.id);
            let hits = stats["free_by_op"][r.id.to_string()].as_u64().unwrap_or(0);
            let last = takeovers_now.get(&key).or(gone.get(&key)).copied().unwrap_or(0);
            let allowed = r.lifetimes + r.gc_takeovers + last;
            if hits > allowed {
                violations.push(format!(
                    "op {}: the free upstream ran {hits} times; allowed {allowed} (lifetimes + takeovers)",
                    r.id
                ));
            }
        }
    }

    let mut finals: BTreeMap<String, u64> = BTreeMap::new();
    for r in &results {
        for (s, c) in r.finals.iter().zip(&r.codes) {
            *finals.entry(format!("{s} {}", c.as_deref().unwrap_or(""))).or_default() += 1;
        }
    }
    let mut startup_exits = 0;
    for r in &world.routers {
        startup_exits += r.lock().await.restarts_at_startup;
    }
    let paid_ops = ops_of(&|r| r.kind.is_some_and(|k| !k.is_free()));
    let by_class = paid_not_served_by_class(&db, &results, &agents, seed).await?;
    // Recovery-capable routes: fewer than 0.5 % of paid calls may end paid, not served
    // (issue 16), checked once the sample says something.
    let pid = &by_class["payment_identifier"];
    if args.recovery && pid["paid_calls"].as_u64().unwrap_or(0) >= MIN_PID_PAID_CALLS {
        let share = pid["share"].as_f64().unwrap_or(1.0);
        if share >= MAX_PID_PAID_NOT_SERVED {
            violations.push(format!(
                "payment-identifier routes: {} of {} paid calls ended settled_response_lost ({:.2} %, limit {:.1} %)",
                pid["settled_response_lost"],
                pid["paid_calls"],
                share * 100.0,
                MAX_PID_PAID_NOT_SERVED * 100.0
            ));
        }
    }
    let used = report.used_nonces.max(1);
    let summary = json!({
        "mode": mode,
        "seed": seed,
        "routers": 3,
        "wall_seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "fault_phase_seconds": (fault_seconds * 10.0).round() / 10.0,
        "injections": made,
        "failed_injections": failed_injections,
        "router_startup_exits": startup_exits,
        "injections_by_kind": injected,
        "operations": results.len(),
        "operations_paid_routes": paid_ops,
        "operations_free": results.len() - paid_ops,
        "key_reuses_after_gc": ops_of(&|r| r.lifetimes > 1),
        "concurrent_duplicates": results.iter().map(|r| r.duplicates).sum::<u64>(),
        "requests": ctx.requests.load(Ordering::Relaxed),
        "finals": finals,
        "reconcile": reconciled,
        "chain_and_ledger": report,
        "paid_not_served_share": report.paid_not_served as f64 / used as f64,
        "recovery": args.recovery,
        "paid_not_served_by_class": by_class,
        "batch_settlement": batch_summary,
        "violations": violations,
    });
    std::fs::write(&args.out, serde_json::to_vec_pretty(&summary)?)?;
    print_table(&summary);

    for r in &world.routers {
        r.lock().await.shutdown().await;
    }
    Ok(violations.len())
}

/// The least number of paid calls on payment-identifier routes for which their paid-not-served
/// share is held to [`MAX_PID_PAID_NOT_SERVED`] (below it, the run only reports the figure).
const MIN_PID_PAID_CALLS: u64 = 20;
/// Issue 16's target for recovery-capable routes.
const MAX_PID_PAID_NOT_SERVED: f64 = 0.005;

/// Per route class (`payment_identifier`, `plain`): paid calls (the first lifetime of an
/// operation whose payment the chain shows used: `settled` or `settled_response_lost` in the
/// ledger after reconcile), how many of them got `settled_response_lost` as their final answer
/// (paid, not served) and its share, how many got `payment_unknown` (paid, outcome unknown to
/// the agent at the time), how many final answers say `recovered`, and how many lost answers
/// `reconcile` recovered afterwards (available at `GET /payments`, not as the key's answer).
async fn paid_not_served_by_class(
    db: &tokio_postgres::Client,
    results: &[OpResult],
    agents: &[(String, String)],
    seed: u64,
) -> anyhow::Result<Value> {
    let mut ledger: BTreeMap<(String, String), (String, bool)> = BTreeMap::new();
    let sql = "SELECT p.agent_id::text, p.idempotency_key, p.status, \
                      EXISTS (SELECT 1 FROM recovered_answers a WHERE a.agent_id = p.agent_id AND a.payment_id = p.id) \
                 FROM payments p";
    for r in db.query(sql, &[]).await? {
        ledger.insert((r.get(0), r.get(1)), (r.get(2), r.get(3)));
    }
    #[derive(Default)]
    struct Class {
        paid: u64,
        lost: u64,
        unknown: u64,
        recovered_in_answer: u64,
        recovered_by_reconcile: u64,
    }
    let mut classes: BTreeMap<&'static str, Class> = BTreeMap::new();
    classes.insert("payment_identifier", Class::default());
    classes.insert("plain", Class::default());
    classes.insert("batch_settlement", Class::default());
    for r in results {
        let Some(kind) = r.kind.filter(|k| !k.is_free()) else { continue };
        let key = (agents[r.agent].0.clone(), format!("chaos-{seed:x}-{}", r.id));
        let Some((status, recovered_later)) = ledger.get(&key) else { continue };
        if !matches!(status.as_str(), "settled" | "settled_response_lost") {
            continue;
        }
        let c = classes.entry(kind.class()).or_default();
        c.paid += 1;
        match r.codes.first().and_then(Option::as_deref) {
            Some("settled_response_lost") => c.lost += 1,
            Some("payment_unknown") => c.unknown += 1,
            _ => {}
        }
        if r.recoveries.first().and_then(Option::as_deref) == Some("recovered") {
            c.recovered_in_answer += 1;
        }
        if *recovered_later {
            c.recovered_by_reconcile += 1;
        }
    }
    let out: serde_json::Map<String, Value> = classes
        .into_iter()
        .map(|(name, c)| {
            let share = if c.paid == 0 { 0.0 } else { c.lost as f64 / c.paid as f64 };
            let v = json!({
                "paid_calls": c.paid,
                "settled_response_lost": c.lost,
                "share": share,
                "payment_unknown": c.unknown,
                "recovered_in_answer": c.recovered_in_answer,
                "recovered_by_reconcile": c.recovered_by_reconcile,
            });
            (name.to_owned(), v)
        })
        .collect();
    Ok(Value::Object(out))
}

fn print_table(s: &Value) {
    println!();
    println!("chaos run ({}), seed {}: {} s", s["mode"], s["seed"], s["wall_seconds"]);
    println!("  injections            {:>6}", s["injections"]);
    if let Some(kinds) = s["injections_by_kind"].as_object() {
        for (k, v) in kinds {
            println!("    {k:<28}{v:>4}");
        }
    }
    println!(
        "  operations            {:>6}  (paid routes {}, free {})",
        s["operations"], s["operations_paid_routes"], s["operations_free"]
    );
    println!("  requests sent         {:>6}  (concurrent duplicates {})", s["requests"], s["concurrent_duplicates"]);
    println!("  key reuses after GC   {:>6}", s["key_reuses_after_gc"]);
    let c = &s["chain_and_ledger"];
    println!("  used nonces (paid)    {:>6}", c["used_nonces"]);
    println!("  moved (atomic units)  {:>6}", c["moved"].as_str().unwrap_or("?"));
    println!("  paid and served       {:>6}", c["served_paid"]);
    println!("  paid, not served      {:>6}  (flagged settled_response_lost)", c["paid_not_served"]);
    println!("  recovery              {:>6}", s["recovery"]);
    if let Some(classes) = s["paid_not_served_by_class"].as_object() {
        for (name, k) in classes {
            println!(
                "    {name:<20} paid {:>4}, settled_response_lost {:>3} ({:.2} %), payment_unknown {}, \
                 recovered in the answer {}, by reconcile {}",
                k["paid_calls"],
                k["settled_response_lost"],
                k["share"].as_f64().unwrap_or(0.0) * 100.0,
                k["payment_unknown"],
                k["recovered_in_answer"],
                k["recovered_by_reconcile"]
            );
        }
    }
    let b = &s["batch_settlement"]["report"];
    println!(
        "  batch-settlement      {:>6}  voucher rows on {} channel(s), {} vouchers seen by the server; reserved {}, \
         charged {}, claimed {}, payee received {}, deposited {}",
        b["voucher_rows"],
        b["lanes"],
        b["vouchers_seen"],
        b["reserved"].as_str().unwrap_or("?"),
        b["charged"].as_str().unwrap_or("?"),
        b["claimed"].as_str().unwrap_or("?"),
        b["payee_received"].as_str().unwrap_or("?"),
        b["deposited"].as_str().unwrap_or("?")
    );
    println!("  violations            {:>6}", s["violations"].as_array().map_or(0, Vec::len));
    if let Some(v) = s["violations"].as_array() {
        for line in v.iter().take(20) {
            println!("    {}", line.as_str().unwrap_or_default());
        }
    }
}
