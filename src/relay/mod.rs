//! The `/route` use case: idempotency around one upstream call and its payment.
//!
//! ```text
//! handle ─▶ Redis hint ─▶ SSRF pre-flight ─▶ claim (Postgres) ─┬─▶ replay / 409
//!                                                              └─▶ run_owned (own task, heartbeat, deadline)
//!                                                                    ├─▶ execute: upstream call; on 402 ─▶ pay (pay/)
//!                                                                    │   (terms known: pay_ahead, no unpaid probe)
//!                                                                    └─▶ record (record.rs): receipt + payment + final state,
//!                                                                        one transaction, fenced by the lease
//! ```
//! Execution runs in its own task so that an agent hanging up cannot cancel a call
//! half-way (between a payment and its record). Every way a call can end is an
//! [`Outcome`]; errors of the router itself are [`Error`].

pub mod envelope;
pub mod envelope_doc;
pub mod error;
pub mod outcome;
pub mod pay;
pub mod reaccess;
pub mod record;
pub mod request;
pub mod view;

use std::time::{Duration, Instant};

use tracing::Instrument;
use uuid::Uuid;

use crate::codes::Code;
use crate::idempotency::{Commit, Decision, Gate, Heartbeat, Hint, IdempotencyKey, Ownership, Stored};
use crate::payments::limits;
use crate::state::AppState;
use crate::upstream::UpstreamError;
use crate::upstream::known_terms::TermsKey;
pub use error::Error;
pub use outcome::{Failure, Outcome, PaymentNote};
use request::{Incoming, Received, RouteCall};

/// How long after the route deadline a call still waiting for an upstream or the chain is
/// cut off (the paid path records an arrived answer by the deadline itself).
const DEADLINE_GRACE: Duration = Duration::from_secs(3);

/// What `/route` answers.
#[derive(Debug)]
pub struct RouteResponse {
    pub http_status: u16,
    /// The JSON body, as rendered when the call was recorded (replays send the same bytes).
    pub body: Vec<u8>,
    pub receipt_id: Option<Uuid>,
    pub replay: bool,
}

/// Runs `POST /route` for an authenticated agent.
///
/// # Errors
/// [`Error`] for answers of the router itself (the routed call's own outcomes, 402/502/504
/// included, are `Ok`).
pub async fn handle(
    state: &AppState,
    (agent_id, credential): (Uuid, &str),
    key: IdempotencyKey,
    incoming: Incoming<'_>,
) -> Result<RouteResponse, Error> {
    let started = Instant::now();
    // The deadline covers the claim too: a claim that waited (for a connection, a lock) is
    // not followed by a full deadline's worth of execution, so the whole call stays within
    // the deadline, and so within the abandonment window.
    let deadline = started + state.idempotency.timing.deadline;
    let digest = incoming.digest();
    let (request, cached) = match from_cache(state, agent_id, &key, (incoming, &digest)).await? {
        Ok(replayed) => return Ok(replayed),
        Err(undecided) => undecided,
    };
    // Anything else is validated first: an invalid body is a 400 whatever its key's state.
    let call = request.into_call().map_err(|e| Error::BadRequest(e.0))?;
    // The request's payment terms, if an earlier 402 to exactly this request taught them.
    let terms = crate::upstream::known_terms::TermsKey::of(agent_id, &call.upstream);
    let (decision, path) = match cached {
        Hint::Decided(decision, path) => (decision, path),
        hint => {
            // Refuse forbidden upstreams before anything is written.
            state
                .upstream
                .guard()
                .check(&call.upstream.url)
                .await
                .map_err(|e| Error::ForbiddenUpstream(e.to_string()))?;
            // A call that will pay ahead on known terms commits its claim with its payment
            // intent's flush (one WAL flush fewer); every other call's claim is durable at once.
            let commit = if state.terms.knows(&terms) { Commit::Deferred } else { Commit::Now };
            let claim = async {
                let mut conn = error::conn(&state.pool).await?;
                let hash = &call.request_hash;
                // One statement decides a replay, a conflict, or the claim of an agent without
                // call limits; an agent with them (host allowlist, rate, a pause of all calls)
                // is refused or admitted before its key is claimed: nothing written if refused.
                let decided =
                    state.idempotency.claim(&mut conn, agent_id, &key, hash, (Gate::Unchecked, commit, &hint)).await?;
                if !matches!(decided.0, Decision::Gated) {
                    return Ok(decided);
                }
                let url = &call.upstream.url;
                let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
                if let Some(refusal) = limits::admit(&mut conn, agent_id, &host, url.port()).await? {
                    return Err(Error::Refused(refusal));
                }
                let claimed = state
                    .idempotency
                    .claim(&mut conn, agent_id, &key, hash, (Gate::Checked, commit, &Hint::Absent))
                    .await?;
                Ok::<_, Error>(claimed)
            };
            tokio::time::timeout_at(deadline.into(), claim)
                .await
                .map_err(|_| Error::Unavailable("database unavailable: the claim did not complete in time"))??
        }
    };
    count_outcome(state, agent_id, path);
    let result = match decision {
        Decision::Replay(stored) => Ok(replay(stored)),
        Decision::InFlight => Err(Error::InFlight),
        Decision::Mismatch => Err(Error::KeyReused),
        // Only a claim with the gate unchecked answers this; the one above checked it.
        Decision::Gated => Err(Error::invariant("the claim asked for a call gate that was checked")),
        Decision::Execute(own) => {
            // The spawned task keeps the request's span (and its request id) in every log line.
            let own = own.authenticated_by(credential).with_raw_digest(digest);
            let task = tokio::spawn(run_owned(state.clone(), own, (call, terms), deadline).in_current_span());
            task.await.map_err(|e| Error::invariant(format!("route task failed: {e}")))?
        }
    };
    tracing::debug!(duration_ms = started.elapsed().as_millis() as u64, "route handled");
    result
}

