//! Recording a call's outcome: the receipt, the payment's final state and the idempotency
//! row's transition, in one transaction fenced by the owner's lease; then the Redis hint.

use std::time::Duration;

use diesel_async::AsyncConnection;

use super::outcome::Rendered;
use super::request::RouteCall;
use super::{Error, Outcome, RouteResponse};
use crate::faults::{self, Inject, Point};
use crate::idempotency::{Ownership, Stored};
use crate::receipts::{self, Receipt};
use crate::state::AppState;

/// Why one recording attempt failed.
#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error("fenced: the lease is no longer ours")]
    Fenced,
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
}

/// Writes the receipt and the final state in one transaction, fenced by our lease, then
/// warms the cache. A fenced (stale) owner writes nothing.
///
/// Failures are told apart: a transient one (connection lost, failover, timeout) is retried,
/// and before each retry the row is re-read, since a lost `COMMIT` acknowledgement may hide a
/// commit that did apply; a data error that no retry can fix finishes the key as `errored`
/// with a minimal outcome and a receipt (the payment's final state kept), so the key never
/// stays in flight to be executed again.
///
/// # Errors
/// [`Error::Superseded`] when fenced; [`Error::Unavailable`] when Postgres could not take
/// the record after a few attempts (the key stays in flight).
pub async fn record(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    outcome: Outcome,
) -> Result<RouteResponse, Error> {
    faults::at(state.faults.as_ref(), Point::BeforeRecord).await;
    let rendered = outcome.render(own, call, &state.config.secrets.redaction);
    match write(state, own, &rendered).await? {
        Written::Done => Ok(answer(state, own, rendered.stored).await),
        Written::DataError(e) => {
            tracing::error!(agent_id = %own.agent_id, error = %e,
                "the call's outcome cannot be stored; finishing the key as errored with a minimal outcome");
            let minimal = minimal(&rendered);
            match write(state, own, &minimal).await? {
                Written::Done => Ok(answer(state, own, minimal.stored).await),
                Written::DataError(e) => {
                    Err(Error::Internal(anyhow::Error::new(e).context("recording a minimal outcome")))
                }
            }
        }
    }
}

async fn answer(state: &AppState, own: &Ownership, stored: Stored) -> RouteResponse {
    state
        .idempotency
        .warm_stored(own.agent_id, &own.key, (&own.request_hash, own.raw_digest.as_deref()), &stored, own.expires_unix)
        .await;
    RouteResponse { http_status: stored.http_status, receipt_id: stored.receipt_id, body: stored.body, replay: false }
}

/// How writing a rendered outcome ended.
enum Written {
    Done,
    /// A data error no retry can fix.
    DataError(diesel::result::Error),
}

/// The outcome recorded when the real one cannot be stored: 502 `internal_error`, the
/// payment as the agent would have seen it, a receipt, and the payment's final state.
fn minimal(rendered: &Rendered) -> Rendered {
    let receipt_id = uuid::Uuid::new_v4();
    let payment = rendered.receipt.as_ref().and_then(|r| r.payment.clone());
    let body = super::envelope::Envelope::default()
        .set("error", &"the upstream's answer could not be recorded; the call is finished as errored")
        .set("code", &crate::codes::Code::InternalError)
        .set("payment", &payment)
        .set("receipt_id", &receipt_id)
        .to_bytes();
    let receipt = rendered.receipt.as_ref().map(|r| receipts::Draft {
        id: receipt_id,
        outcome: crate::idempotency::Status::Errored.as_str().to_owned(),
        ..r.clone()
    });
    let fin = rendered.payment.clone().map(|mut p| {
        p.error = Some("the upstream's answer could not be recorded".into());
        p
    });
    Rendered {
        stored: Stored {
            status: crate::idempotency::Status::Errored,
            http_status: 502,
            body,
            receipt_id: receipt.as_ref().map(|_| receipt_id),
        },
        receipt,
        payment: fin,
    }
}

/// Writes `rendered` in one fenced transaction, retrying transient failures.
async fn write(state: &AppState, own: &Ownership, rendered: &Rendered) -> Result<Written, Error> {
    let receipt: Option<Receipt> = match &rendered.receipt {
        Some(d) => Some(d.clone().sign(&state.receipt_signer).map_err(|e| Error::Internal(e.into()))?),
        None => None,
    };
    let stored = &rendered.stored;
    let mut last_err = None;
    for (attempt, backoff_ms) in [0u64, 200, 1000].into_iter().enumerate() {
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
        // An earlier attempt may have committed without our hearing of it.
        if attempt > 0 {
            match crate::idempotency::store::finished_by(
                &mut conn,
                own.agent_id,
                own.key.as_str(),
                own.lease,
                &stored.body,
            )
            .await
            {
                Ok(true) => {
                    tracing::info!(agent_id = %own.agent_id, "the record had been committed; its acknowledgement was lost");
                    return Ok(Written::Done);
                }
                Ok(false) => {}
                Err(e) => {
                    last_err = Some(e.to_string());
                    continue;
                }
            }
        }
        let result = commit(&mut conn, state, own, rendered, receipt.as_ref()).await;
        match result {
            Ok(()) => return Ok(Written::Done),
            Err(RecordError::Fenced) => {
                tracing::warn!(agent_id = %own.agent_id, "stale owner fenced off: another attempt owns this key; nothing recorded");
                return Err(Error::Superseded);
            }
            Err(RecordError::Db(e)) if !crate::db::is_transient(&e) => return Ok(Written::DataError(e)),
            Err(RecordError::Db(e)) => last_err = Some(e.to_string()),
        }
    }
    tracing::error!(agent_id = %own.agent_id, error = ?last_err, "could not record the result of an executed call");
    Err(Error::Unavailable("database unavailable; the call's result could not be recorded"))
}

/// One attempt at the recording transaction: the receipt, the payment's final state and the
/// key's terminal state, fenced by the lease.
async fn commit(
    conn: &mut diesel_async::AsyncPgConnection,
    state: &AppState,
    own: &Ownership,
    rendered: &Rendered,
    receipt: Option<&Receipt>,
) -> Result<(), RecordError> {
    let (stored, payment) = (&rendered.stored, rendered.payment.as_ref());
    let faults = state.faults.as_ref();
    let result = conn
        .transaction::<_, RecordError, _>(async |c| {
            if let Some(r) = receipt {
                receipts::store::insert(c, r).await?;
            }
            if let Some(p) = payment {
                crate::payments::store::finalize(c, own.agent_id, p).await?;
            }
            let applied = crate::idempotency::store::finish(
                c,
                own.agent_id,
                own.key.as_str(),
                own.lease,
                stored.status,
                i32::from(stored.http_status),
                &stored.body[..],
                stored.receipt_id,
            )
            .await?;
            if !applied {
                return Err(RecordError::Fenced);
            }
            faults::at(faults, Point::BeforeCommit).await;
            Ok(())
        })
        .await;
    match result {
        Ok(()) if faults::at(faults, Point::AfterCommit).await == Inject::ConnectionLost => {
            Err(RecordError::Db(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::ClosedConnection,
                Box::new("injected: the COMMIT acknowledgement was lost".to_owned()),
            )))
        }
        other => other,
    }
}
