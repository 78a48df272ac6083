//! Per-route counters behind `GET /_stats`, so tests can assert how often the upstream was
//! called and paid without reading the chain. Process-local; shared by all workers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

#[derive(Clone, Debug, Default, Serialize)]
pub struct RouteStats {
    /// Every request that reached the route, paid or not.
    pub requests: u64,
    /// Requests that carried a decodable payment header.
    pub payment_attempts: u64,
    /// Payments refused (402 with a reason).
    pub refused: u64,
    /// Settlements that landed on chain (a receipt with status 1).
    pub paid: u64,
    /// Authorizations kept by a hostile route (not settled when received).
    pub kept: u64,
    /// Answers `402 settlement_pending` sent (after a broadcast, or made up).
    pub pending: u64,
    /// Answers `412 permit2_allowance_required` sent.
    pub permit2_required: u64,
    /// Settlements that submitted the payer's EIP-2612 permit first (`eip2612GasSponsoring`).
    pub sponsored: u64,
    /// The distinct EIP-2612 permit signatures received (0x-hex), in order of arrival.
    pub permits: Vec<String>,
    /// Amount (atomic units) of the last settlement.
    pub last_paid_amount: Option<String>,
    /// Transaction hash of the last settlement.
    pub last_transaction: Option<String>,
    /// `extensions["payment-identifier"].info.id` of the last payment that carried one.
    pub last_payment_identifier: Option<String>,
    /// Payment-identifier cache (`/v2/pid`): re-sends answered with the stored response,
    /// answered 503 (original still in flight), and answered 409 (same id, other payload).
    pub pid_replays: u64,
    pub pid_in_flight: u64,
    pub pid_conflicts: u64,
    /// Times the paid handler of `/v2/pid` completed (its answer stored in the cache).
    pub pid_completed: u64,
    /// Sign-in-with-x routes: paid handler runs that completed; requests carrying
    /// `SIGN-IN-WITH-X`; sign-ins refused; handler runs granted by a sign-in (re-access).
    pub siwx_handled: u64,
    pub siwx_sign_ins: u64,
    pub siwx_refused: u64,
    pub siwx_reaccess: u64,
    /// `answer_id` of the last answer of a sign-in-with-x route (paid or re-accessed).
    pub last_answer_id: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    routes: Arc<Mutex<BTreeMap<String, RouteStats>>>,
    /// Requests to `/free` per value of its `op` query parameter (the chaos harness counts
    /// how often each of its operations reached the upstream).
    free: Arc<Mutex<BTreeMap<String, u64>>>,
}

#[derive(Serialize)]
pub struct Snapshot {
    pub routes: BTreeMap<String, RouteStats>,
    /// Sum of `paid` over all routes.
    pub settlements: u64,
    /// `/free` requests per `op` query value.
    pub free_by_op: BTreeMap<String, u64>,
}

impl Stats {
    /// Starts every listed route at zero so that `/_stats` shows them before the first call.
    pub fn with_routes<'a>(paths: impl IntoIterator<Item = &'a str>) -> Self {
        let stats = Self::default();
        {
            let mut routes = stats.lock();
            for path in paths {
                routes.insert(path.to_owned(), RouteStats::default());
            }
        }
        stats
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, RouteStats>> {
        // A panic elsewhere while holding the lock leaves only counters behind: keep serving them.
        self.routes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn update(&self, path: &str, change: impl FnOnce(&mut RouteStats)) {
        change(self.lock().entry(path.to_owned()).or_default());
    }

    /// Counts one `/free` request tagged `op`.
    pub fn free_hit(&self, op: &str) {
        let mut free = self.free.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *free.entry(op.to_owned()).or_default() += 1;
    }

    pub fn snapshot(&self) -> Snapshot {
        let routes = self.lock().clone();
        let settlements = routes.values().map(|r| r.paid).sum();
        let free_by_op = self.free.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        Snapshot { routes, settlements, free_by_op }
    }
}
