//! Deterministic fault points for tests: named places in paying and recording where a test
//! may pause the owner of a call (to freeze, kill, take over, or let a deadline pass at an
//! exact step) or inject a failure. Production sets no hook; each point then costs one
//! `Option` check.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A named step of a routed call: every await point of paying, resuming and recording
/// where a crash or a freeze leaves a different state behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// The key is owned; the (unpaid) request is about to be sent upstream.
    BeforeUpstreamSend,
    /// The upstream asked for a payment; nothing is selected or signed yet.
    PaymentRequired,
    /// Signed; the intent is about to be committed (nothing stored, nothing sent).
    BeforeIntent,
    /// The intent is committed; the paid request is about to be sent (before the lease is
    /// re-checked).
    BeforePaidSend,
    /// The lease was re-read under a row lock; the paid request leaves now.
    PaymentLeaving,
    /// The paid request was answered (or failed); nothing is checked on-chain yet.
    PaidAnswered,
    /// The paid request was answered; settlement is about to be confirmed on-chain.
    BeforeConfirm,
    /// A takeover found a signed intent; the chain is about to be asked about it.
    ResumeStart,
    /// An expired, unused intent was re-signed; the new signature is about to be committed.
    BeforeResign,
    /// The outcome is decided; the recording transaction is about to start.
    BeforeRecord,
    /// Inside the recording transaction, every row written, before `COMMIT`.
    BeforeCommit,
    /// The recording transaction committed; its acknowledgement is about to be used.
    AfterCommit,
    /// A heartbeat is about to renew the owner's lease (a test freezes a whole owner by
    /// holding this point too).
    Heartbeat,
    /// Not part of a call: `reconcile` has read an intent and the chain's verdict, and is about
    /// to write it (`audit::reconcile`, hook in its `Settings`).
    ReconcileDecided,
}

impl Point {
    /// Every point of a call, in the order a paid call meets them (`Heartbeat` aside).
    pub const ALL: [Point; 13] = [
        Point::BeforeUpstreamSend,
        Point::PaymentRequired,
        Point::BeforeIntent,
        Point::BeforePaidSend,
        Point::PaymentLeaving,
        Point::PaidAnswered,
        Point::BeforeConfirm,
        Point::ResumeStart,
        Point::BeforeResign,
        Point::BeforeRecord,
        Point::BeforeCommit,
        Point::AfterCommit,
        Point::Heartbeat,
    ];
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
