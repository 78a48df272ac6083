//! The floors of `scripts/bench`: minimal actix-web handlers doing only the physical work a
//! router path cannot avoid, with the same crates and settings as the router (actix-web,
//! redis `ConnectionManager`, diesel-async over bb8, the same worker count and pool size).
//!
//! ```text
//! bench_floor --bind 127.0.0.1:0 --database-url … --redis-url … --agent-id …
//!             [--redis-prefix P] [--workers N] [--pool-size N]
//! ```
//! Prints `{"listening":"127.0.0.1:PORT"}` on stdout once bound. Routes (any method):
//! * `/fast`       the local fast upstream: a static 40-byte JSON answer, no I/O.
//! * `/redis-get`  one Redis `GET` of the key the router caches for the request's
//!   `Idempotency-Key` (`<prefix>idem:{<agent>}:<key>`, the router's own key); 200 with the raw
//!   (sealed) value, 404 if absent.
//! * `/pg-select`  one `SELECT … FROM idempotency_keys` by primary key; 200 with the row.
//! * `/sql-fresh`  the SQL round trips of a fresh unpaid `/route`, nothing else: the claim
//!   `INSERT … ON CONFLICT DO NOTHING`, then one transaction (BEGIN, receipt `INSERT`, fenced
//!   `UPDATE`, COMMIT): five statements, two commits.
//!
//! Every statement is kept prepared on its connection ([`x402_router::db::prepared`]), as
//! the router's hot-path statements are: one round trip each.
//!
//! Not part of the service: a measuring instrument only (loopback, development settings).

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::Context as _;
use diesel::sql_types::{Bytea, Int4, Nullable, Text, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use redis::AsyncCommands;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde_json::json;
use uuid::Uuid;
use x402_router::db::PrepareExt;

struct Args {
    bind: SocketAddr,
    database_url: String,
    redis_url: String,
    redis_prefix: String,
    agent_id: Uuid,
    workers: usize,
    pool_size: u32,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut bind = None;
    let mut database_url = None;
    let mut redis_url = None;
    let mut redis_prefix = String::new();
    let mut agent_id = None;
    let mut workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut pool_size = 16;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--bind" => bind = Some(value.parse()?),
            "--database-url" => database_url = Some(value),
            "--redis-url" => redis_url = Some(value),
            "--redis-prefix" => redis_prefix = value,
            "--agent-id" => agent_id = Some(value.parse()?),
            "--workers" => workers = value.parse()?,
            "--pool-size" => pool_size = value.parse()?,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(Args {
        bind: bind.context("--bind is required")?,
        database_url: database_url.context("--database-url is required")?,
        redis_url: redis_url.context("--redis-url is required")?,
        redis_prefix,
        agent_id: agent_id.context("--agent-id is required")?,
        workers,
        pool_size,
    })
}

struct Floor {
    redis: ConnectionManager,
    pool: Pool<AsyncPgConnection>,
    prefix: String,
    agent_id: Uuid,
}

fn idempotency_key(req: &HttpRequest) -> Option<String> {
    req.headers().get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn unavailable(e: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::ServiceUnavailable().json(json!({ "error": e.to_string() }))
}

async fn fast() -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(r#"{"ok":true,"source":"bench-floor-fast"}"#)
}

async fn redis_get(floor: web::Data<Floor>, req: HttpRequest) -> HttpResponse {
    let Some(key) = idempotency_key(&req) else {
        return HttpResponse::BadRequest().finish();
    };
    // The key the router caches under (src/idempotency/cache.rs `redis_key`: the agent id as a
    // cluster hash tag), so the floor reads the very entries the router reads.
    let rkey = format!("{}idem:{{{}}}:{key}", floor.prefix, floor.agent_id);
    let mut conn = floor.redis.clone();
    match conn.get::<_, Option<Vec<u8>>>(&rkey).await {
        Ok(Some(raw)) => HttpResponse::Ok().content_type("application/json").body(raw),
        Ok(None) => HttpResponse::NotFound().finish(),
        Err(e) => unavailable(e),
    }
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Text)]
    request_hash: String,
    #[diesel(sql_type = Nullable<Int4>)]
    response_status_code: Option<i32>,
    #[diesel(sql_type = Nullable<Bytea>)]
    response_body: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    receipt_id: Option<Uuid>,
}

async fn pg_select(floor: web::Data<Floor>, req: HttpRequest) -> HttpResponse {
    let Some(key) = idempotency_key(&req) else {
        return HttpResponse::BadRequest().finish();
    };
    let mut conn = match floor.pool.get().await {
        Ok(c) => c,
        Err(e) => return unavailable(e),
    };
    let row: Result<Option<Row>, _> = diesel::sql_query(
        "SELECT status, request_hash, response_status_code, response_body, receipt_id \
         FROM idempotency_keys WHERE agent_id = $1 AND key = $2",
    )
    .bind::<SqlUuid, _>(floor.agent_id)
    .bind::<Text, _>(&key)
    .prepared()
    .get_result(&mut conn)
    .await
    .optional();
    match row {
        Ok(Some(r)) => HttpResponse::Ok().json(json!({
            "status": r.status, "request_hash": r.request_hash,
            "response_status_code": r.response_status_code,
            "response_body": r.response_body.as_deref().map(String::from_utf8_lossy),
            "receipt_id": r.receipt_id,
        })),
        Ok(None) => HttpResponse::NotFound().finish(),
        Err(e) => unavailable(e),
    }
}

