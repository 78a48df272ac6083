//! The `/route` use case: idempotency around one upstream call (and its payment).
//!
//! ```text
//! handle ─▶ Redis hint ─▶ SSRF pre-flight ─▶ claim (Postgres) ─┬─▶ replay / 409
//!                                                              └─▶ execute (own task, heartbeat, deadline)
//!                                                                    └─▶ record: receipt + final state, one transaction, fenced by lease
//! ```
//! Execution runs in its own task so that an agent hanging up cannot cancel a call
//! half-way (between a payment and its record).

pub mod envelope;
pub mod request;

use std::time::{Duration, Instant};

use diesel_async::AsyncConnection;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::codes::Code;
use crate::error::ApiError;
use crate::idempotency::{Decision, Heartbeat, IdempotencyKey, Ownership, Status, Stored, canonical};
use crate::receipts::{self, Receipt};
use crate::state::AppState;
use crate::upstream::{UpstreamError, UpstreamResponse};
use request::RouteCall;

/// What `/route` answers.
#[derive(Debug)]
pub struct RouteResponse {
    pub http_status: u16,
    pub body: Value,
    pub receipt_id: Option<Uuid>,
    pub replay: bool,
}

/// The result of executing a call, before it is recorded.
#[derive(Debug)]
pub struct Outcome {
    pub status: Status,
    pub http_status: u16,
    pub body: Value,
    pub receipt: Option<receipts::Draft>,
    /// The payment intent's final state, written with the receipt.
    pub payment: Option<crate::payments::Final>,
}

/// Runs `POST /route` for an authenticated agent.
///
/// # Errors
/// [`ApiError`] for 4xx/5xx answers of the router itself (the routed call's own
/// outcomes, 402/502/504 included, are `Ok`).
pub async fn handle(
    state: &AppState,
    agent_id: Uuid,
    key: IdempotencyKey,
    call: RouteCall,
) -> Result<RouteResponse, ApiError> {
    let started = Instant::now();
    let (decision, path) = match state.idempotency.check_cache(agent_id, &key, &call.request_hash).await {
        Some(hit) => hit,
        None => {
            // Refuse forbidden upstreams before anything is written.
            state.upstream.guard().check(&call.upstream.url).await.map_err(|e| ApiError::BadRequest(e.to_string()))?;
            let mut conn = state.pool.get().await.map_err(ApiError::database)?;
            state.idempotency.claim(&mut conn, agent_id, &key, &call.request_hash).await.map_err(ApiError::database)?
        }
    };
    // Every request's outcome is counted in /metrics; the line itself is debug-level, so a
    // replay does not pay for a log write (BENCHMARKS.md). Takeovers and GC races warn.
    tracing::debug!(agent_id = %agent_id, idem.outcome = path.as_str(), "idempotency decision");
    state.metrics.idempotency_outcome(path);
    let result = match decision {
        Decision::Replay(stored) => Ok(replay(stored)),
        Decision::InFlight => Err(ApiError::InFlight),
        Decision::Mismatch => Err(ApiError::KeyReused),
        Decision::Execute(own) => {
            let task = tokio::spawn(run_owned(state.clone(), own, call));
            task.await.map_err(|e| ApiError::Internal(anyhow::anyhow!("route task failed: {e}")))?
        }
    };
    tracing::debug!(duration_ms = started.elapsed().as_millis() as u64, "route handled");
    result
}

fn replay(stored: Stored) -> RouteResponse {
    RouteResponse { http_status: stored.http_status, body: stored.body, receipt_id: stored.receipt_id, replay: true }
}

/// Executes an owned key under heartbeat and deadline, then records the result.
async fn run_owned(state: AppState, own: Ownership, call: RouteCall) -> Result<RouteResponse, ApiError> {
    let _heartbeat = Heartbeat::start(state.pool.clone(), &own, state.idempotency.timing.heartbeat);
    let deadline = Instant::now() + state.idempotency.timing.deadline;
    let outcome = match tokio::time::timeout_at(deadline.into(), execute(&state, &own, &call, deadline)).await {
        Ok(Ok(outcome)) => outcome,
        // Not decidable now (e.g. the chain cannot be read on a takeover): record nothing;
        // the key stays in flight and a later retry takes it over and decides.
        Ok(Err(e)) => return Err(e),
        Err(_) => crate::payments::past_deadline(&state, &own).await?,
    };
    record(&state, &own, outcome).await
}

/// Calls the upstream (paying if it asks and the agent allows) and builds the outcome.
/// A takeover first resumes any payment the previous owner signed.
///
/// # Errors
/// An [`ApiError`] means "answer this and record nothing".
async fn execute(state: &AppState, own: &Ownership, call: &RouteCall, deadline: Instant) -> Result<Outcome, ApiError> {
    if own.took_over {
        let mut conn = state.pool.get().await.map_err(ApiError::database)?;
        let signed = crate::payments::store::find(&mut conn, own.agent_id, own.key.as_str())
            .await
            .map_err(ApiError::database)?;
        drop(conn);
        if let Some(intent) = signed {
            return crate::payments::resume(state, own, call, intent, deadline).await;
        }
    }
    let started = Instant::now();
    let sent = state.upstream.send(&call.upstream, &[], remaining(deadline).min(state.upstream.timeout())).await;
    state.metrics.upstream_seconds.with_label_values(&["unpaid"]).observe(started.elapsed().as_secs_f64());
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => return Ok(upstream_failure(&e)),
    };
    if resp.status == 402 {
        return crate::payments::pay(state, own, call, resp, deadline).await;
    }
    Ok(answered(own, call, &resp, None, None))
}

