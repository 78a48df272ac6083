//! Redis side of the idempotency ledger: a hint that makes replays fast, never a lock.
//!
//! Key `<prefix>idem:{<agent_id>}:<key>`, TTL 25 h (Postgres rows expire after 24 h, so
//! the cache never outlives... nor undercuts the source of truth in normal operation).
//! Each key is touched with single-key commands only, and the braces are a Redis Cluster
//! hash tag: every key of one agent lives in one slot (see `redis_link` for cluster and
//! TLS set-ups). Every call has a short timeout; any failure is a cache miss and the
//! request continues on Postgres. The connection is made lazily in the background, so
//! a Redis that is down at start-up or later never blocks or fails a request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::redis_link::{RedisConn, RedisTarget};
use super::store::Status;

/// Redis TTL of an entry: 25 hours.
pub const TTL_SECS: u64 = 25 * 3600;

/// What is cached per key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub status: Status,
    pub request_hash: String,
    #[serde(default)]
    pub response_status_code: Option<i32>,
    #[serde(default)]
    pub response_body: Option<Value>,
    #[serde(default)]
    pub receipt_id: Option<Uuid>,
}

/// A cheaply cloned handle on the cache.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

struct Inner {
    target: RedisTarget,
    manager: RwLock<Option<RedisConn>>,
    connecting: AtomicBool,
    timeout: Duration,
    prefix: String,
}

impl Cache {
    /// A cache on `target` (parsed from `REDIS_URL` at start-up). Connecting starts in the
    /// background on first use.
    pub fn new(target: RedisTarget, timeout: Duration, prefix: String) -> Self {
        Self {
            inner: Arc::new(Inner {
                target,
                manager: RwLock::new(None),
                connecting: AtomicBool::new(false),
                timeout,
                prefix,
            }),
        }
    }

    fn redis_key(&self, agent_id: Uuid, key: &str) -> String {
        format!("{}idem:{{{agent_id}}}:{key}", self.inner.prefix)
    }

    /// A connection if one is up; otherwise starts connecting and returns `None`.
    fn connection(&self) -> Option<RedisConn> {
        if let Ok(guard) = self.inner.manager.read()
            && let Some(m) = guard.as_ref()
        {
            return Some(m.clone());
        }
        self.connect_in_background();
        None
    }

    /// Starts one background connection attempt unless one is already running.
    pub fn connect_in_background(&self) {
        if self.inner.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            match tokio::time::timeout(Duration::from_secs(2), inner.target.connect(inner.timeout)).await {
                Ok(Ok(m)) => {
                    if let Ok(mut guard) = inner.manager.write() {
                        *guard = Some(m);
                    }
                    tracing::info!("redis connected");
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "redis unreachable; idempotency continues on Postgres");
                    // Do not hammer a dead Redis: wait before the next attempt may start.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(_) => {
                    tracing::warn!("redis connect timed out; idempotency continues on Postgres")
                }
            }
            inner.connecting.store(false, Ordering::Release);
        });
    }

    /// After a failed or timed-out command: a connection to a Sentinel-resolved master is
    /// dropped, so that the next use looks the master up again (it may have failed over).
    fn after_failure(&self) {
        if self.inner.target.reconnect_after_errors()
            && let Ok(mut guard) = self.inner.manager.write()
        {
            *guard = None;
        }
    }

    /// Looks the key up. Any error or timeout is a miss.
    pub async fn get(&self, agent_id: Uuid, key: &str) -> Option<Entry> {
        let mut conn = self.connection()?;
        let rkey = self.redis_key(agent_id, key);
        let raw: Option<String> = match tokio::time::timeout(self.inner.timeout, conn.get(&rkey)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis get failed");
                self.after_failure();
                return None;
            }
            Err(_) => {
                tracing::debug!("redis get timed out");
                self.after_failure();
                return None;
            }
        };
        let raw = raw?;
        match serde_json::from_str(&raw) {
            Ok(entry) => Some(entry),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring an unreadable redis idempotency entry");
                None
            }
        }
    }

    /// Writes the entry with the 25 h TTL. Failures are logged at debug and ignored.
    pub async fn put(&self, agent_id: Uuid, key: &str, entry: &Entry) {
        let Some(mut conn) = self.connection() else {
            return;
        };
        let Ok(raw) = serde_json::to_string(entry) else {
            return;
        };
        let rkey = self.redis_key(agent_id, key);
        match tokio::time::timeout(self.inner.timeout, conn.set_ex::<_, _, ()>(&rkey, raw, TTL_SECS)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis set failed");
                self.after_failure();
            }
            Err(_) => {
                tracing::debug!("redis set timed out");
                self.after_failure();
            }
        }
    }

    /// Pings Redis (for /readyz). `false` on any error or timeout.
    pub async fn ping(&self) -> bool {
        let Some(mut conn) = self.connection() else {
            return false;
        };
        let ok = matches!(
            tokio::time::timeout(
                self.inner.timeout.max(Duration::from_millis(200)),
                redis::cmd("PING").query_async::<String>(&mut conn)
            )
            .await,
            Ok(Ok(_))
        );
        if !ok {
            self.after_failure();
        }
        ok
    }
}
