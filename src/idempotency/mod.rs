//! At-most-once execution per `(agent_id, Idempotency-Key)`.
//!
//! The contract is the user's design (shared seed, "Phase 3") with the two fixes of
//! docs/DESIGN.md §5:
//! * Postgres decides ([`store`]): the claim is `INSERT … ON CONFLICT DO NOTHING`,
//!   an abandoned row is taken over by one guarded `UPDATE` (Fix 1) and every write of
//!   the owner is fenced by its lease (Fix 2). Redis ([`cache`]) is only a fast path
//!   for replays of terminal states.
//! * The owner refreshes `created_at` every heartbeat while it runs, so a slow but live
//!   request is never taken over; only a row whose heartbeat stopped for the
//!   abandonment threshold is.
//! * Terminal states (`completed`, `errored`) are immutable and replayed as stored.
//!
//! The request fingerprint ([`canonical::request_hash`]) is shared with receipts.

pub mod cache;
pub mod canonical;
pub mod gc;
pub mod key;
pub mod redis_link;
pub mod store;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use diesel_async::AsyncPgConnection;
use uuid::Uuid;

pub use cache::Cache;
pub use key::IdempotencyKey;
pub use store::{Commit, Gate, Status};

/// Timing of the idempotency protocol (`IDEMPOTENCY_*` and `ROUTE_DEADLINE_MS` settings).
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyTiming {
    /// An in-flight row whose `created_at` (heartbeat) is older than this may be taken over.
    pub abandon_after: Duration,
    /// How often the owner refreshes `created_at`.
    pub heartbeat: Duration,
    /// Deadline of the whole routed call.
    pub deadline: Duration,
}

/// How many times the claim/lookup cycle is retried when the row vanishes between the
/// conflicting INSERT and the SELECT (GC race, seed's Race 5).
const MAX_GC_RACE_RETRIES: usize = 3;

/// A stored (terminal) response, as replayed.
#[derive(Debug, Clone)]
pub struct Stored {
    pub status: Status,
    pub http_status: u16,
    /// The response body (a JSON document) exactly as first sent: replays are these bytes.
    pub body: Vec<u8>,
    pub receipt_id: Option<Uuid>,
}

/// Ownership of an in-flight key: the right (and duty) to execute and finish it.
#[derive(Debug, Clone)]
pub struct Ownership {
    pub agent_id: Uuid,
    pub key: IdempotencyKey,
    pub request_hash: String,
    /// Fencing token: only writes carrying it apply.
    pub lease: Uuid,
    /// True when this request took over an abandoned attempt.
    pub took_over: bool,
    /// False while the claim may not be on disk yet ([`Commit::Deferred`]): the call makes it
    /// durable before it contacts the upstream.
    pub durable: bool,
    /// When the row may be garbage-collected (Unix seconds, database clock): the cached
    /// answer expires with it.
    pub expires_unix: i64,
    /// The sha256 of the agent key that authenticated the request owning the key (empty until
    /// [`Ownership::authenticated_by`]): the ledger reserves nothing once the agent's key is
    /// another one (rotated), and an empty credential matches no key.
    pub credential: String,
    /// The digest of the owning request's bytes ([`canonical::raw_digest`]), when known: kept
    /// with the cached answer so that the same bytes replay without a parse.
    pub raw_digest: Option<String>,
}

impl Ownership {
    /// This ownership, for a request authenticated with the key whose sha256 is `credential`.
    #[must_use]
    pub fn authenticated_by(self, credential: &str) -> Self {
        Self { credential: credential.to_owned(), ..self }
    }

    /// This ownership, for a request whose bytes have the digest `raw_digest`.
    #[must_use]
    pub fn with_raw_digest(self, raw_digest: String) -> Self {
        Self { raw_digest: Some(raw_digest), ..self }
    }
}

/// What Redis says of a key before Postgres is asked.
#[derive(Debug)]
pub enum Hint {
    /// An authentic terminal entry decided the request (a replay, or the key reused).
    Decided(Decision, Path),
    /// Redis answered and has no terminal entry: the key is most likely new (or in flight).
    Absent,
    /// Redis could not be asked, or its entry failed authentication: the key may well exist.
    Unknown,
}

/// What Redis answered for a key, before the request's body is parsed.
#[derive(Debug)]
pub struct Cached(cache::Lookup);

