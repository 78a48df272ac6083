//! Deterministic fault points for tests: named places in paying and recording where a test
//! may pause the owner of a call (to freeze, kill, take over, or let a deadline pass at an
//! exact step) or inject a failure. Production sets no hook; each point then costs one
//! `Option` check.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A named step of a routed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// The intent is committed; the paid request is about to be sent (before the lease is
    /// re-checked).
    BeforePaidSend,
    /// The paid request was answered; settlement is about to be confirmed on-chain.
    BeforeConfirm,
    /// Inside the recording transaction, every row written, before `COMMIT`.
    BeforeCommit,
    /// The recording transaction committed; its acknowledgement is about to be used.
    AfterCommit,
}

/// What a hook asks for at a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inject {
    /// Go on.
    Nothing,
    /// Behave as if the step failed with a lost connection (at `AfterCommit`: the commit's
    /// acknowledgement was lost, so whether it applied is unknown).
    ConnectionLost,
}

/// A test's hook, called at every point.
pub type Hook = Arc<dyn Fn(Point) -> Pin<Box<dyn Future<Output = Inject> + Send>> + Send + Sync>;

/// Runs the hook, if any, at `point`.
pub async fn at(hook: Option<&Hook>, point: Point) -> Inject {
    match hook {
        Some(h) => h(point).await,
        None => Inject::Nothing,
    }
}
