//! The wall clock, in one place: Unix seconds as the chain and x402 count them.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// [`now_unix`] as a signed number, as Postgres' `EXTRACT(EPOCH …)::bigint` gives it.
pub fn now_unix_i64() -> i64 {
    i64::try_from(now_unix()).unwrap_or(i64::MAX)
}
