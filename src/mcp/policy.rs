//! The retry rules of an agent, written once here for the MCP server and mirrored by the
//! client libraries in `clients/` (their tests hold them to the same table):
//!
//! | answer | next |
//! |---|---|
//! | 200 (whatever the upstream said) | done |
//! | 202 `approval_pending` (the payment waits for an operator) | retry the **same** key after `Retry-After` |
//! | 403 `approval_denied` / `approval_expired` | done; nothing was paid, a new key asks again |
//! | 402 `payment_over_max_amount` / `payment_over_budget` / `payment_unsupported` | done; nothing was paid, a new key is safe |
//! | 409 `idempotency_key_in_flight`, 409 `superseded`, 503, 500, connection lost | retry the **same** key after `Retry-After` |
//! | 502/504 with `payment` null, or `payment.status` `expired` | done; a new key is safe |
//! | 502/504 with any other `payment.status` (`rejected`, `not_settled`, `settled_response_lost`, `unknown`, …) | done; a new key is **not** safe until `GET /payments` says `new_key_safe` |
//! | 409 `already_paid` (the same request re-sent under an expired key; paid before) | done; a new key pays again |
//! | 400, 401, 403, 404, 409 `idempotency_key_reused` (or an operator's `last_admin`), 413 | fix the request |
//!
//! Replays (same key) of a recorded outcome return the same answer and never execute again,
//! so retrying the same key is always safe; only a *new* key can pay twice.

use serde::Serialize;
use serde_json::Value;

/// What to do after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Next {
    /// Final and successful (the upstream answered, status < 500).
    Done,
    /// Not decided yet: retry with the same key.
    RetrySameKey,
    /// Final; nothing was paid (or what was signed can no longer move money): a new key
    /// (a new call) is safe.
    NewKeySafe,
    /// Final; money moved or may still move: never re-key this call.
    DoNotRekey,
    /// The request is wrong; the same request will fail the same way.
    FixRequest,
}

/// Payment states that can no longer move money.
pub const RELEASED_PAYMENT_STATES: &[&str] = &["expired"];

/// Classifies an answer of `POST /route` (status and JSON body).
pub fn classify(status: u16, body: &Value) -> Next {
    let code = body.get("code").and_then(Value::as_str).unwrap_or("");
    match status {
        202 if code == "approval_pending" => Next::RetrySameKey,
        200..=299 => Next::Done,
        403 if code == "approval_denied" || code == "approval_expired" => Next::NewKeySafe,
        402 => Next::NewKeySafe,
        // `last_admin` (an operator's revocation, never /route): the same request fails again.
        409 if code == "idempotency_key_reused" || code == "last_admin" => Next::FixRequest,
        409 if code == "already_paid" => Next::DoNotRekey,
        // 429 `rate_limited` and 503 `payments_paused` recorded nothing: the same key, later.
        409 | 429 | 500 | 503 => Next::RetrySameKey,
        502 | 504 => match body.get("payment").filter(|p| !p.is_null()) {
            None => Next::NewKeySafe,
            Some(p) => {
                let state = p.get("status").and_then(Value::as_str).unwrap_or("");
                if RELEASED_PAYMENT_STATES.contains(&state) { Next::NewKeySafe } else { Next::DoNotRekey }
            }
        },
        400..=499 => Next::FixRequest,
        // Unknown 5xx: the router may have done anything; only the same key is safe.
        _ => Next::RetrySameKey,
    }
}

/// One sentence for a model, per outcome.
pub fn advice(next: Next) -> &'static str {
    match next {
        Next::Done => "Done: the upstream answered; see `response`.",
        Next::RetrySameKey => {
            "Not finished yet. Call fetch again with exactly the same arguments and the same \
             idempotency_key (shown here); never a new one."
        }
        Next::NewKeySafe => {
            "Final for this key, and nothing was paid. A new call (new idempotency_key, e.g. with \
             a higher max_amount) is safe if you still want the resource."
        }
        Next::DoNotRekey => {
            "Final, and money moved or may still move. Do NOT call again for this resource with a \
             new idempotency_key: that could pay twice. Call get_receipt with receipt_id, or report \
             the receipt to a human."
        }
        Next::FixRequest => "The request was refused; change the request (see `response.error`).",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_retry_table() {
        let cases = [
            (200, json!({"status": 500, "payment": null}), Next::Done),
            (402, json!({"code": "payment_over_max_amount"}), Next::NewKeySafe),
            (202, json!({"code": "approval_pending", "approval": {"id": "x"}}), Next::RetrySameKey),
            (403, json!({"code": "approval_denied"}), Next::NewKeySafe),
            (403, json!({"code": "approval_expired"}), Next::NewKeySafe),
            (403, json!({"code": "agent_disabled"}), Next::FixRequest),
            (409, json!({"code": "idempotency_key_in_flight"}), Next::RetrySameKey),
            (409, json!({"code": "superseded"}), Next::RetrySameKey),
            (409, json!({"code": "idempotency_key_reused"}), Next::FixRequest),
            (409, json!({"code": "last_admin"}), Next::FixRequest),
            (429, json!({"code": "auth_throttled"}), Next::RetrySameKey),
            (409, json!({"code": "already_paid"}), Next::DoNotRekey),
            (503, json!({"code": "database_unavailable"}), Next::RetrySameKey),
            (503, json!({"code": "payments_paused"}), Next::RetrySameKey),
            (429, json!({"code": "rate_limited"}), Next::RetrySameKey),
            (403, json!({"code": "upstream_not_allowed"}), Next::FixRequest),
            (402, json!({"code": "payment_not_allowed"}), Next::NewKeySafe),
            (500, json!({"code": "internal_error"}), Next::RetrySameKey),
            (502, json!({"code": "upstream_failed", "payment": null}), Next::NewKeySafe),
            // An upstream's "rejected" or "not settled" is its word only: the authorization may
            // still be submitted until reconcile sees it expire unused.
            (502, json!({"code": "payment_rejected", "payment": {"status": "rejected"}}), Next::DoNotRekey),
            (502, json!({"code": "upstream_failed", "payment": {"status": "not_settled"}}), Next::DoNotRekey),
            (502, json!({"code": "upstream_failed", "payment": {"status": "expired"}}), Next::NewKeySafe),
            (
                502,
                json!({"code": "settled_response_lost", "payment": {"status": "settled_response_lost"}}),
                Next::DoNotRekey,
            ),
            (504, json!({"code": "payment_unknown", "payment": {"status": "unknown"}}), Next::DoNotRekey),
            // settlement_pending not decided by the deadline: the broadcast may still land.
            (502, json!({"code": "payment_unknown", "payment": {"status": "unknown"}}), Next::DoNotRekey),
            // A 412 permit2_allowance_required: the upstream holds a signed authorization; an
            // operator approves Permit2, and the call waits for reconcile, not a new key.
            (502, json!({"code": "permit2_allowance_required", "payment": {"status": "rejected"}}), Next::DoNotRekey),
            (504, json!({"code": "upstream_timeout"}), Next::NewKeySafe),
            (400, json!({"code": "bad_request"}), Next::FixRequest),
            (401, json!({"code": "unauthorized"}), Next::FixRequest),
        ];
        for (status, body, next) in cases {
            assert_eq!(classify(status, &body), next, "{status} {body}");
        }
    }
}