impl Cached {
    /// The stored answer, when Redis holds the key's terminal answer recorded by a request of
    /// these very bytes (`raw_digest`): a replay that needs no parse, no fingerprint and no
    /// validation, since those bytes were parsed, fingerprinted and validated when the answer
    /// was recorded. `None` when that is not established (the caller parses and asks [`Self::hint`]).
    pub fn replay_of_same_bytes(&mut self, raw_digest: &str) -> Option<Stored> {
        let cache::Lookup::Hit(entry) = &mut self.0 else { return None };
        if entry.raw_digest.as_deref() != Some(raw_digest) || entry.status == Status::InFlight {
            return None;
        }
        let (Some(code), Some(body)) = (entry.response_status_code, entry.response.take()) else { return None };
        Some(Stored { status: entry.status, http_status: to_http_status(code), body, receipt_id: entry.receipt_id })
    }

    /// Redis fast path: a decision for an authentic terminal entry (replay or mismatch);
    /// otherwise what Redis's silence says about the key (see [`Hint`]).
    #[must_use]
    pub fn hint(self, request_hash: &str) -> Hint {
        let entry = match self.0 {
            cache::Lookup::Hit(entry) => entry,
            cache::Lookup::Miss => return Hint::Absent,
            cache::Lookup::Unavailable | cache::Lookup::Rejected => return Hint::Unknown,
        };
        if entry.request_hash != request_hash {
            return Hint::Decided(Decision::Mismatch, Path::Mismatch);
        }
        match (entry.status, entry.response_status_code, entry.response) {
            (status, Some(code), Some(body)) if status != Status::InFlight => Hint::Decided(
                Decision::Replay(Stored {
                    status,
                    http_status: to_http_status(code),
                    body,
                    receipt_id: entry.receipt_id,
                }),
                Path::ReplayRedis,
            ),
            // In flight (or incomplete): Postgres decides, the claim statement first.
            _ => Hint::Absent,
        }
    }
}

/// What to do with a request, decided by the ledger.
#[derive(Debug)]
pub enum Decision {
    /// We own the key: execute, then finish with our lease.
    Execute(Ownership),
    /// Terminal state with a matching fingerprint: replay it.
    Replay(Stored),
    /// Another attempt is running (or has not been silent long enough): 409 + Retry-After.
    InFlight,
    /// The key was used with a different request: 409.
    Mismatch,
    /// The call would start (a new key, or a takeover), but the agent has an operator's call
    /// gate that the caller has not checked: nothing was written. Check it
    /// (`payments::limits::admit`), then claim with [`Gate::Checked`].
    Gated,
}

/// How the decision was reached (for logs and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Fresh,
    ReplayRedis,
    ReplayPostgres,
    InFlight,
    Mismatch,
    Takeover,
    /// The row vanished between a lost claim and the lookup (GC race); counted per retry.
    GcRace,
}

impl Path {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::ReplayRedis => "replay-redis",
            Self::ReplayPostgres => "replay-postgres",
            Self::InFlight => "in-flight-409",
            Self::Mismatch => "mismatch-409",
            Self::Takeover => "takeover",
            Self::GcRace => "gc-race",
        }
    }
}

