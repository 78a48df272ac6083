//! Freezing a router at a fault point (the whole owner: its call and its heartbeats), as a
//! SIGSTOP would, until thawed; an owner never thawed has crashed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Notify, watch};
use x402_router::faults::{Hook, Inject, Point};

/// Once `target` is reached, every point blocks (the owner's call and its heartbeats) until
/// thawed; an owner never thawed has crashed.
pub struct Freezer {
    pub reached: Arc<Notify>,
    pub thaw: watch::Sender<bool>,
}

pub fn freeze_at(target: Point) -> (Hook, Freezer) {
    let reached = Arc::new(Notify::new());
    let (thaw, thawed) = watch::channel(false);
    let frozen = Arc::new(AtomicBool::new(false));
    let r = Arc::clone(&reached);
    let hook: Hook = Arc::new(move |p| {
        let (reached, mut thawed, frozen) = (Arc::clone(&r), thawed.clone(), Arc::clone(&frozen));
        Box::pin(async move {
            if p == target && !frozen.swap(true, Ordering::SeqCst) {
                reached.notify_one();
            }
            if frozen.load(Ordering::SeqCst) {
                let _ = thawed.wait_for(|t| *t).await;
            }
            Inject::Nothing
        })
    });
    (hook, Freezer { reached, thaw })
}

/// Like [`freeze_at`], but only the call that reaches `target` after `armed` is set is held,
/// and only at `target` (earlier calls of the same router pass): the test looks at the ledger
/// while the call waits there, then thaws it.
pub fn hold_at(target: Point) -> (Hook, Freezer, Arc<AtomicBool>) {
    let reached = Arc::new(Notify::new());
    let (thaw, thawed) = watch::channel(false);
    let armed = Arc::new(AtomicBool::new(false));
    let (r, a) = (Arc::clone(&reached), Arc::clone(&armed));
    let hook: Hook = Arc::new(move |p| {
        let (reached, mut thawed, armed) = (Arc::clone(&r), thawed.clone(), Arc::clone(&a));
        Box::pin(async move {
            if p == target && armed.swap(false, Ordering::SeqCst) {
                reached.notify_one();
                let _ = thawed.wait_for(|t| *t).await;
            }
            Inject::Nothing
        })
    });
    (hook, Freezer { reached, thaw }, armed)
}
