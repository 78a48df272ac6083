//! A small in-process cache of authenticated agents: sha256 of the key → agent id, so that
//! a busy agent's requests do not each cost a Postgres round trip (the Redis replay path
//! then touches Postgres not at all; see BENCHMARKS.md).
//!
//! Rules, all of them deliberate:
//! * Only *enabled* agents are cached, each for [`TTL`] after it was read from Postgres. An
//!   agent disabled with `x402-router agents disable` is therefore refused (403) by every
//!   router process at most [`TTL`] later.
//! * Unknown keys (401) and disabled agents (403) are never cached: a new agent works at
//!   once, and a refused key always costs a lookup.
//! * Nothing about idempotency or payments lives here: which agent a key belongs to never
//!   changes, spend limits are read from Postgres when paying, and every idempotency
//!   decision is still Postgres's.
//! * Bounded: at most [`MAX_ENTRIES`] keys; when full, expired entries are dropped, and if
//!   none are, the whole cache (it refills from Postgres).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

/// How long an enabled agent is trusted without asking Postgres again.
pub const TTL: Duration = Duration::from_secs(1);

/// Most keys held at once.
pub const MAX_ENTRIES: usize = 10_000;

/// Key hash → (agent id, when Postgres said it was enabled).
#[derive(Debug)]
pub struct AgentCache {
    ttl: Duration,
    max_entries: usize,
    entries: Mutex<HashMap<String, (Uuid, Instant)>>,
}

impl Default for AgentCache {
    fn default() -> Self {
        Self::new(TTL, MAX_ENTRIES)
    }
}

impl AgentCache {
    pub fn new(ttl: Duration, max_entries: usize) -> Self {
        Self { ttl, max_entries: max_entries.max(1), entries: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, (Uuid, Instant)>> {
        // The map is always consistent (single inserts and removals): a panic elsewhere
        // while holding the lock leaves nothing half-done.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The agent of `key_hash`, if Postgres said it was enabled less than the TTL ago.
    pub fn get(&self, key_hash: &str) -> Option<Uuid> {
        let now = Instant::now();
        let entries = self.lock();
        let (id, at) = entries.get(key_hash)?;
        (now.saturating_duration_since(*at) < self.ttl).then_some(*id)
    }

    /// Records that Postgres just authenticated `key_hash` as the enabled agent `id`.
    pub fn insert_enabled(&self, key_hash: String, id: Uuid) {
        let now = Instant::now();
        let ttl = self.ttl;
        let mut entries = self.lock();
        if entries.len() >= self.max_entries && !entries.contains_key(&key_hash) {
            entries.retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
            if entries.len() >= self.max_entries {
                entries.clear();
            }
        }
        entries.insert(key_hash, (id, now));
    }

    /// Number of keys held (expired ones included until pruned).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_within_the_ttl_miss_after_it() {
        let cache = AgentCache::new(Duration::from_millis(50), 10);
        let id = Uuid::new_v4();
        assert_eq!(cache.get("h"), None);
        cache.insert_enabled("h".into(), id);
        assert_eq!(cache.get("h"), Some(id));
        assert_eq!(cache.get("other"), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(cache.get("h"), None, "expired: Postgres must be asked again");
    }

    #[test]
    fn zero_ttl_never_hits() {
        let cache = AgentCache::new(Duration::ZERO, 10);
        cache.insert_enabled("h".into(), Uuid::new_v4());
        assert_eq!(cache.get("h"), None);
    }

    #[test]
    fn stays_bounded() {
        let cache = AgentCache::new(Duration::from_secs(60), 3);
        for i in 0..10 {
            cache.insert_enabled(format!("h{i}"), Uuid::new_v4());
            assert!(cache.len() <= 3);
        }
        // The newest key is always held.
        assert!(cache.get("h9").is_some());
    }

    #[test]
    fn full_cache_drops_expired_entries_first() {
        let cache = AgentCache::new(Duration::from_millis(30), 2);
        cache.insert_enabled("old".into(), Uuid::new_v4());
        std::thread::sleep(Duration::from_millis(40));
        let fresh = Uuid::new_v4();
        cache.insert_enabled("fresh".into(), fresh);
        let newest = Uuid::new_v4();
        cache.insert_enabled("newest".into(), newest);
        assert_eq!(cache.get("fresh"), Some(fresh));
        assert_eq!(cache.get("newest"), Some(newest));
        assert_eq!(cache.len(), 2);
    }
}