/// Redis's answer for the key: a replay (`Ok`), when it holds the answer recorded by these
/// very bytes or by a request with the same fingerprint; otherwise the request parsed and what
/// Redis says of its key (`Err`).
///
/// # Errors
/// [`Error::BadRequest`] for a body that does not parse (whatever its key's state).
async fn from_cache(
    state: &AppState,
    agent_id: Uuid,
    key: &IdempotencyKey,
    (incoming, digest): (Incoming<'_>, &str),
) -> Result<Result<RouteResponse, (Received, Hint)>, Error> {
    let mut cached = state.idempotency.check_cache(agent_id, key).await;
    if let Some(stored) = cached.replay_of_same_bytes(digest) {
        // The very bytes of the request that recorded this answer: nothing to parse or check.
        count_outcome(state, agent_id, crate::idempotency::Path::ReplayRedis);
        return Ok(Ok(replay(stored)));
    }
    let request = incoming.parse().map_err(|e| Error::BadRequest(e.0))?;
    match cached.hint(&request.request_hash) {
        Hint::Decided(Decision::Replay(stored), path) => {
            // The fingerprint of a request that was validated and executed: nothing more to check.
            count_outcome(state, agent_id, path);
            Ok(Ok(replay(stored)))
        }
        hint => Ok(Err((request, hint))),
    }
}

/// Counts a request's idempotency outcome in /metrics; the line itself is debug-level, so a
/// replay does not pay for a log write (BENCHMARKS.md). Takeovers and GC races warn.
fn count_outcome(state: &AppState, agent_id: Uuid, path: crate::idempotency::Path) {
    tracing::debug!(agent_id = %agent_id, idem.outcome = path.as_str(), "idempotency decision");
    state.metrics.idempotency_outcome(path.as_str());
}

fn replay(stored: Stored) -> RouteResponse {
    RouteResponse { http_status: stored.http_status, body: stored.body, receipt_id: stored.receipt_id, replay: true }
}

/// Executes an owned key under heartbeat and deadline, then records the result.
async fn run_owned(
    state: AppState,
    own: Ownership,
    (call, terms): (RouteCall, TermsKey),
    deadline: Instant,
) -> Result<RouteResponse, Error> {
    let heartbeat =
        Heartbeat::start(state.heartbeat_pool.clone(), &own, state.idempotency.timing.heartbeat, state.faults.clone());
    // The paid path keeps to `deadline` itself once an answer has arrived (it records the
    // answer with the settlement still `unknown` rather than drop it); this hard stop, a
    // little later, only cuts what is still waiting for an upstream or the chain.
    let hard_stop = deadline + DEADLINE_GRACE;
    let run = tokio::time::timeout_at(hard_stop.into(), execute(&state, &own, (&call, &terms), deadline));
    let outcome = tokio::select! {
        biased;
        // Another attempt took the key over: stop before any further side effect; the new
        // owner reads the ledger and the chain and decides.
        () = heartbeat.lost() => return Err(Error::Superseded),
        done = run => match done {
            Ok(Ok(outcome)) => outcome,
            // A pause or a rate limit refused the payment before anything was signed: give
            // the key back, so that retrying it later starts afresh.
            // So does a payment held for an operator's approval (`crate::approvals`): the
            // approval row lasts, the retry of the same key reaches it again.
            Ok(Err(e @ (Error::Refused(_) | Error::Held(_) | Error::KeyReused))) => {
                let mut conn = error::conn(&state.pool).await?;
                crate::idempotency::store::release(&mut conn, own.agent_id, own.key.as_str(), own.lease).await?;
                return Err(e);
            }
            // Not decidable now (e.g. the chain cannot be read on a takeover): record nothing;
            // the key stays in flight and a later retry takes it over and decides.
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                let seen = pay::Seen::default();
                pay::PaidCall { state: &state, own: &own, call: &call, terms: &terms, deadline, seen: &seen }
                    .past_deadline()
                    .await?
            }
        },
    };
    record::record(&state, &own, &call, outcome).await
}

