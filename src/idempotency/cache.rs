//! Redis side of the idempotency ledger: a hint that makes replays fast, never a lock.
//!
//! Key `<prefix>idem:{<agent_id>}:<key>`; an entry expires exactly when the Postgres row it
//! copies may be garbage-collected (`EXAT` the row's `expires_at`), and is a miss after that
//! even if Redis kept it: the cache never outlives the source of truth.
//! Each key is touched with single-key commands only, and the braces are a Redis Cluster
//! hash tag: every key of one agent lives in one slot (see `redis_link` for cluster and
//! TLS set-ups). Every call has a short timeout; any failure is a cache miss and the
//! request continues on Postgres. The connection is made lazily in the background, so
//! a Redis that is down at start-up or later never blocks or fails a request.
//!
//! Redis may be written by someone else (a shared instance, a leaked password), so every
//! entry is authenticated: the value is `v1.<hex HMAC-SHA256>.<JSON entry>`, the MAC keyed
//! with a secret of the router ([`mac_key`]) over the Redis key, a 0x00 byte and the JSON.
//! An entry whose MAC does not verify (forged, corrupt, copied from another key, or written
//! by an older version) is [`Lookup::Rejected`]: ignored and counted, and Postgres answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use alloy::primitives::hex;
use hmac::{Hmac, Mac};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

use super::redis_link::{RedisConn, RedisTarget};
use super::store::Status;

/// Version tag of the authenticated value format.
const FORMAT: &str = "v1";

type HmacSha256 = Hmac<Sha256>;

/// The key of the entries' MACs: sha256 over a label and the router's wallet key, like the
/// nonce secret (`x402::nonce`) but for another purpose, so neither reveals the other.
/// Every router of a deployment shares the wallet key, and so this key.
pub fn mac_key(wallet_key: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(b"x402-router/redis-entry-mac/v1\0");
    h.update(wallet_key);
    h.finalize().into()
}

/// What is cached per key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub status: Status,
    pub request_hash: String,
    #[serde(default)]
    pub response_status_code: Option<i32>,
    /// The response bytes as stored in Postgres (base64 in the entry's JSON).
    #[serde(default, with = "base64_bytes")]
    pub response: Option<Vec<u8>>,
    #[serde(default)]
    pub receipt_id: Option<Uuid>,
    /// The expiry of the Postgres row this entry copies (Unix seconds): the entry is written
    /// to expire then (`EXAT`) and read as a miss afterwards, so it never outlives its row
    /// and a late write (a router frozen between its commit and its cache write) of a
    /// collected row's answer cannot answer for the key's next life.
    #[serde(default)]
    pub expires_unix: Option<i64>,
    /// The digest of the bytes of the request that recorded this answer
    /// ([`super::canonical::raw_digest`]), when that request's bytes were at hand: a request
    /// with the same digest is that request again and replays without its body being parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_digest: Option<String>,
}

/// `Option<Vec<u8>>` as an optional base64 string.
mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(bytes) => s.serialize_some(&STANDARD.encode(bytes)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?.map(|s| STANDARD.decode(s).map_err(serde::de::Error::custom)).transpose()
    }
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// Redis answered: no entry (or one expired with its row).
    Miss,
    /// Redis could not be asked (no connection, an error, no answer in time).
    Unavailable,
    /// An authentic entry.
    Hit(Entry),
    /// An entry that failed authentication (or did not parse after it): never believed.
    Rejected,
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
    mac_key: [u8; 32],
}