#[derive(QueryableByName)]
struct LeaseRow {
    #[diesel(sql_type = SqlUuid)]
    #[allow(dead_code)]
    lease: Uuid,
}

/// The statements of a fresh unpaid call, in the router's order, on one pooled connection
/// per phase as the router does: the claim, then the record. (The agent lookup is not part
/// of the floor: the router serves it from its in-process cache.)
async fn sql_fresh_inner(floor: &Floor, key: &str) -> anyhow::Result<bool> {
    let agent_id = floor.agent_id;
    let request_hash = "0".repeat(64);
    let lease = Uuid::new_v4();
    let mut conn = floor.pool.get().await?;
    // 1. The claim.
    let claimed: Option<LeaseRow> = diesel::sql_query(
        "INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease) \
         VALUES ($1, $2, $3, 'in_flight', $4) ON CONFLICT (agent_id, key) DO NOTHING RETURNING lease",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .bind::<Text, _>(&request_hash)
    .bind::<SqlUuid, _>(lease)
    .prepared()
    .get_result(&mut conn)
    .await
    .optional()?;
    if claimed.is_none() {
        return Ok(false);
    }
    drop(conn);
    // 2. The record: receipt + fenced final state, one transaction.
    let receipt_id = Uuid::new_v4();
    let body = json!({"status": 200, "headers": {"content-type": "application/json"},
                      "body": {"ok": true}, "payment": null, "receipt_id": receipt_id});
    let mut conn = floor.pool.get().await?;
    let key = key.to_owned();
    conn.transaction::<_, diesel::result::Error, _>(async |c| {
        diesel::sql_query(
            "INSERT INTO receipts (id, agent_id, idempotency_key, request_hash, method, url, \
                 upstream_status, upstream_body_sha256, payment, outcome, created_at, signer, signature) \
             VALUES ($1, $2, $3, $4, 'GET', 'http://127.0.0.1/fast', 200, $4, NULL, 'completed', now(), \
                 '0x70997970C51812dc3A010C7d01b50e0d17dc79C8', $5)",
        )
        .bind::<SqlUuid, _>(receipt_id)
        .bind::<SqlUuid, _>(agent_id)
        .bind::<Text, _>(&key)
        .bind::<Text, _>(&request_hash)
        .bind::<Text, _>(format!("0x{}", "ab".repeat(65)))
        .prepared()
        .execute(c)
        .await?;
        diesel::sql_query(
            "UPDATE idempotency_keys SET status = 'completed', response_status_code = 200, \
                 response_body = $4, receipt_id = $5, completed_at = now() \
             WHERE agent_id = $1 AND key = $2 AND lease = $3 AND status = 'in_flight'",
        )
        .bind::<SqlUuid, _>(agent_id)
        .bind::<Text, _>(&key)
        .bind::<SqlUuid, _>(lease)
        .bind::<Bytea, _>(body.to_string().into_bytes())
        .bind::<SqlUuid, _>(receipt_id)
        .prepared()
        .execute(c)
        .await?;
        Ok(())
    })
    .await?;
    Ok(true)
}

async fn sql_fresh(floor: web::Data<Floor>, req: HttpRequest) -> HttpResponse {
    let Some(key) = idempotency_key(&req) else {
        return HttpResponse::BadRequest().finish();
    };
    match sql_fresh_inner(&floor, &key).await {
        Ok(true) => HttpResponse::Ok().json(json!({ "ok": true })),
        Ok(false) => HttpResponse::Conflict().finish(),
        Err(e) => unavailable(e),
    }
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let client = redis::Client::open(args.redis_url.as_str())?;
    // The router's Redis settings: 500 ms connect, 50 ms response timeout.
    let cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_millis(50)))
        .set_number_of_retries(1);
    let redis = ConnectionManager::new_with_config(client, cfg).await?;
    // The router's pool settings (src/db/mod.rs), minus any check on checkout: the floor
    // is one round trip per query.
    let mut manager_config = ManagerConfig::<AsyncPgConnection>::default();
    manager_config.recycling_method = RecyclingMethod::Fast;
    let manager =
        AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(&args.database_url, manager_config);
    let pool = Pool::builder()
        .max_size(args.pool_size)
        .min_idle(Some(0))
        .connection_timeout(Duration::from_secs(2))
        .idle_timeout(Some(Duration::from_secs(300)))
        .build_unchecked(manager);
    let floor = web::Data::new(Floor { redis, pool, prefix: args.redis_prefix, agent_id: args.agent_id });
    let server = HttpServer::new(move || {
        App::new()
            .app_data(floor.clone())
            .route("/fast", web::to(fast))
            .route("/redis-get", web::to(redis_get))
            .route("/pg-select", web::to(pg_select))
            .route("/sql-fresh", web::to(sql_fresh))
    })
    .workers(args.workers)
    .bind(args.bind)?;
    let addr = server.addrs().into_iter().next().context("no listening address")?;
    println!("{}", json!({ "listening": addr.to_string() }));
    server.run().await?;
    Ok(())
}