/// A hook run between a claim that conflicted with a row it could not see
/// ([`store::Claim::Unseen`]) and the follow-up lookup. Only tests set it, to reproduce the
/// GC race deterministically; production leaves it `None`.
pub type FaultHook = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The idempotency engine: timing, the Redis hint, and optional fault hooks.
#[derive(Clone)]
pub struct Idempotency {
    pub cache: Cache,
    pub timing: IdempotencyTiming,
    pub after_conflict: Option<FaultHook>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Idempotency {
    /// Asks Redis about the key (one `GET`); [`Cached`] then decides with the request's
    /// digest or its fingerprint.
    pub async fn check_cache(&self, agent_id: Uuid, key: &IdempotencyKey) -> Cached {
        let lookup = self.cache.get(agent_id, key.as_str()).await;
        if matches!(lookup, cache::Lookup::Rejected) {
            self.metrics.cache_rejected.inc();
        }
        Cached(lookup)
    }

    /// The slow path: claim the key in Postgres, or decide from the existing row.
    ///
    /// # Errors
    /// Database errors (the caller answers 503: nothing has been executed).
    pub async fn claim(
        &self,
        conn: &mut AsyncPgConnection,
        agent_id: Uuid,
        key: &IdempotencyKey,
        request_hash: &str,
        (gate, commit, hint): (Gate, Commit, &Hint),
    ) -> diesel::QueryResult<(Decision, Path)> {
        // Redis could not say the key is new: a plain read first, which decides a replay or a
        // reused key at the cost of one primary-key lookup (the claim statement's insert costs
        // Postgres more even when it inserts nothing). A key in flight or not found is claimed
        // as below (the claim reads it again, with the operator's call gate).
        if matches!(hint, Hint::Unknown)
            && let Some(row) = store::find(conn, agent_id, key.as_str()).await?
            && (row.status != Status::InFlight || row.request_hash != request_hash)
        {
            return self.decide(conn, agent_id, key, request_hash, row, false).await;
        }
        for attempt in 0..=MAX_GC_RACE_RETRIES {
            let lease = Uuid::new_v4();
            let (row, gate_pending) = match store::claim(
                conn,
                agent_id,
                key.as_str(),
                request_hash,
                lease,
                gate,
                commit,
            )
            .await?
            {
                store::Claim::Gated => return Ok((Decision::Gated, Path::Fresh)),
                store::Claim::Claimed { expires_unix } => {
                    // The in-flight entry only lets Redis refuse a reused key early; the call
                    // does not wait for it (a Redis round trip off every fresh call's path).
                    let (idem, owned_key, hash) = (self.clone(), key.clone(), request_hash.to_owned());
                    tokio::spawn(async move {
                        idem.warm(agent_id, &owned_key, (&hash, None), Status::InFlight, None, expires_unix).await;
                    });
                    let own = Ownership {
                        agent_id,
                        key: key.clone(),
                        request_hash: request_hash.to_owned(),
                        lease,
                        took_over: false,
                        durable: commit == Commit::Now,
                        expires_unix,
                        credential: String::new(),
                        raw_digest: None,
                    };
                    return Ok((Decision::Execute(own), Path::Fresh));
                }
                store::Claim::Existing { row, gate_pending } => (row, gate_pending),
                store::Claim::Unseen => {
                    // A concurrent claim committed the row after our statement's snapshot:
                    // read it with a new statement. It may also be gone by now (GC race).
                    if let Some(hook) = &self.after_conflict {
                        hook().await;
                    }
                    let Some(row) = store::find(conn, agent_id, key.as_str()).await? else {
                        tracing::warn!(
                            agent_id = %agent_id, idem.attempt = attempt,
                            "idempotency row vanished between the conflicting insert and the lookup (GC race); retrying"
                        );
                        self.metrics.idempotency_outcome(Path::GcRace.as_str());
                        continue;
                    };
                    // Only an attempted insert conflicts: the gate was checked or there is none.
                    (row, false)
                }
            };
            return self.decide(conn, agent_id, key, request_hash, row, gate_pending).await;
        }
        Err(diesel::result::Error::DeserializationError(
            "idempotency row kept vanishing between claim and lookup".into(),
        ))
    }

    /// The decision for a key whose row exists.
    async fn decide(
        &self,
        conn: &mut AsyncPgConnection,
        agent_id: Uuid,
        key: &IdempotencyKey,
        request_hash: &str,
        row: store::Row,
        gate_pending: bool,
    ) -> diesel::QueryResult<(Decision, Path)> {
        if row.request_hash != request_hash {
            return Ok((Decision::Mismatch, Path::Mismatch));
        }
        match row.status {
            Status::InFlight => self.maybe_take_over(conn, agent_id, key, request_hash, &row, gate_pending).await,
            status => {
                let (Some(code), Some(body)) = (row.response_status_code, row.response_body) else {
                    return Err(diesel::result::Error::DeserializationError(
                        "terminal idempotency row without a response".into(),
                    ));
                };
                let stored = Stored { status, http_status: to_http_status(code), body, receipt_id: row.receipt_id };
                self.warm_stored(agent_id, key, (request_hash, None), &stored, row.expires_unix).await;
                Ok((Decision::Replay(stored), Path::ReplayPostgres))
            }
        }
    }

    async fn maybe_take_over(
        &self,
        conn: &mut AsyncPgConnection,
        agent_id: Uuid,
        key: &IdempotencyKey,
        request_hash: &str,
        row: &store::Row,
        gate_pending: bool,
    ) -> diesel::QueryResult<(Decision, Path)> {
        let threshold_ms = i64::try_from(self.timing.abandon_after.as_millis()).unwrap_or(i64::MAX);
        if row.age_ms <= threshold_ms {
            return Ok((Decision::InFlight, Path::InFlight));
        }
        // A takeover starts the call again: the operator's gate first.
        if gate_pending {
            return Ok((Decision::Gated, Path::Takeover));
        }
        let lease = Uuid::new_v4();
        let taken =
            store::take_over(conn, agent_id, key.as_str(), request_hash, lease, self.timing.abandon_after).await?;
        let Some(expires_unix) = taken else {
            // Another retry won the takeover (or the owner finished meanwhile).
            return Ok((Decision::InFlight, Path::InFlight));
        };
        tracing::warn!(
            agent_id = %agent_id, idem.age_ms = row.age_ms,
            "another request with this idempotency key was abandoned and is being retried"
        );
        let own = Ownership {
            agent_id,
            key: key.clone(),
            request_hash: request_hash.to_owned(),
            lease,
            took_over: true,
            durable: true,
            expires_unix,
            credential: String::new(),
            raw_digest: None,
        };
        Ok((Decision::Execute(own), Path::Takeover))
    }

    /// Caches a terminal response after it has been committed to Postgres, until the row's
    /// expiry `expires_unix`.
    pub async fn warm_stored(
        &self,
        agent_id: Uuid,
        key: &IdempotencyKey,
        (request_hash, raw_digest): (&str, Option<&str>),
        stored: &Stored,
        expires_unix: i64,
    ) {
        self.warm(agent_id, key, (request_hash, raw_digest), stored.status, Some(stored), expires_unix).await;
    }

    async fn warm(
        &self,
        agent_id: Uuid,
        key: &IdempotencyKey,
        (request_hash, raw_digest): (&str, Option<&str>),
        status: Status,
        stored: Option<&Stored>,
        expires_unix: i64,
    ) {
        let entry = cache::Entry {
            status,
            request_hash: request_hash.to_owned(),
            response_status_code: stored.map(|s| i32::from(s.http_status)),
            response: stored.map(|s| s.body.clone()),
            receipt_id: stored.and_then(|s| s.receipt_id),
            expires_unix: Some(expires_unix),
            raw_digest: raw_digest.map(str::to_owned),
        };
        self.cache.put(agent_id, key.as_str(), &entry).await;
    }
}

fn to_http_status(code: i32) -> u16 {
    u16::try_from(code).unwrap_or(500)
}

/// Keeps an owned row alive while its request runs; stops when dropped.
pub struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
    lost: tokio::sync::watch::Receiver<bool>,
}