impl Cache {
    /// A cache on `target` (parsed from `REDIS_URL` at start-up) whose entries are
    /// authenticated with `mac_key` (see [`mac_key`]). Connecting starts in the background on
    /// first use.
    pub fn new(target: RedisTarget, timeout: Duration, prefix: String, mac_key: [u8; 32]) -> Self {
        Self {
            inner: Arc::new(Inner {
                target,
                manager: RwLock::new(None),
                connecting: AtomicBool::new(false),
                timeout,
                prefix,
                mac_key,
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

    /// The MAC of an entry's JSON stored under `rkey`.
    fn mac(&self, rkey: &str, json: &[u8]) -> HmacSha256 {
        let Ok(mut mac) = HmacSha256::new_from_slice(&self.inner.mac_key) else {
            unreachable!("HMAC-SHA256 accepts keys of any length")
        };
        mac.update(rkey.as_bytes());
        mac.update(&[0x00]);
        mac.update(json);
        mac
    }

    /// The authenticated Redis value of `entry` under `rkey`. Public for the storage
    /// round-trip fuzz target; the service itself only calls [`Self::put`].
    pub fn seal(&self, rkey: &str, entry: &Entry) -> Option<Vec<u8>> {
        let json = serde_json::to_vec(entry).ok()?;
        let tag = hex::encode(self.mac(rkey, &json).finalize().into_bytes());
        let mut value = Vec::with_capacity(FORMAT.len() + tag.len() + json.len() + 2);
        value.extend_from_slice(FORMAT.as_bytes());
        value.push(b'.');
        value.extend_from_slice(tag.as_bytes());
        value.push(b'.');
        value.extend_from_slice(&json);
        Some(value)
    }

    /// The entry in a Redis value under `rkey`, if the value is authentic. Public for the
    /// storage round-trip fuzz target; the service itself only calls [`Self::get`].
    pub fn open(&self, rkey: &str, value: &[u8]) -> Option<Entry> {
        let rest = value.strip_prefix(FORMAT.as_bytes())?.strip_prefix(b".")?;
        let (tag, json) = (rest.get(..64)?, rest.get(64..)?.strip_prefix(b".")?);
        let tag = hex::decode(tag).ok()?;
        // Constant time: a forger learns nothing from how long the comparison took.
        self.mac(rkey, json).verify_slice(&tag).ok()?;
        serde_json::from_slice(json).ok()
    }

    /// Looks the key up. Any error or timeout is a miss; an entry that fails authentication
    /// is [`Lookup::Rejected`].
    pub async fn get(&self, agent_id: Uuid, key: &str) -> Lookup {
        let Some(mut conn) = self.connection() else {
            return Lookup::Unavailable;
        };
        let rkey = self.redis_key(agent_id, key);
        let raw: Option<Vec<u8>> = match tokio::time::timeout(self.inner.timeout, conn.get(&rkey)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis get failed");
                self.after_failure();
                return Lookup::Unavailable;
            }
            Err(_) => {
                tracing::debug!("redis get timed out");
                self.after_failure();
                return Lookup::Unavailable;
            }
        };
        let Some(raw) = raw else {
            return Lookup::Miss;
        };
        match self.open(&rkey, &raw) {
            // Expired with its row (Redis may not have evicted it yet): Postgres decides.
            Some(entry) if entry.expires_unix.is_none_or(|e| e <= crate::clock::now_unix_i64()) => Lookup::Miss,
            Some(entry) => Lookup::Hit(entry),
            None => {
                tracing::warn!(agent_id = %agent_id, "ignoring a redis idempotency entry that failed authentication");
                Lookup::Rejected
            }
        }
    }

    /// Writes the entry to expire with its row. An entry whose row has already expired is
    /// not written (a late writer never revives a collected answer). Failures are logged at
    /// debug and ignored.
    pub async fn put(&self, agent_id: Uuid, key: &str, entry: &Entry) {
        let Some(expires) = entry.expires_unix.filter(|e| *e > crate::clock::now_unix_i64()) else {
            return;
        };
        let Some(mut conn) = self.connection() else {
            return;
        };
        let rkey = self.redis_key(agent_id, key);
        let Some(value) = self.seal(&rkey, entry) else {
            return;
        };
        match tokio::time::timeout(
            self.inner.timeout,
            redis::cmd("SET").arg(&rkey).arg(value).arg("EXAT").arg(expires).query_async::<()>(&mut conn),
        )
        .await
        {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(key: u8) -> Cache {
        Cache::new(
            RedisTarget::parse("redis://127.0.0.1:1", false, None).unwrap(),
            Duration::from_millis(1),
            "p:".into(),
            [key; 32],
        )
    }

    fn entry() -> Entry {
        Entry {
            status: Status::Completed,
            request_hash: "ab".repeat(32),
            response_status_code: Some(200),
            response: Some(b"{\"body\":\"\\u0000\"}\xff".to_vec()),
            receipt_id: Some(Uuid::nil()),
            expires_unix: Some(4_000_000_000),
            raw_digest: Some("cd".repeat(32)),
        }
    }

    #[test]
    fn sealed_entries_open_only_under_their_key_and_secret() {
        let c = cache(1);
        let value = c.seal("p:idem:a:k", &entry()).unwrap();
        let opened = c.open("p:idem:a:k", &value).unwrap();
        assert_eq!(opened.response, entry().response);
        assert_eq!(opened.request_hash, entry().request_hash);
        assert!(c.open("p:idem:a:other", &value).is_none(), "bound to its Redis key");
        assert!(cache(2).open("p:idem:a:k", &value).is_none(), "bound to the secret");
        let mut flipped = value.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 1;
        assert!(c.open("p:idem:a:k", &flipped).is_none(), "any changed byte");
        let unsigned = serde_json::to_vec(&entry()).unwrap();
        assert!(c.open("p:idem:a:k", &unsigned).is_none(), "entries without a MAC");
        assert!(c.open("p:idem:a:k", b"v1.").is_none());
    }
}
