//! Recording a call's outcome: the receipt, the payment's final state and the idempotency
//! row's transition, in one transaction fenced by the owner's lease; then the Redis hint.

use std::time::Duration;

use diesel_async::AsyncConnection;

use super::request::RouteCall;
use super::{Error, Outcome, RouteResponse};
use crate::idempotency::Ownership;
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
/// # Errors
/// [`Error::Superseded`] when fenced; [`Error::Unavailable`] when Postgres could not take
/// the record after a few attempts (the key stays in flight).
pub async fn record(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    outcome: Outcome,
) -> Result<RouteResponse, Error> {
    let rendered = outcome.render(own, call);
    let receipt: Option<Receipt> = match rendered.receipt {
        Some(d) => Some(d.sign(&state.receipt_signer).map_err(|e| Error::Internal(e.into()))?),
        None => None,
    };
    let stored = rendered.stored;
    let payment = rendered.payment;

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
        let (receipt, stored_ref, payment) = (receipt.as_ref(), &stored, payment.as_ref());
        let result = conn
            .transaction::<_, RecordError, _>(async |c| {
                if let Some(r) = receipt {
                    receipts::store::insert(c, r).await?;
                }
                if let Some(p) = payment {
                    crate::payments::store::finalize(c, p.id, p.status, p.tx_hash.as_deref(), p.error.as_deref())
                        .await?;
                }
                let applied = crate::idempotency::store::finish(
                    c,
                    own.agent_id,
                    own.key.as_str(),
                    own.lease,
                    stored_ref.status,
                    i32::from(stored_ref.http_status),
                    &stored_ref.body[..],
                    stored_ref.receipt_id,
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
                    receipt_id: stored.receipt_id,
                    body: stored.body,
                    replay: false,
                });
            }
            Err(RecordError::Fenced) => {
                tracing::warn!(agent_id = %own.agent_id, "stale owner fenced off: another attempt owns this key; nothing recorded");
                return Err(Error::Superseded);
            }
            Err(RecordError::Db(e)) => last_err = Some(e.to_string()),
        }
    }
    tracing::error!(agent_id = %own.agent_id, error = ?last_err, "could not record the result of an executed call");
    Err(Error::Unavailable("database unavailable; the call's result could not be recorded"))
}
