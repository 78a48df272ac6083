//! Throttling of failed operator authentications per client address (docs/operations.md,
//! "Operator tokens over the API").
//!
//! Rules, all of them deliberate:
//! * The client is the TCP peer's address, never a forwarded header (a client writes those).
//!   IPv6 peers are counted per /64 (one host usually holds a whole /64), IPv4-mapped IPv6
//!   as IPv4.
//! * An address may have at most `max_failures` failures in a window that starts at its first
//!   failure, **counting the authentications from it still running**: a burst of concurrent
//!   guesses cannot overshoot the limit by racing the first failures. Past it, every operator
//!   request from the address is refused (429 `auth_throttled`, `Retry-After`) before its
//!   token is looked up — a correct token too, or the throttle would still answer guesses.
//! * A success does not clear the failures (a valid viewer token interleaved with guesses
//!   must not reset the count) and costs two short critical sections, no I/O.
//! * Bounded: at most `max_addresses` addresses; when full, expired windows are dropped, then
//!   the oldest window. An address with authentications running is never dropped (its count
//!   would go wrong); when every tracked address has one, a new address goes untracked.
//! * In memory, per router process: N routers allow N times the failures.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

pub use crate::config::OperatorAuthLimits;

/// Where failures are counted: an IPv4 address or an IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientKey(IpAddr);

impl ClientKey {
    /// The key of a peer address.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    Self(IpAddr::V6(Ipv6Addr::from(prefix)))
                }
            },
        }
    }
}

#[derive(Debug, Default)]
struct Entry {
    failures: u32,
    /// When the first failure of the current window happened (`None`: no failure yet).
    since: Option<Instant>,
    /// Authentications from this address still running.
    running: u32,
}

impl Entry {
    /// Forgets failures whose window has passed.
    fn expire(&mut self, now: Instant, window: Duration) {
        if self.since.is_some_and(|s| now.saturating_duration_since(s) >= window) {
            self.failures = 0;
            self.since = None;
        }
    }

    fn idle(&self) -> bool {
        self.failures == 0 && self.running == 0
    }
}

/// Why an authentication was not even tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// Seconds until the address may try again (at least 1).
    pub retry_after: u32,
}

/// The failures of every client address (one per router process, in its `AppState`).
#[derive(Debug)]
pub struct AuthThrottle {
    limits: OperatorAuthLimits,
    entries: Mutex<HashMap<ClientKey, Entry>>,
}

