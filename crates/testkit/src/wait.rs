//! Waiting for an event with a deadline: poll a condition until it holds or the time is up.
//! The only pauses of the test code are here (a poll interval, or [`let_time_pass`] for a
//! caller that deliberately lets wall time pass and says why).

use std::future::Future;
use std::time::{Duration, Instant};

/// Pause between two polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// A condition did not hold within its time.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {after:?} waiting for {what}")]
pub struct TimedOut {
    pub what: String,
    pub after: Duration,
}

/// Polls `ready` every [`POLL_INTERVAL`] until it returns `true`, for at most `limit`:
/// `wait_until(limit, "what", || async { … }).await`.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut ready: F) -> Result<(), TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(limit, what, move || {
        let fut = ready();
        async move { fut.await.then_some(()) }
    })
    .await
}

/// Polls `probe` every [`POLL_INTERVAL`] until it returns `Some`, for at most `limit`.
pub async fn wait_for<T, F, Fut>(limit: Duration, what: &str, probe: F) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_every(limit, POLL_INTERVAL, what, probe).await
}

/// [`wait_for`] with its own poll interval (for a probe that is expensive, e.g. an RPC).
pub async fn wait_for_every<T, F, Fut>(
    limit: Duration,
    interval: Duration,
    what: &str,
    mut probe: F,
) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let mut deadline = Deadline::after(limit, what).every(interval);
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        deadline.next_poll().await?;
    }
}

/// A poll loop's deadline, for a loop that keeps state between its attempts:
///
/// ```ignore
/// let mut deadline = Deadline::after(Duration::from_secs(10), "the row to appear");
/// loop {
///     if attempt().await { break; }
///     deadline.next_poll().await?;
/// }
/// ```
#[derive(Debug)]
pub struct Deadline {
    start: Instant,
    limit: Duration,
    interval: Duration,
    what: String,
}

impl Deadline {
    pub fn after(limit: Duration, what: &str) -> Self {
        Self { start: Instant::now(), limit, interval: POLL_INTERVAL, what: what.to_owned() }
    }

    /// Polls every `interval` instead of [`POLL_INTERVAL`].
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Time left (zero once past).
    pub fn left(&self) -> Duration {
        self.limit.saturating_sub(self.start.elapsed())
    }

    /// Pauses one poll interval before the next attempt, or fails once the time is up.
    pub async fn next_poll(&mut self) -> Result<(), TimedOut> {
        let left = self.left();
        if left.is_zero() {
            return Err(TimedOut { what: self.what.clone(), after: self.limit });
        }
        tokio::time::sleep(self.interval.min(left)).await;
        Ok(())
    }
}

/// Lets `d` of wall time pass on purpose (a lease or a TTL to run out, a load to run for a
/// while, the pace of an injector). Not for waiting on an event: use [`wait_until`].
pub async fn let_time_pass(d: Duration) {
    tokio::time::sleep(d).await;
}