/// Time left until `deadline` (zero if past).
pub fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// The outcome of an exchange that failed before any answer.
pub fn upstream_failure(e: &UpstreamError) -> Outcome {
    let (http_status, code) = match e {
        UpstreamError::Timeout => (504, Code::UpstreamTimeout),
        _ => (502, Code::UpstreamFailed),
    };
    Outcome {
        status: Status::Errored,
        http_status,
        body: envelope::error_envelope(code, &e.to_string(), None, None, None),
        receipt: None,
        payment: None,
    }
}

/// The outcome of an upstream answer (after payment, if any): 200 envelope for < 500,
/// 502 with the envelope fields for 5xx. A receipt is always written.
pub fn answered(
    own: &Ownership,
    call: &RouteCall,
    resp: &UpstreamResponse,
    payment: Option<Value>,
    payment_final: Option<crate::payments::Final>,
) -> Outcome {
    let receipt_id = Uuid::new_v4();
    let (status, http_status, body) = if resp.status < 500 {
        (Status::Completed, 200, envelope::envelope(resp, payment.as_ref(), receipt_id))
    } else {
        let msg = format!("upstream answered {}", resp.status);
        let body = envelope::error_envelope(Code::UpstreamFailed, &msg, Some(resp), payment.as_ref(), Some(receipt_id));
        (Status::Errored, 502, body)
    };
    let receipt = draft(receipt_id, own, call, Some(resp.status), &resp.body, payment, status);
    Outcome { status, http_status, body, receipt: Some(receipt), payment: payment_final }
}

/// A receipt draft for a call that reached the upstream.
pub fn draft(
    id: Uuid,
    own: &Ownership,
    call: &RouteCall,
    upstream_status: Option<u16>,
    upstream_body: &[u8],
    payment: Option<Value>,
    status: Status,
) -> receipts::Draft {
    receipts::Draft {
        id,
        agent_id: own.agent_id,
        idempotency_key: own.key.as_str().to_owned(),
        request_hash: call.request_hash.clone(),
        method: call.upstream.method.to_string(),
        url: call.upstream.url.to_string(),
        upstream_status: upstream_status.map(i32::from),
        upstream_body_sha256: canonical::sha256_hex(upstream_body),
        payment,
        outcome: status.as_str().to_owned(),
    }
}

/// Why recording failed.
#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error("fenced: the lease is no longer ours")]
    Fenced,
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
}

/// Writes the receipt and the final state in one transaction, fenced by our lease, then
/// warms the cache. A fenced (stale) owner writes nothing.
async fn record(state: &AppState, own: &Ownership, outcome: Outcome) -> Result<RouteResponse, ApiError> {
    let receipt: Option<Receipt> = match outcome.receipt {
        Some(d) => Some(d.sign(&state.receipt_signer).map_err(|e| ApiError::Internal(e.into()))?),
        None => None,
    };
    let receipt_id = receipt.as_ref().map(|r| r.id);
    let stored = Stored { status: outcome.status, http_status: outcome.http_status, body: outcome.body, receipt_id };

    let mut last_err = None;
    for backoff_ms in [0u64, 200, 1000] {
        // No sleep before the first attempt: even a zero sleep waits for the next timer tick.
        if backoff_ms > 0 {
            tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
        }
        let mut conn = match state.pool.get().await {
            Ok(c) => c,
            Err(e) => {
                last_err = Some(e.to_string());
                continue;
            }
        };
        let (receipt, stored_ref, payment) = (receipt.as_ref(), &stored, outcome.payment.as_ref());
        let result = conn
            .transaction::<_, RecordError, _>(async |c| {
                if let Some(r) = receipt {
                    receipts::store::insert(c, r).await?;
                }
                if let Some(p) = payment {
                    crate::payments::store::finalize(
                        c,
                        p.id,
                        p.status.as_str(),
                        p.tx_hash.as_deref(),
                        p.error.as_deref(),
                    )
                    .await?;
                }
                let applied = crate::idempotency::store::finish(
                    c,
                    own.agent_id,
                    own.key.as_str(),
                    own.lease,
                    stored_ref.status,
                    i32::from(stored_ref.http_status),
                    &stored_ref.body,
                    receipt_id,
                )
                .await?;
                if applied { Ok(()) } else { Err(RecordError::Fenced) }
            })
            .await;
        match result {
            Ok(()) => {
                state.idempotency.warm_stored(own.agent_id, &own.key, &own.request_hash, &stored).await;
                return Ok(RouteResponse {
                    http_status: stored.http_status,
                    body: stored.body,
                    receipt_id,
                    replay: false,
                });
            }
            Err(RecordError::Fenced) => {
                tracing::warn!(agent_id = %own.agent_id, "stale owner fenced off: another attempt owns this key; nothing recorded");
                return Err(ApiError::Superseded);
            }
            Err(RecordError::Db(e)) => last_err = Some(e.to_string()),
        }
    }
    tracing::error!(agent_id = %own.agent_id, error = ?last_err, "could not record the result of an executed call");
    Err(ApiError::Unavailable("database unavailable; the call's result could not be recorded"))
}

/// The 402 answer when the upstream asks for a payment the router will not make.
pub fn declined(
    own: &Ownership,
    call: &RouteCall,
    resp: &UpstreamResponse,
    code: Code,
    reason: &str,
    accepts: Value,
) -> Outcome {
    let receipt_id = Uuid::new_v4();
    Outcome {
        status: Status::Completed,
        http_status: 402,
        body: json!({ "error": reason, "code": code, "accepts": accepts, "receipt_id": receipt_id }),
        receipt: Some(draft(receipt_id, own, call, Some(resp.status), &resp.body, None, Status::Completed)),
        payment: None,
    }
}
