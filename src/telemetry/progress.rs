//! Progress of long work (`gc`, `reconcile`, `migrate`): a progress bar with its rate and time
//! left when standard error is a terminal (`indicatif`), else one structured log line per step
//! (`tracing`, what a CI or scheduler log shows):
//!
//! `progress task="gc" step=3 done=3000 total=10000 unit="rows" rate_per_s=1500 elapsed_ms=2000 eta_s=4`
//!
//! `total` and `eta_s` (at the pace so far) only when the amount of work is known beforehand;
//! `rate_per_s` is whole items per second (integers only). A progress line carries counts, never a key, a request or
//! an amount.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// The progress of one task: made by [`Progress::start`], advanced by [`Progress::step`].
/// Shared by reference (`&self`): it may be moved to a blocking thread.
#[derive(Debug)]
pub struct Progress {
    task: &'static str,
    unit: &'static str,
    total: Option<u64>,
    started: Instant,
    bar: Option<ProgressBar>,
    /// Steps taken and items done so far.
    counts: Mutex<(u64, u64)>,
}

impl Progress {
    /// Starts the progress of `task`, counting `unit`s out of `total` (`None`: unknown): a bar
    /// when standard error is a terminal, log lines otherwise.
    #[must_use]
    pub fn start(task: &'static str, unit: &'static str, total: Option<u64>) -> Self {
        Self::new(task, unit, total, std::io::stderr().is_terminal())
    }

    /// [`Progress::start`] with the choice made by the caller (`bar`: draw a bar on standard
    /// error; else log lines).
    #[must_use]
    pub fn new(task: &'static str, unit: &'static str, total: Option<u64>, bar: bool) -> Self {
        let bar = bar.then(|| new_bar(task, unit, total));
        Self { task, unit, total, started: Instant::now(), bar, counts: Mutex::new((0, 0)) }
    }

    /// One step done, of `items` more items: the bar moves, or one log line is written.
    pub fn step(&self, items: u64) {
        let (step, done) = {
            let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            counts.0 += 1;
            counts.1 += items;
            *counts
        };
        if let Some(bar) = &self.bar {
            bar.inc(items);
            return;
        }
        let elapsed = self.started.elapsed();
        let rate = rate_per_second(done, elapsed);
        let eta = self.total.and_then(|total| seconds_left(total, done, elapsed));
        tracing::info!(
            task = self.task,
            step,
            done,
            total = self.total,
            unit = self.unit,
            rate_per_s = rate,
            elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            eta_s = eta,
            "progress"
        );
    }

    /// Steps and items done so far.
    #[must_use]
    pub fn counts(&self) -> (u64, u64) {
        *self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// A bar (known total) or a counter with its rate (unknown total).
fn new_bar(task: &str, unit: &str, total: Option<u64>) -> ProgressBar {
    let (bar, template) = match total {
        Some(total) => {
            (ProgressBar::new(total), "{msg} [{bar:30}] {human_pos}/{human_len} {per_sec} {elapsed} left {eta}")
        }
        None => (ProgressBar::new_spinner(), "{msg} {spinner} {human_pos} {per_sec} {elapsed}"),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(format!("{task} ({unit})"));
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Whole items per second (0 before a microsecond has passed).
fn rate_per_second(done: u64, elapsed: Duration) -> u64 {
    let us = elapsed.as_micros();
    if us == 0 {
        return 0;
    }
    u64::try_from(u128::from(done) * 1_000_000 / us).unwrap_or(u64::MAX)
}

/// Seconds left at the pace so far (`elapsed` for `done` items; rounded up); `None` before
/// any item is done.
fn seconds_left(total: u64, done: u64, elapsed: Duration) -> Option<u64> {
    (done > 0).then(|| {
        let left = u128::from(total.saturating_sub(done)) * elapsed.as_millis();
        u64::try_from(left.div_ceil(u128::from(done) * 1000)).unwrap_or(u64::MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_time_left_are_whole_numbers() {
        assert_eq!(rate_per_second(3000, Duration::from_secs(2)), 1500);
        assert_eq!(rate_per_second(5, Duration::ZERO), 0);
        assert_eq!(seconds_left(10_000, 3000, Duration::from_secs(2)), Some(5));
        assert_eq!(seconds_left(10_000, 0, Duration::from_secs(2)), None);
        assert_eq!(seconds_left(10, 12, Duration::from_secs(3)), Some(0));
        assert_eq!(seconds_left(3, 1, Duration::from_secs(90)), Some(180));
    }

    #[test]
    fn steps_count_without_a_terminal() {
        let p = Progress::new("test", "rows", Some(10), false);
        p.step(4);
        p.step(6);
        assert_eq!(p.counts(), (2, 10));
    }
}