/// Calls the upstream (paying if it asks and the agent allows).
/// A takeover first resumes any payment the previous owner signed.
///
/// # Errors
/// An [`Error`] means "answer this and record nothing".
async fn execute(
    state: &AppState,
    own: &Ownership,
    (call, terms): (&RouteCall, &TermsKey),
    deadline: Instant,
) -> Result<Outcome, Error> {
    let seen = pay::Seen::default();
    let pc = pay::PaidCall { state, own, call, terms, deadline, seen: &seen };
    if own.took_over
        && let Some(intent) = pc.earlier_intent().await?
    {
        return pc.resume(intent, pay::Resume::Takeover).await;
    }
    // Known terms: pay with the first request instead of probing unpaid (src/upstream/known_terms.rs).
    if let Some(required) = state.terms.get(terms)
        && let Some(outcome) = pc.pay_ahead(&required).await?
    {
        return Ok(outcome);
    }
    make_durable(state, own).await?;
    crate::faults::at(state.faults.as_ref(), crate::faults::Point::BeforeUpstreamSend).await;
    let started = Instant::now();
    let sent = state.upstream.send(&call.upstream, &[], remaining(deadline).min(state.upstream.timeout())).await;
    state.metrics.upstream_seconds.with_label_values(&["unpaid"]).observe(started.elapsed().as_secs_f64());
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => return Ok(upstream_failure(&e)),
    };
    if resp.status == 402 {
        return pc.pay(resp).await;
    }
    Ok(Outcome::Answered { resp, payment: None })
}

/// Makes a deferred claim ([`Commit::Deferred`]) durable before the call contacts the
/// upstream on a path that writes nothing synchronously first (the unpaid request, a payment
/// ahead that resumes an earlier intent): a fenced heartbeat, committed synchronously, whose
/// WAL flush writes the claim too.
///
/// # Errors
/// [`Error::Superseded`] when the lease was lost; database errors.
pub(crate) async fn make_durable(state: &AppState, own: &Ownership) -> Result<(), Error> {
    if own.durable {
        return Ok(());
    }
    let mut conn = error::conn(&state.pool).await?;
    if crate::idempotency::store::heartbeat(&mut conn, own.agent_id, own.key.as_str(), own.lease).await? {
        Ok(())
    } else {
        Err(Error::Superseded)
    }
}

/// What a pause and a disabled agent stop (docs/DESIGN.md §8, "What an operator's stop
/// stops"), checked here, immediately before anything signed leaves the router: every payment
/// header (new, re-sent by a takeover or a reused key, signed again, repriced, on any network)
/// and every sign-in (SIWX). New signatures are refused earlier too, by the ledger's
/// reservation under the agent's lock. Not stopped: replays, unpaid calls (unless the pause
/// includes them) and recovery's byte-identical re-send of a payment the chain shows already
/// used (it cannot move money again; `crate::recovery` cannot sign).
///
/// # Errors
/// [`Error::Superseded`] when the lease was lost (a takeover owns the key), [`Error::Refused`]
/// when an operator stopped it; database errors.
pub(crate) async fn may_leave(state: &AppState, own: &Ownership) -> Result<(), Error> {
    let mut conn = error::conn(&state.pool).await?;
    match limits::before_leaving(&mut conn, own.agent_id, own.key.as_str(), own.lease).await? {
        limits::Leaving::Clear => Ok(()),
        limits::Leaving::Superseded => {
            tracing::warn!(agent_id = %own.agent_id, "lease lost before a signed request left; nothing sent");
            Err(Error::Superseded)
        }
        limits::Leaving::Stopped(refusal) => {
            tracing::warn!(agent_id = %own.agent_id, "an operator's stop holds a signed request back; nothing sent");
            Err(Error::Refused(refusal))
        }
    }
}

/// Time left until `deadline` (zero if past).
pub fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// The outcome of an exchange that failed before any answer.
/// A call that may have reached the upstream (timed out, broke off, answered too much) gets
/// a receipt; one refused by the guard or whose connection never opened does not.
fn upstream_failure(e: &UpstreamError) -> Outcome {
    let timeout = matches!(e, UpstreamError::Timeout);
    let code = if timeout { Code::UpstreamTimeout } else { Code::UpstreamFailed };
    let failure = Failure::new(code, e.to_string()).timeout(timeout);
    let reached = !matches!(e, UpstreamError::Blocked(_) | UpstreamError::Unreachable(_));
    Outcome::Failed(if reached { failure } else { failure.without_receipt() })
}
