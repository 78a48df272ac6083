//! x402 payments (provisional: the foundation answers every 402 with a 402 to the agent;
//! the payment flow lands in the next step).

use std::time::Instant;

use diesel_async::AsyncPgConnection;
use serde_json::Value;

use crate::idempotency::Ownership;
use crate::routing::{Outcome, declined, request::RouteCall};
use crate::state::AppState;
use crate::upstream::UpstreamResponse;

/// Handles an upstream's 402.
pub async fn pay(_state: &AppState, own: &Ownership, call: &RouteCall, resp: UpstreamResponse, _deadline: Instant) -> Outcome {
    let accepts = serde_json::from_slice::<Value>(&resp.body)
        .ok()
        .and_then(|v| v.get("accepts").cloned())
        .unwrap_or(Value::Array(vec![]));
    declined(own, call, &resp, "upstream requires a payment the router will not make", accepts)
}

/// Writes the payment's final state inside the recording transaction.
///
/// # Errors
/// Database errors.
pub async fn finalize_in_tx(_conn: &mut AsyncPgConnection, _own: &Ownership) -> diesel::QueryResult<()> {
    Ok(())
}