impl Heartbeat {
    /// Refreshes `created_at` of the owned row every `every`, until dropped. When a beat finds
    /// the lease gone (another attempt took the key over), [`Self::lost`] resolves.
    pub fn start(
        pool: crate::db::PgPool,
        own: &Ownership,
        every: Duration,
        faults: Option<crate::faults::Hook>,
    ) -> Self {
        let (agent_id, key, lease) = (own.agent_id, own.key.as_str().to_owned(), own.lease);
        let (tx, lost) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.tick().await; // the first tick is immediate; the claim just set created_at
            loop {
                ticker.tick().await;
                crate::faults::at(faults.as_ref(), crate::faults::Point::Heartbeat).await;
                let beat = async {
                    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                    store::heartbeat(&mut conn, agent_id, &key, lease).await.map_err(|e| e.to_string())
                };
                match beat.await {
                    Ok(true) => tracing::trace!("idempotency heartbeat"),
                    Ok(false) => {
                        tracing::warn!(agent_id = %agent_id, "lost the idempotency lease while running; stopping the call");
                        let _ = tx.send(true);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "idempotency heartbeat failed; will retry")
                    }
                }
            }
        });
        Self { task, lost }
    }

    /// Resolves once a heartbeat found the lease taken by another attempt (never otherwise).
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        if lost.wait_for(|l| *l).await.is_err() {
            // The heartbeat task ended without losing the lease: never resolve.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(status: Status, raw_digest: Option<&str>) -> Cached {
        Cached(cache::Lookup::Hit(cache::Entry {
            status,
            request_hash: "ab".repeat(32),
            response_status_code: Some(200),
            response: Some(b"{}".to_vec()),
            receipt_id: None,
            expires_unix: Some(4_000_000_000),
            raw_digest: raw_digest.map(str::to_owned),
        }))
    }

    #[test]
    fn only_the_same_bytes_of_a_terminal_answer_replay_unparsed() {
        let d = "cd".repeat(32);
        assert!(hit(Status::Completed, Some(&d)).replay_of_same_bytes(&d).is_some());
        assert!(hit(Status::Errored, Some(&d)).replay_of_same_bytes(&d).is_some());
        // Other bytes, an entry without a digest, an answer not recorded yet: parse and decide.
        assert!(hit(Status::Completed, Some(&d)).replay_of_same_bytes(&"ce".repeat(32)).is_none());
        assert!(hit(Status::Completed, None).replay_of_same_bytes(&d).is_none());
        assert!(hit(Status::InFlight, Some(&d)).replay_of_same_bytes(&d).is_none());
        // Declined, the entry still decides by fingerprint.
        let mut other = hit(Status::Completed, Some(&d));
        assert!(other.replay_of_same_bytes(&"ce".repeat(32)).is_none());
        assert!(matches!(other.hint(&"ab".repeat(32)), Hint::Decided(Decision::Replay(_), Path::ReplayRedis)));
        assert!(matches!(
            hit(Status::Completed, Some(&d)).hint(&"ef".repeat(32)),
            Hint::Decided(Decision::Mismatch, _)
        ));
    }
}