impl AuthThrottle {
    pub fn new(limits: OperatorAuthLimits) -> Self {
        Self { limits, entries: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ClientKey, Entry>> {
        // Every update leaves the map consistent: a panic elsewhere leaves nothing half-done.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts an authentication from `peer`, or refuses it. `None` (no peer address, the
    /// throttle off) is never refused and never counted.
    ///
    /// # Errors
    /// [`Throttled`] when the address's failures and running authentications are at the limit.
    pub fn begin(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<Attempt, Throttled> {
        self.begin_at(peer, Instant::now())
    }

    fn begin_at(self: &Arc<Self>, peer: Option<IpAddr>, now: Instant) -> Result<Attempt, Throttled> {
        let untracked = Attempt { throttle: Arc::clone(self), key: None };
        let (Some(ip), max) = (peer, self.limits.max_failures) else { return Ok(untracked) };
        if max == 0 {
            return Ok(untracked);
        }
        let key = ClientKey::of(ip);
        let mut entries = self.lock();
        if !entries.contains_key(&key) && !self.make_room(&mut entries, now) {
            return Ok(untracked);
        }
        let entry = entries.entry(key).or_default();
        entry.expire(now, self.limits.window);
        if entry.failures >= max {
            let until =
                entry.since.map_or(self.limits.window, |s| (s + self.limits.window).saturating_duration_since(now));
            return Err(Throttled { retry_after: whole_seconds(until) });
        }
        if entry.failures.saturating_add(entry.running) >= max {
            // Guesses still running may fail: wait for them.
            return Err(Throttled { retry_after: 1 });
        }
        entry.running += 1;
        Ok(Attempt { throttle: Arc::clone(self), key: Some(key) })
    }

    /// Makes room for one more address: drops expired idle entries, then the oldest window
    /// without running authentications. `false`: every tracked address has one running.
    fn make_room(&self, entries: &mut HashMap<ClientKey, Entry>, now: Instant) -> bool {
        if entries.len() < self.limits.max_addresses {
            return true;
        }
        entries.retain(|_, e| {
            e.expire(now, self.limits.window);
            !e.idle()
        });
        if entries.len() < self.limits.max_addresses {
            return true;
        }
        let oldest = entries.iter().filter(|(_, e)| e.running == 0).min_by_key(|(_, e)| e.since).map(|(k, _)| *k);
        oldest.is_some_and(|k| entries.remove(&k).is_some())
    }

    /// Failures counted for `ip`'s address in its current window (for tests and logs).
    pub fn failures(&self, ip: IpAddr) -> u32 {
        self.failures_at(ip, Instant::now())
    }

    fn failures_at(&self, ip: IpAddr, now: Instant) -> u32 {
        let mut entries = self.lock();
        entries.get_mut(&ClientKey::of(ip)).map_or(0, |e| {
            e.expire(now, self.limits.window);
            e.failures
        })
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }

    /// Ends an attempt; `true` when its failure reached the limit.
    fn finish(&self, key: ClientKey, failed: bool) -> bool {
        let now = Instant::now();
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(&key) else { return false };
        entry.running = entry.running.saturating_sub(1);
        entry.expire(now, self.limits.window);
        if failed {
            entry.failures = entry.failures.saturating_add(1);
            entry.since.get_or_insert(now);
        }
        let reached = failed && entry.failures == self.limits.max_failures;
        if entry.idle() {
            entries.remove(&key);
        }
        reached
    }
}

/// Whole seconds, rounded up, at least 1.
fn whole_seconds(d: Duration) -> u32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
}

/// One authentication in progress. Dropped without [`Attempt::failed`] (a success, or a
/// request cancelled before an answer), it counts nothing.
#[derive(Debug)]
pub struct Attempt {
    throttle: Arc<AuthThrottle>,
    key: Option<ClientKey>,
}

impl Attempt {
    /// Counts the authentication as failed; `true` when this failure reached the limit (the
    /// address is refused from now on until its window ends).
    pub fn failed(mut self) -> bool {
        self.key.take().is_some_and(|key| self.throttle.finish(key, true))
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.throttle.finish(key, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(max_failures: u32, window_ms: u64, max_addresses: usize) -> Arc<AuthThrottle> {
        Arc::new(AuthThrottle::new(OperatorAuthLimits {
            max_failures,
            window: Duration::from_millis(window_ms),
            max_addresses,
        }))
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn failures_past_the_limit_refuse_the_address_until_the_window_ends() {
        let t = throttle(3, 60_000, 10);
        for _ in 0..3 {
            t.begin(ip("10.0.0.1")).unwrap().failed();
        }
        let refused = t.begin(ip("10.0.0.1")).unwrap_err();
        assert!((59..=60).contains(&refused.retry_after), "{refused:?}");
        // Another address, and a success from it, are untouched; a success clears nothing.
        drop(t.begin(ip("10.0.0.2")).unwrap());
        assert_eq!(t.failures("10.0.0.1".parse().unwrap()), 3);
        assert_eq!(t.tracked(), 1, "an address with no failures is not kept");

        // The window runs from the first failure: a failure later in it does not extend it.
        t.begin(ip("10.0.0.3")).unwrap().failed();
        t.begin_at(ip("10.0.0.3"), Instant::now() + Duration::from_secs(30)).unwrap().failed();
        assert_eq!(t.failures_at("10.0.0.3".parse().unwrap(), Instant::now() + Duration::from_secs(59)), 2);
        assert_eq!(t.failures_at("10.0.0.3".parse().unwrap(), Instant::now() + Duration::from_secs(61)), 0);
        let after = Instant::now() + Duration::from_secs(61);
        assert_eq!(t.failures_at("10.0.0.1".parse().unwrap(), after), 0, "a new window");
        assert!(t.begin_at(ip("10.0.0.1"), after).is_ok());
    }

    #[test]
    fn running_authentications_count_so_a_burst_cannot_overshoot() {
        let t = throttle(3, 60_000, 10);
        let burst: Vec<Result<Attempt, Throttled>> = (0..10).map(|_| t.begin(ip("10.0.0.1"))).collect();
        assert_eq!(burst.iter().filter(|a| a.is_ok()).count(), 3);
        for a in burst.into_iter().flatten() {
            a.failed();
        }
        assert!(t.begin(ip("10.0.0.1")).is_err());
        assert_eq!(t.failures("10.0.0.1".parse().unwrap()), 3);
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let t = throttle(2, 60_000, 10);
        t.begin(ip("2001:db8:1:2::1")).unwrap().failed();
        t.begin(ip("2001:db8:1:2:ffff::9")).unwrap().failed();
        assert!(t.begin(ip("2001:db8:1:2::77")).is_err());
        assert!(t.begin(ip("2001:db8:1:3::1")).is_ok());
        t.begin(ip("::ffff:10.0.0.9")).unwrap().failed();
        t.begin(ip("10.0.0.9")).unwrap().failed();
        assert!(t.begin(ip("10.0.0.9")).is_err());
    }

    #[test]
    fn memory_is_bounded_and_running_entries_are_kept() {
        let t = throttle(5, 60_000, 3);
        for i in 0..100 {
            t.begin(ip(&format!("10.0.1.{i}"))).unwrap().failed();
            assert!(t.tracked() <= 3);
        }
        let held: Vec<Attempt> = (0..3).map(|i| t.begin(ip(&format!("10.0.2.{i}"))).unwrap()).collect();
        // Full of running authentications: a new address is let through, untracked.
        t.begin(ip("10.0.3.1")).unwrap().failed();
        assert_eq!(t.failures("10.0.3.1".parse().unwrap()), 0);
        drop(held);
        assert!(t.tracked() <= 3);
    }

    #[test]
    fn off_or_without_a_peer_nothing_is_counted() {
        let off = throttle(0, 60_000, 10);
        for _ in 0..50 {
            off.begin(ip("10.0.0.1")).unwrap().failed();
        }
        assert_eq!(off.tracked(), 0);
        let t = throttle(1, 60_000, 10);
        t.begin(None).unwrap().failed();
        t.begin(None).unwrap().failed();
        assert_eq!(t.tracked(), 0);
    }
}
